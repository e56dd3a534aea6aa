//! Bounded property-based fuzzing of the wire contract. Every message type that is decoded from
//! bytes another process wrote (the JetStream streams, core NATS subjects, KV buckets and memory
//! RPCs, listed in `decode_every_bus_type`):
//!
//! * decodes arbitrary bytes without panicking: random bytes, well-formed protobuf fields with
//!   random numbers, wire types and nesting, groups nested thousands deep, and truncated or
//!   bit-flipped encodings of real messages;
//! * when it decodes, re-encodes to bytes of the announced length that decode to the same message;
//!
//! and generated messages of the main types round-trip through encode and decode.
//!
//! Each property runs `HERMES_FUZZ_CASES` cases (default 256, what `make test` runs; `make fuzz`
//! runs 20000). Failures are not persisted to a file: proptest prints the shrunk input, and a
//! crash it finds must be added as a plain regression `#[test]`.

use hermes_proto as pb;
use hermes_test_util::fuzz::{any_text, config};
use proptest::prelude::*;
use prost::Message;

// ---- decoding arbitrary bytes -----------------------------------------------------------------

/// Decoding `bytes` as `M` does not panic; a message that decodes re-encodes to `encoded_len`
/// bytes that decode to the same message.
fn check_decode<M: Message + Default + PartialEq + std::fmt::Debug>(
    bytes: &[u8],
) -> Result<(), TestCaseError> {
    let name = std::any::type_name::<M>();
    let Ok(first) = M::decode(bytes) else { return Ok(()) };
    let encoded = first.encode_to_vec();
    prop_assert_eq!(encoded.len(), first.encoded_len(), "{}: encoded_len is not the encoded length", name);
    let second = M::decode(encoded.as_slice())
        .map_err(|e| TestCaseError::fail(format!("{name}: a re-encoded message does not decode: {e}")))?;
    if format!("{first:?}").contains("NaN") {
        // A NaN double is unequal to itself; the encodings still agree in size.
        prop_assert_eq!(second.encoded_len(), encoded.len(), "{} changed in a re-decode", name);
    } else {
        prop_assert_eq!(&second, &first, "{} changed in a re-decode", name);
    }
    Ok(())
}

/// Every message type a Hermes process decodes from bytes another process wrote.
fn decode_every_bus_type(bytes: &[u8]) -> Result<(), TestCaseError> {
    // JetStream streams: tasks, results, plan requests and results, events (and the DLQ, which
    // holds copies of all of them).
    check_decode::<pb::TaskMessage>(bytes)?;
    check_decode::<pb::TaskResult>(bytes)?;
    check_decode::<pb::PlanRequest>(bytes)?;
    check_decode::<pb::PlanResult>(bytes)?;
    check_decode::<pb::Event>(bytes)?;
    // Core NATS: heartbeats, offline notices, routing and the catalogue.
    check_decode::<pb::AgentHeartbeat>(bytes)?;
    check_decode::<pb::AgentOffline>(bytes)?;
    check_decode::<pb::RouteRequest>(bytes)?;
    check_decode::<pb::RouteReply>(bytes)?;
    check_decode::<pb::CatalogRequest>(bytes)?;
    check_decode::<pb::CatalogReply>(bytes)?;
    // KV buckets: goal state, approvals, agents, sessions, vectors.
    check_decode::<pb::GoalState>(bytes)?;
    check_decode::<pb::Approval>(bytes)?;
    check_decode::<pb::SessionState>(bytes)?;
    check_decode::<pb::StoredDoc>(bytes)?;
    check_decode::<pb::CollectionInfo>(bytes)?;
    // Memory RPCs over NATS request/reply.
    check_decode::<pb::ContextRequest>(bytes)?;
    check_decode::<pb::ContextReply>(bytes)?;
    check_decode::<pb::AppendTurnRequest>(bytes)?;
    check_decode::<pb::SessionRequest>(bytes)?;
    check_decode::<pb::UpsertRequest>(bytes)?;
    check_decode::<pb::UpsertReply>(bytes)?;
    check_decode::<pb::SearchRequest>(bytes)?;
    check_decode::<pb::SearchReply>(bytes)?;
    check_decode::<pb::GetDocRequest>(bytes)?;
    check_decode::<pb::MemoryDoc>(bytes)?;
    check_decode::<pb::ListCollectionsRequest>(bytes)?;
    check_decode::<pb::ListCollectionsReply>(bytes)?;
    Ok(())
}

/// One protobuf field, well-formed or not.
#[derive(Debug, Clone)]
enum Field {
    Varint(u32, u64),
    Fixed64(u32, u64),
    Fixed32(u32, u32),
    Bytes(u32, Vec<u8>),
    /// A length-delimited field holding more fields: a submessage, if the number says so.
    Nested(u32, Vec<Field>),
    /// The deprecated group wire types (start 3, end 4) around more fields.
    Group(u32, Vec<Field>),
    /// Bytes as they are, which may break the framing.
    Raw(Vec<u8>),
}

fn put_varint(mut value: u64, out: &mut Vec<u8>) {
    while value >= 0x80 {
        out.push(((value & 0x7f) as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn put_key(number: u32, wire_type: u64, out: &mut Vec<u8>) {
    put_varint((u64::from(number) << 3) | wire_type, out);
}

fn encode_fields(fields: &[Field], out: &mut Vec<u8>) {
    for field in fields {
        match field {
            Field::Varint(n, v) => {
                put_key(*n, 0, out);
                put_varint(*v, out);
            }
            Field::Fixed64(n, v) => {
                put_key(*n, 1, out);
                out.extend_from_slice(&v.to_le_bytes());
            }
            Field::Bytes(n, bytes) => {
                put_key(*n, 2, out);
                put_varint(bytes.len() as u64, out);
                out.extend_from_slice(bytes);
            }
            Field::Nested(n, inner) => {
                let mut body = Vec::new();
                encode_fields(inner, &mut body);
                put_key(*n, 2, out);
                put_varint(body.len() as u64, out);
                out.extend_from_slice(&body);
            }
            Field::Group(n, inner) => {
                put_key(*n, 3, out);
                encode_fields(inner, out);
                put_key(*n, 4, out);
            }
            Field::Fixed32(n, v) => {
                put_key(*n, 5, out);
                out.extend_from_slice(&v.to_le_bytes());
            }
            Field::Raw(bytes) => out.extend_from_slice(bytes),
        }
    }
}

/// Mostly the numbers real messages use, sometimes 0 (invalid) or anything.
fn field_number() -> BoxedStrategy<u32> {
    prop_oneof![8 => 1u32..=30, 1 => Just(0u32), 1 => any::<u32>()].boxed()
}

fn varint_value() -> BoxedStrategy<u64> {
    prop_oneof![
        4 => 0u64..300,
        2 => any::<u64>(),
        1 => Just(u64::MAX),
        1 => Just(u64::from(u32::MAX) + 1),
        1 => Just(i64::MIN as u64),
    ]
    .boxed()
}

fn payload() -> BoxedStrategy<Vec<u8>> {
    prop_oneof![prop::collection::vec(any::<u8>(), 0..24), any_text(12).prop_map(String::into_bytes)].boxed()
}

fn fields() -> BoxedStrategy<Vec<Field>> {
    let leaf = prop_oneof![
        (field_number(), varint_value()).prop_map(|(n, v)| Field::Varint(n, v)),
        (field_number(), any::<u64>()).prop_map(|(n, v)| Field::Fixed64(n, v)),
        (field_number(), any::<u32>()).prop_map(|(n, v)| Field::Fixed32(n, v)),
        (field_number(), payload()).prop_map(|(n, bytes)| Field::Bytes(n, bytes)),
        prop::collection::vec(any::<u8>(), 1..6).prop_map(Field::Raw),
    ];
    let field = leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            4 => (field_number(), prop::collection::vec(inner.clone(), 0..6))
                .prop_map(|(n, fields)| Field::Nested(n, fields)),
            1 => (field_number(), prop::collection::vec(inner, 0..4))
                .prop_map(|(n, fields)| Field::Group(n, fields)),
        ]
    });
    prop::collection::vec(field, 0..12).boxed()
}

/// The same submessage or group field nested `depth` times: past prost's recursion limit.
fn deep_nesting(number: u32, depth: usize, group: bool) -> Vec<u8> {
    let mut out = Vec::new();
    if group {
        for _ in 0..depth {
            put_key(number, 3, &mut out);
        }
        for _ in 0..depth {
            put_key(number, 4, &mut out);
        }
    } else {
        for _ in 0..depth {
            let mut outer = Vec::new();
            put_key(number, 2, &mut outer);
            put_varint(out.len() as u64, &mut outer);
            outer.extend_from_slice(&out);
            out = outer;
        }
    }
    out
}

fn wire_bytes() -> BoxedStrategy<Vec<u8>> {
    prop_oneof![
        3 => prop::collection::vec(any::<u8>(), 0..512),
        6 => fields().prop_map(|fields| {
            let mut out = Vec::new();
            encode_fields(&fields, &mut out);
            out
        }),
        1 => (1u32..=12, 1usize..3000, any::<bool>())
            .prop_map(|(n, depth, group)| deep_nesting(n, depth, group)),
    ]
    .boxed()
}

// ---- generated messages -------------------------------------------------------------------------

fn text() -> BoxedStrategy<String> {
    prop_oneof![3 => "[a-z0-9._-]{0,12}", 1 => any_text(16)].boxed()
}

fn texts() -> BoxedStrategy<Vec<String>> {
    prop::collection::vec(text(), 0..4).boxed()
}

/// Doubles without NaN (which is unequal to itself).
fn double() -> BoxedStrategy<f64> {
    prop_oneof![
        Just(0.0),
        Just(f64::INFINITY),
        Just(f64::NEG_INFINITY),
        Just(f64::MIN_POSITIVE),
        Just(f64::MAX),
        -1.0e12f64..1.0e12f64,
    ]
    .boxed()
}

fn wire_error() -> BoxedStrategy<pb::Error> {
    (text(), text(), any::<bool>(), text())
        .prop_map(|(code, message, retryable, node_id)| pb::Error { code, message, retryable, node_id })
        .boxed()
}

fn token_usage() -> BoxedStrategy<pb::TokenUsage> {
    (any::<u64>(), any::<u64>())
        .prop_map(|(input_tokens, output_tokens)| pb::TokenUsage { input_tokens, output_tokens })
        .boxed()
}

fn task_message() -> BoxedStrategy<pb::TaskMessage> {
    (
        (text(), text(), text(), any::<u32>()),
        (text(), text(), any::<u64>(), texts(), text()),
        (text(), text(), text()),
    )
        .prop_map(
            |(
                (goal_id, node_id, task_id, attempt),
                (task_type, inputs_json, deadline_unix_ms, memory_refs, session_id),
                (result_token, tenant, memory_token),
            )| pb::TaskMessage {
                goal_id,
                node_id,
                task_id,
                attempt,
                task_type,
                inputs_json,
                deadline_unix_ms,
                memory_refs,
                session_id,
                result_token,
                secret_inputs: Vec::new(),
                tenant,
                memory_token,
            },
        )
        .boxed()
}

fn task_result() -> BoxedStrategy<pb::TaskResult> {
    (
        (text(), text(), text(), any::<u32>()),
        (any::<i32>(), text(), prop::option::of(wire_error()), any::<u64>()),
        (text(), prop::option::of(token_usage()), text(), any::<u64>()),
        text(),
    )
        .prop_map(
            |(
                (goal_id, node_id, task_id, attempt),
                (status, output_json, error, elapsed_ms),
                (agent_id, tokens, memory_ref, started_unix_ms),
                result_token,
            )| pb::TaskResult {
                task_type: result_token.chars().rev().collect(),
                goal_id,
                node_id,
                task_id,
                attempt,
                status,
                output_json,
                error,
                elapsed_ms,
                agent_id,
                tokens,
                memory_ref,
                started_unix_ms,
                result_token,
                routed: false,
                cached: elapsed_ms % 2 == 0,
                cached_age_ms: started_unix_ms,
            },
        )
        .boxed()
}

fn task_node() -> BoxedStrategy<pb::TaskNode> {
    ((text(), text(), text(), texts()), (any::<u32>(), any::<u64>(), texts(), texts(), text()))
        .prop_map(
            |((id, task_type, inputs_json, depends_on), (max_retries, timeout_ms, tags, tools, model))| {
                pb::TaskNode {
                    id,
                    task_type,
                    inputs_json,
                    depends_on,
                    max_retries,
                    timeout_ms,
                    tags,
                    tools,
                    model,
                    secret_inputs: Vec::new(),
                }
            },
        )
        .boxed()
}

fn task_plan() -> BoxedStrategy<pb::TaskPlan> {
    (prop::collection::vec(task_node(), 0..4), text(), text())
        .prop_map(|(nodes, reasoning, output_node)| pb::TaskPlan { nodes, reasoning, output_node })
        .boxed()
}

fn tool_spec() -> BoxedStrategy<pb::ToolSpec> {
    (text(), text(), text(), any::<bool>(), any::<bool>())
        .prop_map(|(name, description, params_schema_json, side_effects, require_confirm)| pb::ToolSpec {
            name,
            description,
            params_schema_json,
            side_effects,
            require_confirm,
        })
        .boxed()
}

fn heartbeat() -> BoxedStrategy<pb::AgentHeartbeat> {
    (
        (text(), text(), texts(), prop::collection::vec(tool_spec(), 0..3), texts()),
        (any::<u32>(), any::<u32>(), text(), text(), any::<u64>()),
        (double(), double(), any::<u64>(), any::<bool>(), any::<bool>()),
    )
        .prop_map(
            |(
                (agent_id, pool, task_types, tools, tags),
                (in_flight, max_concurrency, model, version, started_unix_ms),
                (success_rate, latency_ms, sent_unix_ms, deregister, draining),
            )| pb::AgentHeartbeat {
                agent_id,
                pool,
                task_types,
                tools,
                tags,
                in_flight,
                max_concurrency,
                model,
                version,
                started_unix_ms,
                success_rate,
                latency_ms,
                sent_unix_ms,
                deregister,
                draining,
                heartbeat_period_ms: sent_unix_ms.rotate_left(7),
                backlogged: in_flight % 2 == 1,
            },
        )
        .boxed()
}

fn event() -> BoxedStrategy<pb::Event> {
    use pb::event::Kind;
    let kind = prop_oneof![
        ((text(), text(), any::<u32>(), text()), (text(), text(), double(), text())).prop_map(
            |((node_id, task_id, attempt, task_type), (subject, agent_id, score, reason))| {
                Kind::TaskDispatched(pb::TaskDispatched {
                    node_id,
                    task_id,
                    attempt,
                    task_type,
                    subject,
                    agent_id,
                    score,
                    reason,
                })
            }
        ),
        (text(), text(), any::<u32>(), text(), any::<u64>(), text()).prop_map(
            |(node_id, task_id, attempt, agent_id, elapsed_ms, output_json)| {
                Kind::TaskSucceeded(pb::TaskSucceeded {
                    node_id,
                    task_id,
                    attempt,
                    agent_id,
                    elapsed_ms,
                    output_json,
                    cached: attempt % 2 == 1,
                    cached_age_ms: elapsed_ms,
                })
            }
        ),
        (text(), text(), any::<u32>(), text(), any::<u64>(), prop::option::of(wire_error())).prop_map(
            |(node_id, task_id, attempt, agent_id, elapsed_ms, error)| {
                Kind::TaskFailed(pb::TaskFailed { node_id, task_id, attempt, agent_id, elapsed_ms, error })
            }
        ),
        text().prop_map(|output_json| Kind::GoalCompleted(pb::GoalCompleted { output_json })),
        (text(), any::<bool>(), text(), any::<bool>()).prop_map(|(call_id, approved, note, timed_out)| {
            Kind::ApprovalDecided(pb::ApprovalDecided { call_id, approved, note, timed_out })
        }),
        (prop::option::of(task_plan()), prop::collection::vec(texts(), 0..3), texts()).prop_map(
            |(plan, groups, repairs)| {
                Kind::PlanCreated(pb::PlanCreated {
                    plan,
                    groups: groups.into_iter().map(|node_ids| pb::ParallelGroup { node_ids }).collect(),
                    repairs,
                })
            }
        ),
    ];
    (text(), any::<u64>(), prop::option::of(kind), any::<u64>())
        .prop_map(|(goal_id, at_unix_ms, kind, seq)| pb::Event {
            goal_id,
            at_unix_ms,
            kind,
            seq,
            session_id: String::new(),
            tenant: String::new(),
        })
        .boxed()
}

fn plan_request() -> BoxedStrategy<pb::PlanRequest> {
    let completed = (text(), text(), text()).prop_map(|(node_id, task_type, output_summary)| {
        pb::CompletedNode { node_id, task_type, output_summary }
    });
    let replan = (
        prop::option::of(task_plan()),
        text(),
        prop::option::of(wire_error()),
        prop::collection::vec(wire_error(), 0..3),
        prop::collection::vec(completed, 0..3),
    )
        .prop_map(|(current_plan, failed_node_id, error, previous_errors, completed)| {
            pb::ReplanContext { current_plan, failed_node_id, error, previous_errors, completed }
        });
    (text(), text(), text(), text(), prop::option::of(replan))
        .prop_map(|(goal_id, request_id, goal_text, session_id, replan)| pb::PlanRequest {
            goal_id,
            request_id,
            goal_text,
            session_id,
            replan,
            tenant: String::new(),
        })
        .boxed()
}

fn plan_result() -> BoxedStrategy<pb::PlanResult> {
    use pb::plan_result::Outcome;
    let outcome = prop_oneof![
        task_plan().prop_map(Outcome::Plan),
        text().prop_map(Outcome::NeedsInput),
        wire_error().prop_map(Outcome::Error),
    ];
    let exchange = (text(), text(), text(), text(), prop::option::of(token_usage())).prop_map(
        |(purpose, request_digest, content, model, tokens)| pb::ModelExchange {
            purpose,
            request_digest,
            content,
            model,
            tokens,
            ..Default::default()
        },
    );
    (
        text(),
        text(),
        prop::option::of(outcome),
        prop::option::of(token_usage()),
        any::<u32>(),
        texts(),
        prop::collection::vec(exchange, 0..3),
    )
        .prop_map(|(goal_id, request_id, outcome, tokens, corrections, repairs, exchanges)| pb::PlanResult {
            goal_id,
            request_id,
            outcome,
            tokens,
            corrections,
            repairs,
            exchanges,
        })
        .boxed()
}

fn approval() -> BoxedStrategy<pb::Approval> {
    let decision = (any::<bool>(), text(), any::<u64>(), any::<bool>()).prop_map(
        |(approved, note, decided_unix_ms, timed_out)| pb::ApprovalDecision {
            approved,
            note,
            decided_unix_ms,
            timed_out,
        },
    );
    ((text(), text(), text(), text()), (text(), text(), any::<u64>(), prop::option::of(decision)))
        .prop_map(
            |((call_id, goal_id, node_id, tool), (arguments_json, reason, expires_unix_ms, decision))| {
                pb::Approval {
                    call_id,
                    goal_id,
                    node_id,
                    tool,
                    arguments_json,
                    reason,
                    expires_unix_ms,
                    decision,
                }
            },
        )
        .boxed()
}

/// `message` encodes to `encoded_len` bytes that decode to it.
fn round_trip<M: Message + Default + PartialEq + std::fmt::Debug>(message: &M) -> Result<(), TestCaseError> {
    let bytes = message.encode_to_vec();
    prop_assert_eq!(bytes.len(), message.encoded_len());
    let decoded = M::decode(bytes.as_slice())
        .map_err(|e| TestCaseError::fail(format!("{}: does not decode: {e}", std::any::type_name::<M>())))?;
    prop_assert_eq!(&decoded, message);
    Ok(())
}

/// The encoding of one generated message of a main type.
fn encoded_message() -> BoxedStrategy<Vec<u8>> {
    prop_oneof![
        task_message().prop_map(|m| m.encode_to_vec()),
        task_result().prop_map(|m| m.encode_to_vec()),
        heartbeat().prop_map(|m| m.encode_to_vec()),
        event().prop_map(|m| m.encode_to_vec()),
        plan_request().prop_map(|m| m.encode_to_vec()),
        plan_result().prop_map(|m| m.encode_to_vec()),
        approval().prop_map(|m| m.encode_to_vec()),
    ]
    .boxed()
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn every_bus_type_decodes_arbitrary_bytes_without_panicking(bytes in wire_bytes()) {
        decode_every_bus_type(&bytes)?;
    }

    #[test]
    fn truncated_and_corrupted_messages_decode_without_panicking(
        bytes in encoded_message(),
        cut in any::<prop::sample::Index>(),
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4),
    ) {
        let mut corrupted = bytes.clone();
        if !corrupted.is_empty() {
            for (at, mask) in &flips {
                let i = at.index(corrupted.len());
                corrupted[i] ^= mask;
            }
        }
        decode_every_bus_type(&corrupted)?;
        decode_every_bus_type(&bytes[..cut.index(bytes.len() + 1)])?;
    }

    #[test]
    fn task_messages_round_trip(message in task_message()) {
        round_trip(&message)?;
    }

    #[test]
    fn task_results_round_trip(message in task_result()) {
        round_trip(&message)?;
    }

    #[test]
    fn heartbeats_round_trip(message in heartbeat()) {
        round_trip(&message)?;
    }

    #[test]
    fn events_round_trip(message in event()) {
        round_trip(&message)?;
    }

    #[test]
    fn plan_requests_and_results_round_trip(request in plan_request(), result in plan_result()) {
        round_trip(&request)?;
        round_trip(&result)?;
    }

    #[test]
    fn approvals_round_trip(message in approval()) {
        round_trip(&message)?;
    }
}
