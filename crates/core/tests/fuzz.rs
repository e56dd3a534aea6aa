//! Bounded property-based fuzzing of the core crate's input handling:
//!
//! * plan validation: arbitrary plans (odd ids, task types, `inputs_json` text that is not JSON,
//!   not an object, deeply nested, full of `$ref`s) never panic and are either accepted with
//!   consistent groups or rejected as `PLAN_INVALID` with problems; generated valid DAGs are
//!   accepted, with their `$ref` dependencies made explicit and their groups in DAG order;
//! * `$ref` handling: `RefTarget::parse` reads a reference back to its text, the pointers
//!   `collect_refs` reports lead to the references, `resolve` agrees with `lookup` and `map_refs`;
//! * artifact stubs and redaction never panic and keep what they promise.
//!
//! Each property runs `HERMES_FUZZ_CASES` cases (default 256, what `make test` runs; `make fuzz`
//! runs 20000). Failures are not persisted to a file: proptest prints the shrunk input, and a
//! crash it finds must be added as a plain regression `#[test]` next to the code it broke.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use hermes_core::artifacts::{self, ARTIFACT_KEY, ArtifactInfo};
use hermes_core::ids::{IdShape, check_id};
use hermes_core::json_ref::{self, REF_KEY, RefTarget};
use hermes_core::plan::{DEFAULT_MAX_NODES, validate_plan};
use hermes_core::redact;
use hermes_core::schema::InputSchema;
use hermes_core::{Error, ErrorCode};
use hermes_proto::event::Kind;
use hermes_proto::{Event, TaskNode, TaskPlan};
use hermes_test_util::fuzz::{any_text, config, select_owned, token_text};
use proptest::prelude::*;
use serde_json::{Map, Value, json};

// ---- strategies ------------------------------------------------------------------------------

/// Object keys: the ones the code reacts to, and anything else.
const KEYS: &[&str] = &[
    "a",
    "x",
    "y",
    "items",
    "0",
    "1",
    "",
    "~",
    "/",
    "a/b",
    "~1",
    "é",
    REF_KEY,
    ARTIFACT_KEY,
    "path",
    "size_bytes",
    "preview",
    "api_key",
    "token",
    "password",
    "Authorization",
    "max_tokens",
];

fn key() -> BoxedStrategy<String> {
    prop_oneof![3 => select_owned(KEYS), 1 => any_text(8)].boxed()
}

/// Free text the redaction code reacts to.
const TEXT_TOKENS: &[&str] = &[
    "api_key",
    "apiKey",
    "token",
    "password",
    "secret",
    "Authorization",
    "max_tokens",
    "=",
    ":",
    "：",
    " ",
    "\t",
    "\n",
    "\"",
    "'",
    ",",
    "{",
    "}",
    "Bearer ",
    "bearer",
    "Basic ",
    "sk-",
    "sk-live-0123456789",
    "abc123",
    "[REDACTED]",
    "é",
    "🦀",
    "İ",
    "K",
];

fn scalar() -> BoxedStrategy<Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        (-1.0e300f64..1.0e300f64).prop_map(Value::from),
        token_text(TEXT_TOKENS, 6).prop_map(Value::String),
        any_text(16).prop_map(Value::String),
    ]
    .boxed()
}

/// Node ids references name; `ghost` never has an output.
const REF_NODES: &[&str] = &["a", "b", "c", "ghost", "a-1", "n_2"];
/// Path segments: keys of the generated outputs, indices, and what must not match.
const SEGMENTS: &[&str] =
    &["x", "y", "items", "0", "1", "2", "01", "-1", "+1", " 0", "", "~", "/", "a/b", "é"];
const REF_NOISE: &[&str] = &[".", "..", "a", "b", "0", "x", "$", " ", "é"];

/// A `$ref` string: mostly well-formed, sometimes not at all.
fn reference() -> BoxedStrategy<String> {
    prop_oneof![
        4 => (prop::sample::select(REF_NODES), prop::collection::vec(prop::sample::select(SEGMENTS), 0..4))
            .prop_map(|(node, path)| std::iter::once(node).chain(path).collect::<Vec<_>>().join(".")),
        1 => token_text(REF_NOISE, 6),
        1 => any_text(12),
    ]
    .boxed()
}

fn ref_object() -> BoxedStrategy<Value> {
    reference().prop_map(|r| json!({ REF_KEY: r })).boxed()
}

const ARTIFACT_REFS: &[&str] = &["art-1", "art-2"];

fn artifact_stub() -> BoxedStrategy<Value> {
    (prop_oneof![select_owned(ARTIFACT_REFS), any_text(10)], prop::collection::vec(any_text(4), 0..3))
        .prop_map(|(reference, path)| artifacts::stub_at(&reference, &path))
        .boxed()
}

/// A JSON tree of bounded depth and size over `leaf`, with keys from `keys`.
fn json_tree(leaf: BoxedStrategy<Value>, keys: BoxedStrategy<String>) -> BoxedStrategy<Value> {
    leaf.prop_recursive(4, 48, 6, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((keys.clone(), inner), 0..6)
                .prop_map(|entries| Value::Object(entries.into_iter().collect::<Map<String, Value>>())),
        ]
    })
    .boxed()
}

/// Any JSON value, with `$ref` objects and artifact stubs among the leaves.
fn any_json() -> BoxedStrategy<Value> {
    let leaf = prop_oneof![4 => scalar(), 1 => ref_object(), 1 => artifact_stub()].boxed();
    json_tree(leaf, key())
}

const OUTPUT_KEYS: &[&str] = &["x", "y", "items", "0", "1"];

/// A node output that some generated paths lead into.
fn output_json() -> BoxedStrategy<Value> {
    json_tree(scalar(), select_owned(OUTPUT_KEYS))
}

// ---- plans -----------------------------------------------------------------------------------

const NODE_IDS: &[&str] = &["a", "b", "c", "n0", "n1", "x-1", "y_2", "", "a b", "a.b", "ü"];
const TASK_TYPES: &[&str] = &["t.free", "t.any", "t.num", "t.nope", "T.bad", "a..b", "a_b", "", "t.free."];
const JSON_TOKENS: &[&str] = &[
    "{", "}", "[", "]", ":", ",", "\"", "\"$ref\"", "\"a.x\"", "1", "-", "1e999", "null", "true", " ", "\\",
];
const OPENERS: &[&str] = &["[", "{\"a\":", "{\"$ref\":", "[{\"$ref\":\"a\"},"];

/// The task types the catalogue knows: no schema, any object, an object with a number `x`.
fn catalog() -> HashMap<String, Option<InputSchema>> {
    let any = InputSchema::compile(json!({"type": "object"})).expect("the schema compiles");
    let num = InputSchema::compile(json!({
        "type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]
    }))
    .expect("the schema compiles");
    HashMap::from([
        ("t.free".to_owned(), None),
        ("t.any".to_owned(), Some(any)),
        ("t.num".to_owned(), Some(num)),
    ])
}

fn node_id() -> BoxedStrategy<String> {
    prop_oneof![6 => select_owned(NODE_IDS), 1 => any_text(70), 1 => "[A-Za-z0-9_-]{60,70}"].boxed()
}

fn task_type() -> BoxedStrategy<String> {
    prop_oneof![6 => select_owned(TASK_TYPES), 1 => any_text(70), 1 => "[a-z0-9.-]{1,70}"].boxed()
}

/// Up to a few thousand unclosed (or closed) brackets.
fn deep_brackets() -> BoxedStrategy<String> {
    (prop::sample::select(OPENERS), 1usize..3000, any::<bool>())
        .prop_map(|(open, depth, closed)| {
            let mut text = open.repeat(depth);
            if closed {
                text.push_str(&(if open.starts_with('[') { "]" } else { "}" }).repeat(depth));
            }
            text
        })
        .boxed()
}

/// Inputs whose values are refs into the plan's own (possibly invalid) node ids.
fn inputs_with_plan_refs() -> BoxedStrategy<Value> {
    let plan_ref =
        (prop::sample::select(NODE_IDS), prop::collection::vec(prop::sample::select(SEGMENTS), 0..3))
            .prop_map(|(node, path)| {
                let reference = std::iter::once(node).chain(path).collect::<Vec<_>>().join(".");
                json!({ REF_KEY: reference })
            });
    prop::collection::vec((key(), prop_oneof![scalar(), plan_ref]), 0..5)
        .prop_map(|entries| Value::Object(entries.into_iter().collect()))
        .boxed()
}

fn inputs_json() -> BoxedStrategy<String> {
    prop_oneof![
        Just(String::new()),
        Just("  \n".to_owned()),
        any_text(40),
        token_text(JSON_TOKENS, 24),
        any_json().prop_map(|v| v.to_string()),
        inputs_with_plan_refs().prop_map(|v| v.to_string()),
        deep_brackets(),
    ]
    .boxed()
}

fn arbitrary_plan() -> BoxedStrategy<TaskPlan> {
    let node = (node_id(), task_type(), inputs_json(), prop::collection::vec(node_id(), 0..4)).prop_map(
        |(id, task_type, inputs_json, depends_on)| TaskNode {
            id,
            task_type,
            inputs_json,
            depends_on,
            ..TaskNode::default()
        },
    );
    (prop::collection::vec(node, 0..10), prop_oneof![Just(String::new()), node_id()])
        .prop_map(|(nodes, output_node)| TaskPlan { nodes, output_node, ..TaskPlan::default() })
        .boxed()
}

/// One node of a valid plan: its dependencies as (earlier node, through a `$ref`?, ref path),
/// its kind (0 `t.free`, 1 `t.any`, 2 `t.num`) and extra inputs without refs.
type NodeShape = (Vec<(usize, bool, usize)>, usize, Value);

const REF_PATHS: &[&str] = &["", ".value", ".rows.0", ".a.b.c"];
const PLAIN_KEYS: &str = "[a-z]{1,6}";

/// A valid plan (a DAG of known task types whose refs and dependencies point at earlier nodes),
/// with the dependencies validation must make explicit for each node.
fn valid_plan() -> BoxedStrategy<(TaskPlan, Vec<BTreeSet<String>>)> {
    let extra = json_tree(scalar(), PLAIN_KEYS.boxed());
    let shape = (prop::collection::vec((0usize..64, any::<bool>(), 0usize..4), 0..4), 0usize..3, extra);
    (prop::collection::vec(shape, 1..12), prop::option::of(0usize..64))
        .prop_map(|(shapes, output)| build_plan(shapes, output))
        .boxed()
}

fn build_plan(shapes: Vec<NodeShape>, output: Option<usize>) -> (TaskPlan, Vec<BTreeSet<String>>) {
    let count = shapes.len();
    let mut nodes = Vec::with_capacity(count);
    let mut expected = Vec::with_capacity(count);
    for (i, (deps, kind, extra)) in shapes.into_iter().enumerate() {
        // Extra keys are lowercase letters, so they never name a ref (`$ref`) or collide with the
        // `r<j>` ref inputs; `t.num` nodes take none, since an extra `x` could break the schema.
        let mut inputs = match extra {
            Value::Object(map) if kind != 2 => map,
            _ => Map::new(),
        };
        let deps = if i == 0 { Vec::new() } else { deps };
        let mut depends_on = Vec::new();
        let mut wanted = BTreeSet::new();
        for (j, (target, via_ref, path)) in deps.into_iter().enumerate() {
            let target = format!("n{}", target % i);
            if via_ref {
                let reference = format!("{target}{}", REF_PATHS[path % REF_PATHS.len()]);
                inputs.insert(format!("r{j}"), json!({ REF_KEY: reference }));
            } else {
                depends_on.push(target.clone());
            }
            wanted.insert(target);
        }
        let task_type = match kind {
            0 => "t.free",
            1 => "t.any",
            _ => {
                // `x` must be a number, or a ref (checked when it is resolved).
                let x = inputs.get("r0").cloned().unwrap_or_else(|| json!(1.5));
                inputs.insert("x".to_owned(), x);
                "t.num"
            }
        };
        nodes.push(TaskNode {
            id: format!("n{i}"),
            task_type: task_type.to_owned(),
            inputs_json: Value::Object(inputs).to_string(),
            depends_on,
            ..TaskNode::default()
        });
        expected.push(wanted);
    }
    let output_node = output.map(|o| format!("n{}", o % count)).unwrap_or_default();
    (TaskPlan { nodes, output_node, ..TaskPlan::default() }, expected)
}

/// Every node sits in exactly one non-empty group, after the groups of all its dependencies,
/// and its dependencies are sorted and deduplicated.
fn check_groups(plan: &TaskPlan, groups: &[Vec<String>]) -> Result<(), TestCaseError> {
    let mut group_of: HashMap<&str, usize> = HashMap::new();
    for (i, group) in groups.iter().enumerate() {
        prop_assert!(!group.is_empty(), "group {} is empty", i);
        for id in group {
            prop_assert!(group_of.insert(id.as_str(), i).is_none(), "node {} is in two groups", id);
        }
    }
    prop_assert_eq!(group_of.len(), plan.nodes.len());
    for node in &plan.nodes {
        let Some(&at) = group_of.get(node.id.as_str()) else {
            return Err(TestCaseError::fail(format!("node {} is in no group", node.id)));
        };
        prop_assert!(
            node.depends_on.windows(2).all(|w| w[0] < w[1]),
            "the dependencies of {} are not sorted and deduplicated: {:?}",
            node.id,
            node.depends_on
        );
        for dep in &node.depends_on {
            let before = group_of.get(dep.as_str()).copied();
            prop_assert!(
                before.is_some_and(|b| b < at),
                "node {} (group {}) depends on {} (group {:?})",
                node.id,
                at,
                dep,
                before
            );
        }
    }
    Ok(())
}

#[test]
fn arbitrary_plans_are_accepted_consistently_or_rejected_as_plan_invalid() {
    let catalog = catalog();
    proptest!(config(), |(plan in arbitrary_plan(), max_nodes in 0usize..12)| {
        match validate_plan(&plan, &catalog, max_nodes) {
            Ok(validated) => {
                prop_assert_eq!(validated.plan.nodes.len(), plan.nodes.len());
                check_groups(&validated.plan, &validated.groups)?;
            }
            Err(Error::PlanInvalid { problems }) => prop_assert!(!problems.is_empty()),
            Err(other) => return Err(TestCaseError::fail(format!("not PLAN_INVALID: {other:?}"))),
        }
    });
}

#[test]
fn generated_valid_plans_validate() {
    let catalog = catalog();
    proptest!(config(), |((plan, expected) in valid_plan())| {
        let validated = validate_plan(&plan, &catalog, DEFAULT_MAX_NODES)
            .map_err(|e| TestCaseError::fail(format!("a valid plan was rejected: {e}")))?;
        prop_assert_eq!(validated.plan.nodes.len(), plan.nodes.len());
        prop_assert_eq!(&validated.plan.output_node, &plan.output_node);
        for (node, wanted) in validated.plan.nodes.iter().zip(&expected) {
            let wanted: Vec<String> = wanted.iter().cloned().collect();
            prop_assert_eq!(&node.depends_on, &wanted, "dependencies of {}", node.id);
        }
        check_groups(&validated.plan, &validated.groups)?;
    });
}

// ---- $ref --------------------------------------------------------------------------------------

fn target_value(outputs: &BTreeMap<String, Value>, target: &RefTarget) -> Option<Value> {
    outputs.get(&target.node_id).and_then(|output| json_ref::lookup(output, &target.path)).cloned()
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn ref_targets_parse_back_to_their_text(text in prop_oneof![reference(), any_text(24)]) {
        match RefTarget::parse(&text) {
            Some(target) => {
                prop_assert!(!target.node_id.is_empty() && !target.node_id.contains('.'));
                prop_assert!(target.path.iter().all(|s| !s.is_empty() && !s.contains('.')));
                let mut back = target.node_id.clone();
                for segment in &target.path {
                    back.push('.');
                    back.push_str(segment);
                }
                prop_assert_eq!(back, text);
            }
            // Rejected only for an empty node id or an empty path segment.
            None => prop_assert!(text.split('.').any(str::is_empty), "{:?} was rejected", text),
        }
    }

    #[test]
    fn collected_refs_point_at_their_ref_objects(value in any_json()) {
        for (pointer, reference) in json_ref::collect_refs(&value) {
            let Some(at) = value.pointer(&pointer) else {
                return Err(TestCaseError::fail(format!("pointer {pointer:?} of a ref leads nowhere")));
            };
            prop_assert_eq!(json_ref::as_ref(at), Some(reference.as_str()));
        }
    }

    #[test]
    fn resolve_agrees_with_lookup_and_map_refs(
        value in any_json(),
        outputs in prop::collection::btree_map(select_owned(REF_NODES), output_json(), 0..4),
    ) {
        let output_of = |id: &str| outputs.get(id).cloned();
        let replace = |target: &RefTarget| target_value(&outputs, target);
        let refs = json_ref::collect_refs(&value);
        match json_ref::resolve(&value, &output_of) {
            Ok(resolved) => {
                for (pointer, reference) in &refs {
                    let Some(target) = RefTarget::parse(reference) else {
                        let message = format!("resolve accepted the malformed $ref {reference:?}");
                        return Err(TestCaseError::fail(message));
                    };
                    let expected = target_value(&outputs, &target);
                    prop_assert!(expected.is_some(), "resolve accepted the unresolvable {:?}", reference);
                    prop_assert_eq!(resolved.pointer(pointer), expected.as_ref());
                }
                prop_assert_eq!(json_ref::map_refs(&value, &replace), resolved);
            }
            Err(_) => prop_assert!(
                refs.iter()
                    .any(|(_, r)| RefTarget::parse(r).and_then(|t| target_value(&outputs, &t)).is_none()),
                "resolve failed although every ref resolves"
            ),
        }
    }

    #[test]
    fn map_refs_without_replacements_changes_nothing(value in any_json()) {
        let keep = |_: &RefTarget| -> Option<Value> { None };
        prop_assert_eq!(json_ref::map_refs(&value, &keep), value);
    }

    #[test]
    fn lookup_never_panics(
        value in output_json(),
        path in prop::collection::vec(select_owned(SEGMENTS), 0..5),
    ) {
        let _ = json_ref::lookup(&value, &path);
    }
}

// ---- artifact stubs, ids and redaction ----------------------------------------------------------

/// Objects with an `$artifact` key anywhere in `value`.
fn artifact_objects(value: &Value) -> usize {
    match value {
        Value::Object(map) => {
            usize::from(map.contains_key(ARTIFACT_KEY)) + map.values().map(artifact_objects).sum::<usize>()
        }
        Value::Array(items) => items.iter().map(artifact_objects).sum(),
        _ => 0,
    }
}

const ID_PIECES: &[&str] = &["a", "Z", "0", "_", "-", ".", "..", "*", ">", "/", " ", "\0", "\n", "é", "🦀"];
const ID_SHAPES: &[IdShape] = &[IdShape::Word, IdShape::Dotted, IdShape::Printable];

/// Secret key names in the spellings models and clients use.
const SECRET_PREFIXES: &[&str] = &["", "x_", "client-", "X-", "my "];
const SECRET_NAMES: &[&str] = &[
    "api_key",
    "apiKey",
    "API-KEY",
    "token",
    "password",
    "passwd",
    "secret",
    "authorization",
    "credential",
    "private_key",
    "cookie",
    "bearer",
    "access_token",
];
const SECRET_SUFFIXES: &[&str] = &["", "_value", "Id", "-1", ".v2"];

fn secret_key() -> BoxedStrategy<String> {
    (
        prop::sample::select(SECRET_PREFIXES),
        prop::sample::select(SECRET_NAMES),
        prop::sample::select(SECRET_SUFFIXES),
        any::<bool>(),
    )
        .prop_map(|(prefix, name, suffix, upper)| {
            let key = format!("{prefix}{name}{suffix}");
            if upper { key.to_uppercase() } else { key }
        })
        .boxed()
}

fn is_scalar(value: &Value) -> bool {
    matches!(value, Value::Null | Value::Bool(_) | Value::Number(_))
}

/// `after` is `before` redacted: same keys and lengths, numbers kept, non-scalar values under
/// secret keys replaced by the marker.
fn same_shape(before: &Value, after: &Value) -> bool {
    match (before, after) {
        (Value::Object(a), Value::Object(b)) => {
            a.len() == b.len()
                && a.iter().all(|(k, v)| {
                    b.get(k).is_some_and(|w| {
                        if redact::is_secret_key(k) && !is_scalar(v) {
                            w.as_str() == Some(redact::REDACTED)
                        } else {
                            same_shape(v, w)
                        }
                    })
                })
        }
        (Value::Array(a), Value::Array(b)) => {
            a.len() == b.len() && a.iter().zip(b).all(|(v, w)| same_shape(v, w))
        }
        (Value::String(_), Value::String(_)) => true,
        (a, b) => a == b,
    }
}

fn events_carrying(text: &str) -> Vec<Event> {
    let error = Some(hermes_proto::Error { message: text.to_owned(), ..Default::default() });
    let plan = Some(TaskPlan {
        nodes: vec![TaskNode { inputs_json: text.to_owned(), ..TaskNode::default() }],
        ..TaskPlan::default()
    });
    let kinds = [
        Kind::TaskSucceeded(hermes_proto::TaskSucceeded {
            output_json: text.to_owned(),
            ..Default::default()
        }),
        Kind::GoalCompleted(hermes_proto::GoalCompleted { output_json: text.to_owned() }),
        Kind::ToolCalled(hermes_proto::ToolCalled { arguments_json: text.to_owned(), ..Default::default() }),
        Kind::ApprovalRequired(hermes_proto::ApprovalRequired {
            arguments_json: text.to_owned(),
            ..Default::default()
        }),
        Kind::ApprovalDecided(hermes_proto::ApprovalDecided { note: text.to_owned(), ..Default::default() }),
        Kind::TaskFailed(hermes_proto::TaskFailed { error: error.clone(), ..Default::default() }),
        Kind::GoalFailed(hermes_proto::GoalFailed { error }),
        Kind::PlanCreated(hermes_proto::PlanCreated { plan, ..Default::default() }),
    ];
    kinds
        .into_iter()
        .map(|kind| Event {
            seq: 0,
            session_id: String::new(),
            goal_id: "g".into(),
            at_unix_ms: 1,
            kind: Some(kind),
            tenant: String::new(),
        })
        .collect()
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn artifact_stubs_name_their_artifact(
        reference in any_text(20),
        path in prop::collection::vec(any_text(6), 0..4),
        value in any_json(),
    ) {
        let at = artifacts::stub_at(&reference, &path);
        prop_assert_eq!(artifacts::stub_reference(&at), Some(reference.as_str()));
        let info = ArtifactInfo {
            reference: reference.clone(),
            content_type: "application/json".into(),
            size_bytes: 7,
            goal_id: "g".into(),
            created_unix_ms: 1,
            expires_unix_ms: 0,
            preview: "p".into(),
            tenant: String::new(),
        };
        let stub = artifacts::stub(&info);
        prop_assert_eq!(artifacts::stub_reference(&stub), Some(reference.as_str()));
        if let Some(named) = artifacts::stub_reference(&value) {
            prop_assert_eq!(value.get(ARTIFACT_KEY).and_then(Value::as_str), Some(named));
        }
    }

    #[test]
    fn stub_pointers_find_every_artifact_key(value in any_json()) {
        let pointers = artifacts::stub_pointers(&value);
        prop_assert_eq!(pointers.len(), artifact_objects(&value));
        for pointer in &pointers {
            // The root is reported as `/` (for messages), which RFC 6901 reads as the key "".
            let at = if pointer == "/" && value.get(ARTIFACT_KEY).is_some() {
                Some(&value)
            } else {
                value.pointer(pointer)
            };
            prop_assert!(
                at.and_then(Value::as_object).is_some_and(|map| map.contains_key(ARTIFACT_KEY)),
                "pointer {:?} is not at an `$artifact` object",
                pointer
            );
        }
    }

    #[test]
    fn id_checks_accept_exactly_their_shape(
        value in prop_oneof![token_text(ID_PIECES, 12), any_text(20)],
        max_len in 0usize..16,
        shape in prop::sample::select(ID_SHAPES),
    ) {
        let word = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
        let fits = !value.is_empty()
            && value.len() <= max_len
            && match shape {
                IdShape::Word => value.chars().all(word),
                IdShape::Dotted => value.split('.').all(|s| !s.is_empty() && s.chars().all(word)),
                IdShape::Printable => !value.chars().any(char::is_control),
            };
        match check_id("some_field", &value, max_len, shape) {
            Ok(()) => prop_assert!(fits, "{:?} was accepted as {:?}", value, shape),
            Err(e) => {
                prop_assert!(!fits, "{:?} was refused as {:?}: {}", value, shape, e);
                prop_assert_eq!(e.code(), ErrorCode::InvalidArgument);
                prop_assert!(e.to_string().contains("some_field"), "the field is not named: {}", e);
            }
        }
    }

    #[test]
    fn redaction_never_panics_and_keeps_the_shape(
        text in prop_oneof![token_text(TEXT_TOKENS, 16), any_text(48)],
        value in any_json(),
    ) {
        let _ = redact::redact_text(&text);
        let _ = redact::redact_json_text(&text);
        let _ = redact::is_secret_key(&text);
        let redacted = redact::redact(&value);
        prop_assert!(same_shape(&value, &redacted), "{} redacted to {}", value, redacted);
        let _ = redact::redact_json_text(&value.to_string());
        for event in events_carrying(&text) {
            let _ = redact::event(&event);
        }
    }

    #[test]
    fn values_under_secret_keys_and_bearer_credentials_are_redacted(
        key in secret_key(),
        secret in "[A-Za-z0-9]{8,24}",
        prefix in prop_oneof![token_text(TEXT_TOKENS, 6), any_text(12)],
        suffix in prop_oneof![token_text(TEXT_TOKENS, 6), any_text(12)],
    ) {
        prop_assert!(redact::is_secret_key(&key), "{:?} is not taken for a secret key", key);
        let mut inner = Map::new();
        inner.insert(key.clone(), Value::String(secret.clone()));
        let mut object = inner.clone();
        object.insert("nested".to_owned(), Value::Array(vec![Value::Object(inner)]));
        let redacted = redact::redact(&Value::Object(object));
        prop_assert_eq!(redacted[key.as_str()].as_str(), Some(redact::REDACTED));
        prop_assert_eq!(redacted["nested"][0][key.as_str()].as_str(), Some(redact::REDACTED));

        let text = format!("{prefix} Bearer {secret} {suffix}");
        let redacted = redact::redact_text(&text);
        prop_assert!(!redacted.contains(&format!("Bearer {secret}")), "{:?} -> {:?}", text, redacted);
    }
}
