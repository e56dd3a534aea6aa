//! Generates [`VisitStrings`] for every `hermes.v1` message from the descriptor set: one
//! implementation per message that hands each string it holds (singular fields, repeated fields,
//! map keys and values, oneof variants, nested messages) to a visitor. Redaction walks a message
//! with it, so a field added to the contract is covered without anyone listing it.
//!
//! Included by build.rs; kept apart so the rules of prost's naming are in one place.

use heck::{ToSnakeCase, ToUpperCamelCase};
use prost_types::field_descriptor_proto::{Label, Type};
use prost_types::{DescriptorProto, FieldDescriptorProto, FileDescriptorSet};

const PACKAGE: &str = "hermes.v1";

/// An identifier as prost writes it: keywords raw (`r#ref`), `self` and friends with `_`.
fn ident(name: &str) -> String {
    const RAW: &[&str] = &[
        "as", "break", "const", "continue", "else", "enum", "extern", "false", "fn", "for", "if", "impl",
        "in", "let", "loop", "match", "mod", "move", "mut", "pub", "ref", "return", "static", "struct",
        "trait", "true", "type", "unsafe", "use", "where", "while", "async", "await", "dyn", "abstract",
        "become", "box", "do", "final", "macro", "override", "priv", "typeof", "unsized", "virtual", "yield",
        "try", "gen",
    ];
    match name {
        "self" | "super" | "crate" | "Self" => format!("{name}_"),
        n if RAW.contains(&n) => format!("r#{n}"),
        n => n.to_owned(),
    }
}

/// The Rust type of a message of this package (`.hermes.v1.TaskPlan` -> `TaskPlan`), or `None`
/// for another package's.
fn local_type(type_name: &str) -> Option<String> {
    let name = type_name.strip_prefix(&format!(".{PACKAGE}."))?;
    (!name.contains('.')).then(|| name.to_upper_camel_case())
}

enum Shape<'a> {
    /// A map field: its key and value fields.
    Map(&'a FieldDescriptorProto, &'a FieldDescriptorProto),
    Repeated,
    Singular,
}

fn shape<'a>(message: &'a DescriptorProto, field: &FieldDescriptorProto) -> Shape<'a> {
    if field.label() != Label::Repeated {
        return Shape::Singular;
    }
    if field.r#type() == Type::Message {
        let entry = field.type_name().rsplit('.').next().unwrap_or_default();
        if let Some(nested) = message.nested_type.iter().find(|n| n.name() == entry)
            && nested.options.as_ref().is_some_and(|o| o.map_entry())
        {
            return Shape::Map(&nested.field[0], &nested.field[1]);
        }
    }
    Shape::Repeated
}

/// Statements visiting a value held in `place` (an expression of type `&mut T`).
fn visit_value(field: &FieldDescriptorProto, name: &str, place: &str, marked: &str) -> Option<String> {
    match field.r#type() {
        Type::String if name.ends_with("_json") => {
            Some(format!("visitor.json({name:?}, {place}, {marked});"))
        }
        Type::String => Some(format!("visitor.field({name:?}, {place});")),
        Type::Message => local_type(field.type_name()).map(|_| format!("({place}).visit_strings(visitor);")),
        _ => None,
    }
}

fn message_impl(message: &DescriptorProto) -> String {
    let type_name = message.name().to_upper_camel_case();
    let module = message.name().to_snake_case();
    let marked = match message.field.iter().any(|f| f.name() == "secret_inputs") {
        true => "&self.secret_inputs",
        false => "&[]",
    };
    let mut body = Vec::new();
    let mut oneofs: Vec<Vec<&FieldDescriptorProto>> = vec![Vec::new(); message.oneof_decl.len()];
    for field in &message.field {
        let name = field.name();
        let member = ident(&name.to_snake_case());
        if let Some(index) = field.oneof_index
            && !field.proto3_optional()
        {
            oneofs[index as usize].push(field);
            continue;
        }
        match shape(message, field) {
            Shape::Map(key, value) => {
                if key.r#type() != Type::String {
                    let Some(visit) = visit_value(value, name, "v", "&[]") else { continue };
                    body.push(format!("for v in self.{member}.values_mut() {{ {visit} }}"));
                    continue;
                }
                // String keys are visited whatever the values are; a key cannot be changed in
                // place, so the map is rebuilt.
                let (value_binding, visit) = match value.r#type() {
                    Type::String => ("mut v", format!("visitor.entry({name:?}, &mut k, &mut v);")),
                    _ => match visit_value(value, name, "&mut v", "&[]") {
                        Some(visit) => ("mut v", format!("visitor.element({name:?}, &mut k); {visit}")),
                        None => ("v", format!("visitor.element({name:?}, &mut k);")),
                    },
                };
                body.push(format!(
                    "if !self.{member}.is_empty() {{ self.{member} = ::std::mem::take(&mut self.{member}).into_iter().map(|(mut k, {value_binding})| {{ {visit} (k, v) }}).collect(); }}"
                ));
            }
            Shape::Repeated => {
                let visit = match field.r#type() {
                    Type::String => format!("visitor.element({name:?}, item);"),
                    _ => match visit_value(field, name, "item", "&[]") {
                        Some(visit) => visit,
                        None => continue,
                    },
                };
                body.push(format!("for item in self.{member}.iter_mut() {{ {visit} }}"));
            }
            Shape::Singular if field.proto3_optional() || field.r#type() == Type::Message => {
                let Some(visit) = visit_value(field, name, "value", marked) else { continue };
                body.push(format!("if let Some(value) = self.{member}.as_mut() {{ {visit} }}"));
            }
            Shape::Singular => {
                let Some(visit) = visit_value(field, name, &format!("&mut self.{member}"), marked) else {
                    continue;
                };
                body.push(visit);
            }
        }
    }
    for (index, fields) in oneofs.iter().enumerate() {
        if fields.is_empty() {
            continue;
        }
        let oneof = message.oneof_decl[index].name();
        let member = ident(&oneof.to_snake_case());
        let enum_path = format!("{module}::{}", oneof.to_upper_camel_case());
        let mut arms = Vec::new();
        for field in fields {
            let variant = field.name().to_upper_camel_case();
            if let Some(visit) = visit_value(field, field.name(), "value", "&[]") {
                arms.push(format!("{enum_path}::{variant}(value) => {{ {visit} }}"));
            }
        }
        if arms.is_empty() {
            continue;
        }
        arms.push("#[allow(unreachable_patterns)] _ => {}".into());
        body.push(format!(
            "if let Some(value) = self.{member}.as_mut() {{ match value {{ {} }} }}",
            arms.join(" ")
        ));
    }
    let used = if body.is_empty() { "let _ = visitor;" } else { "" };
    format!(
        "impl VisitStrings for {type_name} {{\n    fn visit_strings(&mut self, visitor: &mut dyn StringVisitor) {{\n        {used}{}\n    }}\n}}\n",
        body.join("\n        ")
    )
}

/// The implementations for every message of the package.
pub fn generate(set: &FileDescriptorSet) -> String {
    let mut out = String::from("// Generated by crates/proto/strings.rs from the descriptor set.\n");
    for file in set.file.iter().filter(|f| f.package() == PACKAGE) {
        for message in &file.message_type {
            out.push_str(&message_impl(message));
        }
    }
    out
}
