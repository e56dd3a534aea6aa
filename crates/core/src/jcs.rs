//! The JSON Canonicalization Scheme (RFC 8785): one text for every way of writing the same JSON
//! value, so that a hash of it names the value. Object members are sorted by their names' UTF-16
//! code units, no whitespace is written, strings are escaped only where JSON requires it, and
//! numbers are written as ECMAScript writes them (`1e+21`, `1e-7`, `100`, `0.5`).

use serde_json::Value;

/// The canonical text of `value`.
pub fn canonical(value: &Value) -> String {
    let mut out = String::new();
    write_value(value, &mut out);
    out
}

fn write_value(value: &Value, out: &mut String) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => write_number(n, out),
        Value::String(s) => write_string(s, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_value(item, out);
            }
            out.push(']');
        }
        Value::Object(members) => {
            let mut sorted: Vec<(&String, &Value)> = members.iter().collect();
            sorted.sort_by(|(a, _), (b, _)| a.encode_utf16().cmp(b.encode_utf16()));
            out.push('{');
            for (i, (name, member)) in sorted.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(name, out);
                out.push(':');
                write_value(member, out);
            }
            out.push('}');
        }
    }
}

fn write_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

fn write_number(n: &serde_json::Number, out: &mut String) {
    if let Some(i) = n.as_i64() {
        // Integers beyond 2^53 are written as the double they round to, as ECMAScript would.
        if i.unsigned_abs() <= 1 << 53 {
            out.push_str(&i.to_string());
            return;
        }
    } else if let Some(u) = n.as_u64()
        && u <= 1 << 53
    {
        out.push_str(&u.to_string());
        return;
    }
    out.push_str(&es_number(n.as_f64().unwrap_or(0.0)));
}

/// ECMAScript's Number::toString of a finite double: the shortest digits that round-trip, in
/// plain notation for exponents from -6 to 20 and in exponent notation beyond.
fn es_number(f: f64) -> String {
    if f == 0.0 {
        return "0".into();
    }
    if !f.is_finite() {
        // JSON has no such numbers; serde_json never holds one.
        return "null".into();
    }
    let sign = if f < 0.0 { "-" } else { "" };
    // The shortest round-trip digits and exponent, from the `{:e}` form (`1.2345e-7`).
    let sci = format!("{:e}", f.abs());
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let exp: i32 = exp.parse().unwrap_or(0);
    let k = digits.len() as i32;
    // The decimal point sits after `n` digits: value = 0.digits × 10^n.
    let n = exp + 1;
    let body = if k <= n && n <= 21 {
        format!("{digits}{}", "0".repeat((n - k) as usize))
    } else if 0 < n && n <= 21 {
        format!("{}.{}", &digits[..n as usize], &digits[n as usize..])
    } else if -6 < n && n <= 0 {
        format!("0.{}{digits}", "0".repeat((-n) as usize))
    } else {
        let e = n - 1;
        let e = if e < 0 { format!("-{}", -e) } else { format!("+{e}") };
        match k {
            1 => format!("{digits}e{e}"),
            _ => format!("{}.{}e{e}", &digits[..1], &digits[1..]),
        }
    };
    format!("{sign}{body}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn members_are_sorted_by_utf16_and_nothing_else_is_written() {
        // RFC 8785 §3.2.3: the sort uses UTF-16 code units, so U+1F600 (surrogates D83D..) sorts
        // before U+FB33 though its code point is higher.
        let value: Value = serde_json::from_str(
            r#"{"\ufb33": 1, "\ud83d\ude00": 2, "b": [1, {"z": null, "a": true}], "a": "x"}"#,
        )
        .unwrap();
        assert_eq!(
            canonical(&value),
            "{\"a\":\"x\",\"b\":[1,{\"a\":true,\"z\":null}],\"\u{1F600}\":2,\"\u{FB33}\":1}"
        );
    }

    #[test]
    fn numbers_are_written_as_ecmascript_writes_them() {
        // From RFC 8785 appendix B and ECMAScript's Number::toString.
        for (input, expected) in [
            ("0", "0"),
            ("-0.0", "0"),
            ("100.0", "100"),
            ("1e21", "1e+21"),
            ("1e20", "100000000000000000000"),
            ("0.000001", "0.000001"),
            ("1e-7", "1e-7"),
            ("-1.5e-7", "-1.5e-7"),
            ("123456789012345680000", "123456789012345680000"),
            ("9007199254740993", "9007199254740992"),
            ("4.50", "4.5"),
            ("0.1", "0.1"),
            ("1.7976931348623157e308", "1.7976931348623157e+308"),
            ("5e-324", "5e-324"),
            ("333333333.3333333", "333333333.3333333"),
        ] {
            let value: Value = serde_json::from_str(input).unwrap();
            assert_eq!(canonical(&value), expected, "{input}");
        }
    }

    #[test]
    fn strings_escape_only_what_json_requires() {
        let value = json!("a\"b\\c\n\u{1}é€/");
        assert_eq!(canonical(&value), "\"a\\\"b\\\\c\\n\\u0001é€/\"");
    }

    #[test]
    fn the_same_value_written_two_ways_has_one_text() {
        let a: Value = serde_json::from_str(r#"{"x": 1.0, "y": [ "s" ], "z": {"q": 2, "p": 1}}"#).unwrap();
        let b: Value = serde_json::from_str(r#"{"z":{"p":1,"q":2.0},"y":["s"],"x":1}"#).unwrap();
        assert_eq!(canonical(&a), canonical(&b));
    }
}
