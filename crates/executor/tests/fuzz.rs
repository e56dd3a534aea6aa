//! Bounded property-based fuzzing of the tools that read untrusted text, called the way the
//! agent calls them (through a `ToolRegistry`, arguments checked against the tool's schema):
//!
//! * `math.evaluate`: expressions from a grammar of numbers, identifiers, operators, functions
//!   and parentheses, arbitrary text, and long operator chains and deep nesting around the input
//!   bounds, never panic and answer with a value or a typed error;
//! * `text.template`: templates from a grammar of tags, expressions and filters, arbitrary text,
//!   and long or deeply nested templates, likewise;
//! * `fs.read`, `fs.write` and `fs.list`: whatever the path text (`..`, absolute paths, `%2e`,
//!   NUL, backslashes, unicode, symlinks out of the workspace, dangling ones), nothing outside the
//!   workspace is ever read, listed, created or changed.
//!
//! Each property runs `HERMES_FUZZ_CASES` cases (default 256, what `make test` runs; `make fuzz`
//! runs 20000). Failures are not persisted to a file: proptest prints the shrunk input, and a
//! crash it finds must be added as a plain regression `#[test]` next to the tool it broke.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use hermes_core::ErrorCode;
use hermes_executor::{ToolContext, ToolError, ToolRegistry};
use hermes_test_util::fuzz::{any_text, config, select_owned, token_text};
use proptest::prelude::*;
use serde_json::{Value, json};

fn registry() -> ToolRegistry {
    let mut registry = ToolRegistry::default();
    for tool in hermes_executor::tools::builtin_tools() {
        registry.register(tool).expect("a built-in tool registers");
    }
    registry
}

/// One runtime for all the cases of a property; each call is `block_on`.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a tokio runtime")
}

/// A tool answers with a value or a typed error. A panic fails the property: one that escapes
/// the call (a tool evaluated on the calling task) by itself, one on a work thread (which the
/// executor turns into `INTERNAL`, "the tool's work thread panicked") by its code.
fn check_typed(tool: &str, result: &Result<Value, ToolError>) -> Result<(), TestCaseError> {
    if let Err(e) = result {
        prop_assert_eq!(ErrorCode::parse(e.code.as_str()), Some(e.code), "{}: {}", tool, e);
        prop_assert!(e.code != ErrorCode::Internal, "{} panicked or failed internally: {}", tool, e);
    }
    Ok(())
}

// ---- math.evaluate -----------------------------------------------------------------------------

const NUMBERS: &[&str] = &[
    "0",
    "1",
    "2",
    "0.5",
    ".5",
    "5.",
    "1e3",
    "1e308",
    "1e-308",
    "1e",
    "9223372036854775807",
    "9223372036854775808",
    "18446744073709551616",
    "0x1F",
    "0b101",
    "1_000",
    "007",
];
const IDENTIFIERS: &[&str] = &[
    "a", "b", "x", "y_1", "missing", "true", "false", "NaN", "inf", "\"s\"", "\"é\"", "\"\"", "()",
    "math::pi",
];
const BINARY: &[&str] = &[
    "+", "-", "*", "/", "%", "^", "==", "!=", "<", "<=", ">", ">=", "&&", "||", ",", ";", "=", "+=", "-=",
    "*=", "/=", "%=", "^=", "&&=", "||=",
];
const UNARY: &[&str] = &["-", "!", "- -", "--"];
const FUNCTIONS: &[&str] = &[
    "math::abs",
    "math::sqrt",
    "math::ln",
    "math::log",
    "math::pow",
    "math::exp",
    "math::hypot",
    "math::atan2",
    "round",
    "floor",
    "ceil",
    "min",
    "max",
    "if",
    "len",
    "typeof",
    "contains",
    "str::from",
    "str::to_uppercase",
    "str::substring",
    "str::trim",
    "bitand",
    "bitor",
    "bitxor",
    "bitnot",
    "shl",
    "shr",
    "nope",
];
const MATH_TOKENS: &[&str] = &[
    "1", "2.5", "x", "a", "(", ")", "+", "-", "*", "/", "^", "%", ",", ";", "=", "==", "!", "&&", "\"", "'",
    " ", "math::", "::", "é", "🦀",
];
const VARIABLES: &[&str] = &["a", "b", "x", "y_1", "", "1x", "é"];

/// Expressions from a grammar of numbers, identifiers, operators, functions and parentheses.
fn expression() -> BoxedStrategy<String> {
    let atom = prop_oneof![
        (0u32..100).prop_map(|n| n.to_string()),
        select_owned(NUMBERS),
        select_owned(IDENTIFIERS)
    ];
    atom.prop_recursive(6, 64, 4, |inner| {
        prop_oneof![
            3 => (inner.clone(), prop::sample::select(BINARY), inner.clone())
                .prop_map(|(a, op, b)| format!("{a} {op} {b}")),
            1 => (prop::sample::select(UNARY), inner.clone()).prop_map(|(op, a)| format!("{op}{a}")),
            1 => inner.clone().prop_map(|a| format!("({a})")),
            2 => (prop::sample::select(FUNCTIONS), prop::collection::vec(inner, 0..4))
                .prop_map(|(f, args)| format!("{f}({})", args.join(", "))),
        ]
    })
    .boxed()
}

fn variables() -> BoxedStrategy<BTreeMap<String, f64>> {
    prop::collection::btree_map(
        select_owned(VARIABLES),
        prop_oneof![-1.0e6f64..1.0e6f64, Just(0.0), Just(1.0e308), Just(-1.0e308)],
        0..4,
    )
    .boxed()
}

const CHAIN_OPERATORS: &[&str] = &["+", "-", "*", "/", "^", "%", "&&", "==", "<"];
const PREFIX_OPERATORS: &[&str] = &["-", "!", "- "];

/// Operator chains and stacks up to about the 8 KiB input bound, nesting past the 64 bound.
fn long_expression() -> BoxedStrategy<String> {
    prop_oneof![
        (prop::sample::select(CHAIN_OPERATORS), 1usize..4000).prop_map(|(op, n)| {
            let mut text = "1".to_owned();
            for _ in 0..n {
                text.push_str(op);
                text.push('1');
            }
            text
        }),
        (prop::sample::select(PREFIX_OPERATORS), 1usize..4000)
            .prop_map(|(op, n)| format!("{}1", op.repeat(n))),
        (1usize..200, any::<bool>()).prop_map(|(n, closed)| {
            format!("{}1{}", "(".repeat(n), if closed { ")".repeat(n) } else { String::new() })
        }),
        (1usize..200).prop_map(|n| format!("{}-1{}", "math::abs(".repeat(n), ")".repeat(n))),
    ]
    .boxed()
}

fn math_args(expression: &str, variables: &BTreeMap<String, f64>, shape: usize) -> Value {
    match shape {
        0 => json!({"expression": expression}),
        1 => json!({"expression": expression, "variables": variables, "extra": true}),
        2 => json!({"expression": expression.len(), "variables": variables}),
        _ => json!({"expression": expression, "variables": variables}),
    }
}

#[test]
fn math_evaluate_answers_any_expression_with_a_value_or_a_typed_error() {
    let rt = runtime();
    let tools = registry();
    let dir = tempfile::tempdir().expect("a temp dir");
    let ctx = ToolContext { workspace: dir.path().to_path_buf(), task: None };
    let expressions = prop_oneof![6 => expression(), 1 => any_text(64), 1 => token_text(MATH_TOKENS, 32)];
    proptest!(config(), |(text in expressions, vars in variables(), shape in 0usize..6)| {
        let args = math_args(&text, &vars, shape);
        let result = rt.block_on(tools.call("math.evaluate", args, &ctx));
        check_typed("math.evaluate", &result)?;
    });
}

#[test]
fn math_evaluate_survives_long_chains_and_deep_nesting() {
    let rt = runtime();
    let tools = registry();
    let dir = tempfile::tempdir().expect("a temp dir");
    let ctx = ToolContext { workspace: dir.path().to_path_buf(), task: None };
    proptest!(config(), |(text in long_expression())| {
        let args = json!({"expression": text});
        let result = rt.block_on(tools.call("math.evaluate", args, &ctx));
        check_typed("math.evaluate", &result)?;
    });
}

// ---- text.template -----------------------------------------------------------------------------

const TEMPLATE_ATOMS: &[&str] = &[
    "x",
    "name",
    "rows",
    "s",
    "n",
    "big",
    "missing",
    "1",
    "0",
    "-1",
    "2",
    "2.5",
    "\"a\"",
    "'é'",
    "none",
    "true",
    "[1, 2]",
    "{\"k\": 1}",
    "range(3)",
    "loop",
    "loop.index",
    "rows[0].key",
    "name|upper",
    "x|round(1)",
    "self",
    "namespace()",
    "super()",
];
const TEMPLATE_OPERATORS: &[&str] =
    &["+", "-", "*", "/", "//", "%", "**", "~", "==", "!=", "<", "and", "or", "in", "not in", "is", "is not"];
const TEMPLATE_FILTERS: &[&str] = &[
    "upper",
    "lower",
    "length",
    "round",
    "round(2)",
    "join(',')",
    "default('d')",
    "tojson",
    "first",
    "last",
    "list",
    "sort",
    "reverse",
    "int",
    "float",
    "string",
    "abs",
    "trim",
    "e",
    "safe",
    "items",
    "dictsort",
    "batch(2)",
    "slice(2)",
    "replace('a', 'b')",
    "indent(2)",
    "unknown_filter",
];
const TEMPLATE_TOKENS: &[&str] = &[
    "{{",
    "}}",
    "{%",
    "%}",
    "{#",
    "#}",
    "{{-",
    "-}}",
    "{%-",
    "-%}",
    " ",
    "\n",
    "x",
    "rows",
    "for",
    "in",
    "endfor",
    "if",
    "elif",
    "else",
    "endif",
    "set",
    "=",
    "with",
    "endwith",
    "filter",
    "endfilter",
    "raw",
    "endraw",
    "macro",
    "endmacro",
    "call",
    "caller()",
    "include",
    "import",
    "extends",
    "block",
    "endblock",
    "|",
    "(",
    ")",
    "[",
    "]",
    ".",
    ",",
    "~",
    "'",
    "\"",
    "\\",
    "é",
    "🦀",
];

/// Expressions inside `{{ }}` and tags: atoms, operators, filters, parentheses and subscripts.
fn template_expression() -> BoxedStrategy<String> {
    select_owned(TEMPLATE_ATOMS)
        .prop_recursive(4, 32, 3, |inner| {
            prop_oneof![
                (inner.clone(), prop::sample::select(TEMPLATE_OPERATORS), inner.clone())
                    .prop_map(|(a, op, b)| format!("{a} {op} {b}")),
                (inner.clone(), prop::sample::select(TEMPLATE_FILTERS))
                    .prop_map(|(a, f)| format!("({a})|{f}")),
                inner.clone().prop_map(|a| format!("({a})")),
                (inner.clone(), inner).prop_map(|(a, b)| format!("{a}[{b}]")),
            ]
        })
        .boxed()
}

fn template() -> BoxedStrategy<String> {
    let piece = prop_oneof![
        3 => "[a-zA-Z .,é\\n]{0,8}",
        3 => template_expression().prop_map(|e| format!("{{{{ {e} }}}}")),
        1 => template_expression().prop_map(|e| format!("{{% if {e} %}}yes{{% else %}}no{{% endif %}}")),
        1 => template_expression()
            .prop_map(|e| format!("{{% for item in {e} %}}{{{{ item }}}}{{{{ loop.index }}}}{{% endfor %}}")),
        1 => template_expression().prop_map(|e| format!("{{% set v = {e} %}}{{{{ v }}}}")),
        2 => select_owned(TEMPLATE_TOKENS),
    ];
    prop::collection::vec(piece, 0..8).prop_map(|pieces| pieces.concat()).boxed()
}

/// Long flat templates, nesting up to minijinja's parser limit of 150 (and unclosed brackets
/// past it, which the parser refuses), and templates past the 64 KiB bound.
fn long_template() -> BoxedStrategy<String> {
    prop_oneof![
        (1usize..120).prop_map(|n| format!("{{{{ {}1{} }}}}", "(".repeat(n), ")".repeat(n))),
        (1usize..100).prop_map(|n| format!("{}x{}", "{% if true %}".repeat(n), "{% endif %}".repeat(n))),
        (1usize..100).prop_map(|n| format!(
            "{}{{{{ x }}}}{}",
            "{% for i in [1] %}".repeat(n),
            "{% endfor %}".repeat(n)
        )),
        (1usize..2000).prop_map(|n| format!("{{{{ 1{} }}}}", " ~ 1".repeat(n))),
        (1usize..2000).prop_map(|n| format!("{{{{ name{} }}}}", "|upper".repeat(n))),
        (1usize..3000).prop_map(|n| "{{ [".repeat(n)),
        (1usize..12000).prop_map(|n| "{{ x }}".repeat(n)),
    ]
    .boxed()
}

fn template_values() -> Value {
    json!({
        "x": 1, "name": "toys", "rows": [{"key": "a"}, {"key": "b"}], "s": "é", "n": null, "big": 1.0e300
    })
}

#[test]
fn text_template_answers_any_template_with_text_or_a_typed_error() {
    let rt = runtime();
    let tools = registry();
    let dir = tempfile::tempdir().expect("a temp dir");
    let ctx = ToolContext { workspace: dir.path().to_path_buf(), task: None };
    let values = template_values();
    let templates = prop_oneof![6 => template(), 1 => any_text(64), 1 => token_text(TEMPLATE_TOKENS, 32)];
    proptest!(config(), |(text in templates, with_values in any::<bool>())| {
        let args = if with_values {
            json!({"template": text, "values": values})
        } else {
            json!({"template": text})
        };
        let result = rt.block_on(tools.call("text.template", args, &ctx));
        check_typed("text.template", &result)?;
    });
}

#[test]
fn text_template_survives_long_and_deeply_nested_templates() {
    let rt = runtime();
    let tools = registry();
    let dir = tempfile::tempdir().expect("a temp dir");
    let ctx = ToolContext { workspace: dir.path().to_path_buf(), task: None };
    let values = template_values();
    proptest!(config(), |(text in long_template())| {
        let args = json!({"template": text, "values": values});
        let result = rt.block_on(tools.call("text.template", args, &ctx));
        check_typed("text.template", &result)?;
    });
}

// ---- fs.read, fs.write, fs.list ----------------------------------------------------------------

/// What lies outside the workspace; no tool output or error may ever contain it.
const SECRET: &str = "HERMES-FUZZ-SECRET-7f3a9c";
/// The temp dir holds the workspace and, beside it, what the tools must never reach.
const ROOT_ENTRIES: [&str; 3] = ["outside", "secret.txt", "ws"];

struct Sandbox {
    _dir: tempfile::TempDir,
    /// The temp dir, canonical.
    root: PathBuf,
    /// `root/ws`.
    workspace: PathBuf,
}

/// `root/{secret.txt, outside/secret.txt}` and the workspace `root/ws`, with symlinks out of it
/// (absolute, relative, to a dir, to the parent, dangling) and one that stays inside.
fn sandbox() -> Sandbox {
    use std::os::unix::fs::symlink;
    let dir = tempfile::tempdir().expect("a temp dir");
    let root = dir.path().canonicalize().expect("the temp dir resolves");
    let workspace = root.join("ws");
    std::fs::create_dir_all(workspace.join("notes/deep")).expect("mkdir");
    std::fs::write(workspace.join("notes/a.txt"), "hello").expect("write");
    std::fs::write(root.join("secret.txt"), SECRET).expect("write");
    std::fs::create_dir(root.join("outside")).expect("mkdir");
    std::fs::write(root.join("outside/secret.txt"), SECRET).expect("write");
    symlink(root.join("secret.txt"), workspace.join("link.txt")).expect("symlink");
    symlink("../../secret.txt", workspace.join("notes/rel.txt")).expect("symlink");
    symlink(root.join("outside"), workspace.join("outdir")).expect("symlink");
    symlink("..", workspace.join("up")).expect("symlink");
    symlink(root.join("escape.txt"), workspace.join("escape")).expect("symlink");
    symlink("notes", workspace.join("inlink")).expect("symlink");
    Sandbox { _dir: dir, root, workspace }
}

fn entries(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .expect("the dir lists")
        .map(|entry| entry.expect("an entry").file_name().to_string_lossy().into_owned())
        .collect()
}

/// Nothing beside the workspace was created, removed or changed.
fn check_untouched(sandbox: &Sandbox) -> Result<(), TestCaseError> {
    let expected: BTreeSet<String> = ROOT_ENTRIES.iter().map(|e| (*e).to_owned()).collect();
    prop_assert_eq!(entries(&sandbox.root), expected);
    prop_assert_eq!(entries(&sandbox.root.join("outside")), BTreeSet::from(["secret.txt".to_owned()]));
    for file in ["secret.txt", "outside/secret.txt"] {
        let text = std::fs::read_to_string(sandbox.root.join(file)).ok();
        prop_assert_eq!(text.as_deref(), Some(SECRET), "{} changed", file);
    }
    Ok(())
}

const PATH_PIECES: &[&str] = &[
    "..",
    ".",
    "...",
    "/",
    "//",
    "\\",
    "%2e",
    "%2E",
    "%2f",
    "%2F",
    "%5c",
    "%00",
    "%252e",
    "\0",
    "~",
    "notes",
    "a.txt",
    "deep",
    "rel.txt",
    "secret.txt",
    "ws",
    "outside",
    "link.txt",
    "outdir",
    "up",
    "inlink",
    "escape",
    "escape.txt",
    "new.txt",
    ".hidden",
    "x",
    " ",
    "é",
    "🦀",
    "\u{202e}",
    "\u{feff}",
    ":",
    "*",
    "?",
    "\n",
    "file:",
    "C:",
    "$HOME",
    "-",
];

#[test]
fn file_tools_never_reach_outside_the_workspace() {
    let rt = runtime();
    let tools = registry();
    let sandbox = sandbox();
    let ctx = ToolContext { workspace: sandbox.workspace.clone(), task: None };
    let root = sandbox.root.to_string_lossy().into_owned();
    let absolute = vec![
        format!("{root}/secret.txt"),
        format!("{root}/ws/../secret.txt"),
        format!("{root}/outside"),
        format!("{root}/outside/secret.txt"),
        format!("{root}/escape.txt"),
        format!("{root}/ws/notes/a.txt"),
    ];
    let paths = prop_oneof![
        8 => token_text(PATH_PIECES, 8),
        1 => any_text(24),
        1 => prop::sample::select(absolute),
    ];
    proptest!(config(), |(path in paths, content in "[a-z ]{0,12}", append in any::<bool>())| {
        let calls = [
            ("fs.read", json!({"path": path})),
            ("fs.list", json!({"path": path})),
            ("fs.write", json!({"path": path, "content": content, "append": append})),
            ("fs.read", json!({"path": path})),
            ("fs.list", json!({"path": "."})),
        ];
        for (tool, args) in calls {
            let result = rt.block_on(tools.call(tool, args, &ctx));
            check_typed(tool, &result)?;
            let shown = match &result {
                Ok(output) => output.to_string(),
                Err(e) => e.to_string(),
            };
            prop_assert!(!shown.contains(SECRET), "{} {:?} revealed the outside: {}", tool, path, shown);
            check_untouched(&sandbox)?;
        }
    });
}
