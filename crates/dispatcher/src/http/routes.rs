//! The table of the HTTP API's routes: the router (`super::router`) and the OpenAPI document
//! (`super::openapi`) are both built from [`ROUTES`], so they cannot drift. This file depends on
//! neither: it names each route's handler by id and its bodies and queries by type.

use serde_json::{Map, Value, json};

use super::{
    AuditQuery, DeliveriesQuery, EventsQuery, LimitQuery, ListQuery, ReasonBody, SubmitBody, WebhookBody,
};

/// The JSON Schema of a serde type, its definitions moved into `defs` (OpenAPI components).
pub(super) fn schema_of<T: schemars::JsonSchema>(defs: &mut Map<String, Value>) -> Value {
    let mut schema = serde_json::to_value(schemars::schema_for!(T)).unwrap_or(Value::Null);
    if let Some(Value::Object(found)) = schema.as_object_mut().and_then(|s| s.remove("$defs")) {
        for (name, mut def) in found {
            rewrite_refs(&mut def);
            defs.insert(name, def);
        }
    }
    if let Some(object) = schema.as_object_mut() {
        object.remove("$schema");
        object.remove("title");
    }
    rewrite_refs(&mut schema);
    schema
}

fn rewrite_refs(value: &mut Value) {
    match value {
        Value::Object(object) => {
            if let Some(Value::String(r)) = object.get_mut("$ref")
                && let Some(name) = r.strip_prefix("#/$defs/")
            {
                *r = format!("#/components/schemas/{name}");
            }
            object.values_mut().for_each(rewrite_refs);
        }
        Value::Array(items) => items.iter_mut().for_each(rewrite_refs),
        _ => {}
    }
}

/// Writes a JSON Schema, adding the definitions it refers to (OpenAPI components).
pub(crate) type SchemaFn = fn(&mut serde_json::Map<String, Value>) -> Value;

/// What a route answers with.
pub(crate) enum Reply {
    /// The canonical JSON of this `hermes.v1` message (fully qualified name).
    Message(&'static str),
    /// `{<field>: [message, ...]}`.
    ListOf(&'static str, &'static str),
    /// Plain JSON of this schema.
    Json(fn() -> Value),
    EventStream,
    WebSocket,
    /// The bytes of a stored artifact, in its content type.
    Bytes,
}

/// One route of the API: the router and the OpenAPI document are both built from [`ROUTES`].
pub(crate) struct Route {
    pub method: &'static str,
    /// In axum's syntax, which is OpenAPI's: `/v1/goals/{id}`. An action (`:cancel`) is part of
    /// the last segment.
    pub path: &'static str,
    pub id: &'static str,
    pub summary: &'static str,
    pub query: Option<SchemaFn>,
    pub headers: &'static [&'static str],
    /// The schema of its JSON (or YAML) request body, if it takes one.
    pub body: Option<SchemaFn>,
    pub body_required: bool,
    pub reply: Reply,
}

fn schema<T: schemars::JsonSchema>(defs: &mut serde_json::Map<String, Value>) -> Value {
    schema_of::<T>(defs)
}

const fn route(
    method: &'static str,
    path: &'static str,
    id: &'static str,
    summary: &'static str,
    reply: Reply,
) -> Route {
    Route { method, path, id, summary, query: None, headers: &[], body: None, body_required: false, reply }
}

/// Every route. `{id}:cancel` style actions share their path with the resource (axum matches
/// whole segments), so the document lists them under that path's POST.
pub(crate) const ROUTES: &[Route] = &[
    Route {
        headers: &["Idempotency-Key"],
        body: Some(schema::<SubmitBody>),
        body_required: true,
        ..route(
            "POST",
            "/v1/goals",
            "submitGoal",
            "Submit a goal given as text or as a plan (or a bare plan file)",
            Reply::Message(".hermes.v1.Goal"),
        )
    },
    Route {
        query: Some(schema::<ListQuery>),
        ..route(
            "GET",
            "/v1/goals",
            "listGoals",
            "Goals, newest first, filtered and paged",
            Reply::ListOf("goals", ".hermes.v1.Goal"),
        )
    },
    route("GET", "/v1/goals/{id}", "getGoal", "One goal", Reply::Message(".hermes.v1.Goal")),
    Route {
        body: Some(schema::<ReasonBody>),
        ..route(
            "POST",
            "/v1/goals/{id}",
            "cancelGoal",
            "`POST /v1/goals/{id}:cancel`: cancel the goal",
            Reply::Message(".hermes.v1.Goal"),
        )
    },
    Route {
        query: Some(schema::<EventsQuery>),
        headers: &["Last-Event-ID"],
        ..route(
            "GET",
            "/v1/goals/{id}/events",
            "goalEvents",
            "The goal's events as Server-Sent Events, resumable",
            Reply::EventStream,
        )
    },
    Route {
        query: Some(schema::<EventsQuery>),
        ..route(
            "GET",
            "/v1/goals/{id}/ws",
            "goalEventsWebSocket",
            "The goal's events over a WebSocket, resumable with ?after=",
            Reply::WebSocket,
        )
    },
    route(
        "GET",
        "/v1/changes",
        "changes",
        "Goals created or changing status and approvals asked for or decided, as Server-Sent Events",
        Reply::EventStream,
    ),
    route(
        "GET",
        "/v1/approvals",
        "listApprovals",
        "Every tool call waiting for a person, across goals",
        Reply::ListOf("approvals", ".hermes.v1.Approval"),
    ),
    Route {
        body: Some(schema::<ReasonBody>),
        ..route(
            "POST",
            "/v1/approvals/{goal}/{call}",
            "decideApproval",
            "`POST .../{call}:approve` or `:deny`: decide a pending call",
            Reply::Message(".hermes.v1.ApprovalDecision"),
        )
    },
    Route {
        query: Some(schema::<LimitQuery>),
        ..route(
            "GET",
            "/v1/dead-letters",
            "listDeadLetters",
            "Dead letters",
            Reply::ListOf("deadLetters", ".hermes.v1.DeadLetter"),
        )
    },
    route(
        "GET",
        "/v1/dead-letters/{seq}",
        "getDeadLetter",
        "One dead letter",
        Reply::Message(".hermes.v1.DeadLetter"),
    ),
    route(
        "POST",
        "/v1/dead-letters/{seq}",
        "replayDeadLetter",
        "`POST /v1/dead-letters/{seq}:replay`: publish it again",
        Reply::Json(replay_schema),
    ),
    Route {
        query: Some(schema::<AuditQuery>),
        ..route(
            "GET",
            "/v1/audit",
            "listAudit",
            "The audit trail of the caller's tenant, oldest first (operators): who submitted, cancelled, approved, denied or replayed what, from where, and how it ended",
            Reply::ListOf("records", ".hermes.v1.AuditRecord"),
        )
    },
    Route {
        body: Some(schema::<WebhookBody>),
        body_required: true,
        ..route(
            "POST",
            "/v1/webhooks",
            "createWebhook",
            "Register a standing webhook endpoint for the caller's tenant; the answer holds its signing secret, this once (docs/webhooks.md)",
            Reply::Message(".hermes.v1.CreateWebhookResponse"),
        )
    },
    route(
        "GET",
        "/v1/webhooks",
        "listWebhooks",
        "The caller's tenant's standing webhook endpoints, without their secrets",
        Reply::ListOf("endpoints", ".hermes.v1.WebhookEndpoint"),
    ),
    route(
        "DELETE",
        "/v1/webhooks/{id}",
        "deleteWebhook",
        "Remove a standing webhook endpoint",
        Reply::Message(".hermes.v1.WebhookEndpoint"),
    ),
    route(
        "POST",
        "/v1/webhooks/{id}",
        "rotateWebhook",
        "`POST /v1/webhooks/{id}:rotate`: a new signing secret, shown this once; the previous one still signs beside it until the next rotation",
        Reply::Message(".hermes.v1.CreateWebhookResponse"),
    ),
    Route {
        query: Some(schema::<DeliveriesQuery>),
        ..route(
            "GET",
            "/v1/webhooks/deliveries",
            "listWebhookDeliveries",
            "Webhook deliveries of the caller's tenant's goals with every attempt, newest first",
            Reply::ListOf("deliveries", ".hermes.v1.WebhookDelivery"),
        )
    },
    route(
        "POST",
        "/v1/webhooks/deliveries/{id}",
        "resendWebhookDelivery",
        "`POST /v1/webhooks/deliveries/{id}:resend`: send a delivered or dead-lettered delivery again",
        Reply::Message(".hermes.v1.WebhookDelivery"),
    ),
    route(
        "GET",
        "/v1/goals/{id}/artifacts/{reference}",
        "getGoalArtifact",
        "An output of the goal kept by reference (an `$artifact` stub), its bytes",
        Reply::Bytes,
    ),
    route(
        "GET",
        "/v1/agents",
        "listAgents",
        "Every agent the registry knows, online or not, with its load and heartbeat",
        Reply::ListOf("agents", ".hermes.v1.AgentInfo"),
    ),
    route(
        "GET",
        "/v1/sessions",
        "listSessions",
        "Memory sessions: recent turns and the folded summary",
        Reply::ListOf("sessions", ".hermes.v1.SessionState"),
    ),
    route(
        "GET",
        "/v1/sessions/{id}",
        "getSession",
        "One memory session",
        Reply::Message(".hermes.v1.SessionState"),
    ),
    route("GET", "/v1/openapi.json", "openapi", "This document", Reply::Json(|| json!({"type": "object"}))),
    route(
        "GET",
        "/.well-known/agent-card.json",
        "a2aAgentCard",
        "The A2A 1.0 agent card: skills from the agents online now (docs/a2a.md)",
        Reply::Json(|| json!({"type": "object", "description": "an A2A 1.0 AgentCard"})),
    ),
    Route {
        body: Some(jsonrpc_schema),
        body_required: true,
        headers: &["A2A-Version", "Last-Event-ID"],
        ..route(
            "POST",
            "/a2a",
            "a2aJsonRpc",
            "A2A 1.0 JSON-RPC: SendMessage, SendStreamingMessage (SSE), GetTask, CancelTask, SubscribeToTask (SSE), ListTasks",
            Reply::Json(
                || json!({"type": "object", "description": "a JSON-RPC 2.0 response, or Server-Sent Events of them"}),
            ),
        )
    },
];

fn jsonrpc_schema(_: &mut serde_json::Map<String, Value>) -> Value {
    json!({
        "type": "object",
        "required": ["jsonrpc", "method"],
        "properties": {
            "jsonrpc": {"const": "2.0"},
            "id": {"type": ["string", "integer", "null"]},
            "method": {"type": "string"},
            "params": {"type": "object"},
        },
    })
}

fn replay_schema() -> Value {
    json!({"type": "object", "properties": {"subject": {"type": "string"}, "sequence": {"type": "string"}}})
}
