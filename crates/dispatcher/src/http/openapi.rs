//! `GET /v1/openapi.json`: the HTTP API as an OpenAPI 3.1 document, generated from what the
//! handlers use, so it cannot drift: the paths from [`crate::http::ROUTES`] (the table the router
//! is built from), request bodies and queries from their serde types (schemars), and answers from
//! the protobuf descriptors of the `hermes.v1` messages in their canonical JSON mapping (the
//! mapping pbjson serializes).

use prost::Message as _;
use prost_types::field_descriptor_proto::{Label, Type};
use prost_types::{DescriptorProto, FileDescriptorSet};
use serde_json::{Map, Value, json};

use super::routes::{ROUTES, Reply};

/// Schemas of `hermes.v1` messages and enums in the canonical JSON mapping, by short name.
struct Proto {
    messages: std::collections::HashMap<String, DescriptorProto>,
    enums: std::collections::HashMap<String, Vec<String>>,
}

impl Proto {
    fn load() -> Proto {
        let set = FileDescriptorSet::decode(hermes_proto::FILE_DESCRIPTOR_SET).unwrap_or_default();
        let mut proto = Proto { messages: Default::default(), enums: Default::default() };
        for file in set.file {
            let package = file.package().to_owned();
            for e in &file.enum_type {
                proto.enums.insert(
                    format!(".{package}.{}", e.name()),
                    e.value.iter().map(|v| v.name().to_owned()).collect(),
                );
            }
            for m in &file.message_type {
                proto.add(&format!(".{package}"), m);
            }
        }
        proto
    }

    fn add(&mut self, scope: &str, message: &DescriptorProto) {
        let name = format!("{scope}.{}", message.name());
        for e in &message.enum_type {
            self.enums.insert(
                format!("{name}.{}", e.name()),
                e.value.iter().map(|v| v.name().to_owned()).collect(),
            );
        }
        for nested in &message.nested_type {
            self.add(&name, nested);
        }
        self.messages.insert(name, message.clone());
    }

    /// The component name of a fully qualified type: `.hermes.v1.Goal` is `Goal`, a nested
    /// `.hermes.v1.Event.Kind` is `Event.Kind`.
    fn component(full: &str) -> String {
        full.trim_start_matches(".hermes.v1.").to_owned()
    }

    /// Adds the schema of `full` and of everything it refers to, to `defs`.
    fn define(&self, full: &str, defs: &mut Map<String, Value>) {
        let name = Self::component(full);
        if defs.contains_key(&name) {
            return;
        }
        if let Some(values) = self.enums.get(full) {
            defs.insert(name, json!({"type": "string", "enum": values}));
            return;
        }
        let Some(message) = self.messages.get(full) else {
            defs.insert(name, json!({}));
            return;
        };
        defs.insert(name.clone(), json!({}));
        let mut properties = Map::new();
        for field in &message.field {
            let repeated = field.label() == Label::Repeated;
            let map_entry = (field.r#type() == Type::Message)
                .then(|| self.messages.get(field.type_name()))
                .flatten()
                .filter(|m| m.options.as_ref().is_some_and(|o| o.map_entry()));
            let schema = match map_entry {
                Some(entry) => {
                    let value =
                        entry.field.iter().find(|f| f.number() == 2).map(|f| self.field_schema(f, defs));
                    json!({"type": "object", "additionalProperties": value.unwrap_or(json!({}))})
                }
                None if repeated => json!({"type": "array", "items": self.field_schema(field, defs)}),
                None => self.field_schema(field, defs),
            };
            properties.insert(field.json_name().to_owned(), schema);
        }
        defs.insert(name, json!({"type": "object", "properties": properties, "additionalProperties": false}));
    }

    /// One value of a field (not its repetition).
    fn field_schema(
        &self,
        field: &prost_types::FieldDescriptorProto,
        defs: &mut Map<String, Value>,
    ) -> Value {
        match field.r#type() {
            Type::Double | Type::Float => json!({"type": "number"}),
            Type::Int32 | Type::Uint32 | Type::Sint32 | Type::Fixed32 | Type::Sfixed32 => {
                json!({"type": "integer"})
            }
            // 64-bit integers are strings in the canonical mapping.
            Type::Int64 | Type::Uint64 | Type::Sint64 | Type::Fixed64 | Type::Sfixed64 => {
                json!({"type": "string", "pattern": "^-?[0-9]+$"})
            }
            Type::Bool => json!({"type": "boolean"}),
            Type::String => json!({"type": "string"}),
            Type::Bytes => json!({"type": "string", "contentEncoding": "base64"}),
            Type::Enum | Type::Message | Type::Group => {
                self.define(field.type_name(), defs);
                json!({"$ref": format!("#/components/schemas/{}", Self::component(field.type_name()))})
            }
        }
    }
}

fn problem_schema() -> Value {
    json!({
        "type": "object",
        "description": "An RFC 9457 problem; `code` is the Hermes error code.",
        "properties": {
            "type": {"type": "string"}, "title": {"type": "string"}, "status": {"type": "integer"},
            "detail": {"type": "string"}, "code": {"type": "string"},
            "problems": {"type": "array", "items": {"type": "string"}}
        },
        "required": ["type", "title", "status", "detail", "code"]
    })
}

/// The OpenAPI 3.1 document of the HTTP API.
pub fn document() -> Value {
    let proto = Proto::load();
    let mut defs = Map::new();
    defs.insert("Problem".into(), problem_schema());
    let mut paths = Map::new();
    for route in ROUTES {
        let mut operation = json!({
            "operationId": route.id,
            "summary": route.summary,
            "responses": {
                "default": {
                    "description": "an error",
                    "content": {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}}
                }
            }
        });
        let mut parameters: Vec<Value> = route
            .path
            .split('/')
            .filter_map(|segment| segment.strip_prefix('{').and_then(|s| s.split('}').next()))
            .map(|name| json!({"name": name, "in": "path", "required": true, "schema": {"type": "string"}}))
            .collect();
        if let Some(query) = route.query {
            let schema = query(&mut defs);
            for (name, property) in schema["properties"].as_object().into_iter().flatten() {
                let mut property = property.clone();
                let description = property.as_object_mut().and_then(|p| p.remove("description"));
                let mut parameter =
                    json!({"name": name, "in": "query", "required": false, "schema": property});
                if let Some(d) = description {
                    parameter["description"] = d;
                }
                parameters.push(parameter);
            }
        }
        for header in route.headers {
            parameters.push(
                json!({"name": header, "in": "header", "required": false, "schema": {"type": "string"}}),
            );
        }
        if !parameters.is_empty() {
            operation["parameters"] = Value::Array(parameters);
        }
        if let Some(body) = route.body {
            let schema = body(&mut defs);
            operation["requestBody"] = json!({
                "required": route.body_required,
                "content": {
                    "application/json": {"schema": schema.clone()},
                    "application/yaml": {"schema": schema}
                }
            });
        }
        let (status, description, content) = match &route.reply {
            Reply::Message(full) => {
                proto.define(full, &mut defs);
                let schema = json!({"$ref": format!("#/components/schemas/{}", Proto::component(full))});
                ("200", "OK", json!({"application/json": {"schema": schema}}))
            }
            Reply::ListOf(field, full) => {
                proto.define(full, &mut defs);
                let item = json!({"$ref": format!("#/components/schemas/{}", Proto::component(full))});
                let mut properties = json!({ *field: {"type": "array", "items": item} });
                if *field == "goals" {
                    properties["nextPageToken"] =
                        json!({"type": "string", "description": "empty on the last page"});
                }
                (
                    "200",
                    "OK",
                    json!({"application/json": {"schema": {"type": "object", "properties": properties}}}),
                )
            }
            Reply::Json(schema) => ("200", "OK", json!({"application/json": {"schema": schema()}})),
            Reply::EventStream => (
                "200",
                "Server-Sent Events: `id:` the event's seq, `data:` an Event",
                json!({"text/event-stream": {"schema": {"type": "string"}}}),
            ),
            Reply::WebSocket => ("101", "a WebSocket of Event messages", json!(null)),
            Reply::Bytes => (
                "200",
                "the artifact's bytes, in its content type",
                json!({"application/octet-stream": {"schema": {"type": "string", "contentMediaType": "application/octet-stream"}}}),
            ),
        };
        let mut response = json!({"description": description});
        if !content.is_null() {
            response["content"] = content.clone();
        }
        operation["responses"][status] = response;
        if route.id == "submitGoal" {
            operation["responses"]["201"] = json!({"description": "created", "content": content});
        }
        if let Reply::EventStream | Reply::WebSocket = route.reply {
            proto.define(".hermes.v1.Event", &mut defs);
        }
        let item = paths.entry(route.path.to_owned()).or_insert_with(|| json!({}));
        item[route.method.to_ascii_lowercase()] = operation;
    }
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "Hermes HTTP API",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Goals, their events, approvals and dead letters (docs/http.md). JSON is protobuf's canonical mapping of the hermes.v1 messages."
        },
        "paths": paths,
        "components": {"schemas": defs}
    })
}
