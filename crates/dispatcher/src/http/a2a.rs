//! A2A v1.0 over its JSON-RPC binding, mapped onto the caller gate's operations: a task is a goal.
//!
//! - `GET /.well-known/agent-card.json`: the agent card, with one skill per task type the agents
//!   online now serve (from the live catalogue), and the JSON-RPC interface at `/a2a`.
//! - `POST /a2a`: `SendMessage`, `SendStreamingMessage`, `GetTask`, `CancelTask`,
//!   `SubscribeToTask` and `ListTasks` (and their A2A 0.3 names, `message/send`, ...; the shapes
//!   are A2A 1.0's either way). A message's text parts are a text goal, a data part holding a plan
//!   is a plan goal; its `messageId` is the goal's idempotency key, so a retried send is one goal.
//!   A message naming a task that waits on an approval decides it (`approve` or `deny <reason>`).
//! - Streams are Server-Sent Events whose `id:` is the goal's event `seq`: a fresh stream (and
//!   `SubscribeToTask`) opens with the task as it stands and goes on with every event after it;
//!   `Last-Event-ID` resumes after that event instead, with no gap and no repeat. A stream ends
//!   after a final state or `TASK_STATE_INPUT_REQUIRED`.
//!
//! The states and the rest of the mapping are in docs/a2a.md.

use std::convert::Infallible;

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use hermes_core::Error;
use hermes_core::plan_file::PlanFile;
use hermes_proto::event::Kind;
use hermes_proto::{Event, GoalSpec, GoalState};
use serde_json::{Value, json};

use super::{Api, HEARTBEAT, goal_id_arg, json_response};
use crate::a2a_view::{a2a_state, context_id, is_final, stream_responses, task_value};
use crate::gate::Caller;

/// The protocol version served, as A2A names it in the card and the `A2A-Version` header.
const PROTOCOL_VERSION: &str = "1.0";
/// Where the JSON-RPC interface is served.
pub(super) const RPC_PATH: &str = "/a2a";

// A2A's JSON-RPC error codes (A2A 1.0, section 9.5) and JSON-RPC's own.
const PARSE_ERROR: i64 = -32700;
const INVALID_REQUEST: i64 = -32600;
const METHOD_NOT_FOUND: i64 = -32601;
const INVALID_PARAMS: i64 = -32602;
const INTERNAL_ERROR: i64 = -32603;
const TASK_NOT_FOUND: i64 = -32001;
const TASK_NOT_CANCELABLE: i64 = -32002;
const PUSH_NOT_SUPPORTED: i64 = -32003;
const UNSUPPORTED_OPERATION: i64 = -32004;
const CONTENT_TYPE_NOT_SUPPORTED: i64 = -32005;
const VERSION_NOT_SUPPORTED: i64 = -32009;

/// A JSON-RPC error: its code, message and, for Hermes errors, the Hermes code and problems as
/// a `google.rpc.ErrorInfo` in `data` (how A2A 1.0 carries details).
#[derive(Debug)]
struct RpcError {
    code: i64,
    message: String,
    info: Option<(String, Vec<String>)>,
}

impl RpcError {
    fn new(code: i64, message: impl Into<String>) -> RpcError {
        RpcError { code, message: message.into(), info: None }
    }

    /// A call the caller's roles do not allow.
    fn denied(&self) -> bool {
        self.info.as_ref().is_some_and(|(code, _)| code == "DENIED")
    }

    fn invalid(message: impl Into<String>) -> RpcError {
        RpcError::new(INVALID_PARAMS, message)
    }

    fn body(&self, id: &Value) -> Value {
        let mut error = json!({"code": self.code, "message": self.message});
        if let Some((code, problems)) = &self.info {
            let mut metadata = json!({"code": code});
            if !problems.is_empty() {
                metadata["problems"] = json!(problems.join("; "));
            }
            error["data"] = json!([{
                "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                "reason": code,
                "domain": "hermes",
                "metadata": metadata,
            }]);
        }
        json!({"jsonrpc": "2.0", "id": id, "error": error})
    }
}

impl From<Error> for RpcError {
    fn from(err: Error) -> RpcError {
        use hermes_core::error::ErrorCode;
        let code = err.code();
        let problems = match &err {
            Error::PlanInvalid { problems } => problems.clone(),
            _ => Vec::new(),
        };
        let rpc = match code {
            ErrorCode::NotFound => TASK_NOT_FOUND,
            ErrorCode::InvalidArgument | ErrorCode::PlanInvalid | ErrorCode::FailedPrecondition => {
                INVALID_PARAMS
            }
            _ => INTERNAL_ERROR,
        };
        RpcError {
            code: rpc,
            message: format!("{code}: {err}"),
            info: Some((code.as_str().to_owned(), problems)),
        }
    }
}

/// `GET /.well-known/agent-card.json`. The card is public, as A2A has it; the task types of
/// the catalogue are listed only to a caller who may read (anyone with auth off), so an
/// anonymous caller learns nothing about the fleet.
pub(super) async fn agent_card(
    caller: Result<Caller, super::Problem>,
    State(api): State<Api>,
    headers: HeaderMap,
) -> Response {
    let base = base_url(&headers);
    // Only a caller who may read is shown the catalogue; the gate says who may.
    let catalogue = match &caller {
        Ok(caller) => match api.gate.catalogue(caller).await {
            Err(Error::Denied { .. }) => None,
            read => Some(read),
        },
        Err(_) => None,
    };
    let mut skills = Vec::new();
    if api.gate.plans_text_goals() {
        skills.push(json!({
            "id": "goal",
            "name": "Goal in plain words",
            "description": "A goal as text: the planner turns it into a DAG of the task types below, runs it, and answers.",
            "tags": ["planning", "orchestration"],
            "inputModes": ["text/plain"],
            "outputModes": ["application/json", "text/plain"],
        }));
    }
    skills.push(json!({
        "id": "plan",
        "name": "Run a plan",
        "description": "A data part holding a Hermes plan ({\"nodes\": [...], \"output_node\": ...}); each node runs on the best live agent for its task type.",
        "tags": ["dag", "orchestration"],
        "inputModes": ["application/json"],
        "outputModes": ["application/json"],
    }));
    if let Some(Ok(catalogue)) = &catalogue {
        for entry in catalogue.entries().iter().filter(|e| e.live_agents > 0) {
            let tool = entry.tool.clone().unwrap_or_default();
            let mut tags: Vec<String> = entry.task_type.split('.').map(str::to_owned).collect();
            if tool.side_effects {
                tags.push("side-effects".into());
            }
            if tool.require_confirm {
                tags.push("needs-approval".into());
            }
            let description = if tool.description.is_empty() {
                format!("The `{}` task type, served by {} live agent(s).", entry.task_type, entry.live_agents)
            } else {
                format!("{} (served by {} live agent(s))", tool.description, entry.live_agents)
            };
            skills.push(json!({
                "id": entry.task_type,
                "name": entry.task_type,
                "description": description,
                "tags": tags,
                "inputModes": ["application/json"],
                "outputModes": ["application/json"],
            }));
        }
    }
    let card = json!({
        "name": "Hermes",
        "description": "A distributed orchestrator for AI agents: a goal becomes a DAG of subtasks, each routed to the best live agent, and the results come back as one answer.",
        "supportedInterfaces": [{
            "url": format!("{base}{RPC_PATH}"),
            "protocolBinding": "JSONRPC",
            "protocolVersion": PROTOCOL_VERSION,
        }],
        "provider": {"organization": "Hermes", "url": base},
        "version": env!("CARGO_PKG_VERSION"),
        "documentationUrl": format!("{base}/v1/openapi.json"),
        "capabilities": {"streaming": true, "pushNotifications": true, "extendedAgentCard": false},
        "defaultInputModes": ["text/plain", "application/json"],
        "defaultOutputModes": ["application/json", "text/plain"],
        "skills": skills,
    });
    let mut card = card;
    if api.gate.auth_enabled() {
        card["securitySchemes"] = json!({"bearer": {"httpAuthSecurityScheme": {
            "scheme": "Bearer",
            "description": "A Hermes API token (docs/security.md), as `Authorization: Bearer <token>`",
        }}});
        card["securityRequirements"] = json!([{"schemes": {"bearer": {"list": []}}}]);
    }
    let mut response = json_response(StatusCode::OK, card);
    if let Some(Err(e)) = catalogue {
        // The card is still useful without the task types; say why they are missing.
        if let Ok(warning) = format!("199 hermes \"the catalogue is unavailable: {e}\"").parse() {
            response.headers_mut().insert(header::WARNING, warning);
        }
    }
    response
}

/// `http://host:port` as the client reached this server (its `Host` header).
fn base_url(headers: &HeaderMap) -> String {
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("127.0.0.1");
    let scheme = headers.get("x-forwarded-proto").and_then(|h| h.to_str().ok()).unwrap_or("http");
    format!("{scheme}://{host}")
}

/// `POST /a2a`: one JSON-RPC 2.0 request. Errors are JSON-RPC error objects with status 200, as
/// the binding wants; the streaming methods answer with an event stream.
pub(super) async fn rpc(
    caller: Result<Caller, super::Problem>,
    State(api): State<Api>,
    headers: HeaderMap,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Response {
    // Credentials are the HTTP layer's business, as A2A has them: 401 and 403, not JSON-RPC;
    // and they come first. The bus's state is checked by the gate's operations.
    let caller = match caller {
        Ok(caller) => caller,
        Err(problem) => return problem.into_response(),
    };
    let media = crate::gate::site::media_type(&headers).unwrap_or_default();
    if !matches!(media.as_str(), "application/json" | "application/a2a+json") {
        return super::Problem::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            hermes_core::error::ErrorCode::InvalidArgument,
            format!("content type `{media}` is not accepted at {RPC_PATH}: send application/json or application/a2a+json"),
        )
        .into_response();
    }
    let bytes = match super::body_bytes(&api, body) {
        Ok(bytes) => bytes,
        Err(problem) => return problem.into_response(),
    };
    let request: Value = match serde_json::from_slice(&bytes) {
        Ok(v) => v,
        Err(e) => {
            let error = RpcError::new(
                PARSE_ERROR,
                format!("malformed JSON at line {} column {}: {e}", e.line(), e.column()),
            );
            return rpc_answer(error.body(&Value::Null));
        }
    };
    let id = request.get("id").cloned().unwrap_or(Value::Null);
    match call(&api, &caller, &headers, &request).await {
        Err(error) if error.denied() => {
            super::Problem::new(StatusCode::FORBIDDEN, hermes_core::error::ErrorCode::Denied, error.message)
                .into_response()
        }
        Ok(Answer::Result(result)) => rpc_answer(json!({"jsonrpc": "2.0", "id": id, "result": result})),
        Ok(Answer::Stream(stream)) => stream_answer(&api, id, *stream),
        Err(error) => rpc_answer(error.body(&id)),
    }
}

fn rpc_answer(body: Value) -> Response {
    json_response(StatusCode::OK, body)
}

enum Answer {
    Result(Value),
    Stream(Box<TaskStream>),
}

async fn call(api: &Api, who: &Caller, headers: &HeaderMap, request: &Value) -> Result<Answer, RpcError> {
    if request.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err(RpcError::new(
            INVALID_REQUEST,
            "not a JSON-RPC 2.0 request (`\"jsonrpc\": \"2.0\"` is missing)",
        ));
    }
    if !matches!(request.get("id"), None | Some(Value::String(_) | Value::Number(_) | Value::Null)) {
        return Err(RpcError::new(INVALID_REQUEST, "`id` must be a string, a number or null"));
    }
    let Some(method) = request.get("method").and_then(Value::as_str) else {
        return Err(RpcError::new(INVALID_REQUEST, "`method` is missing or not a string"));
    };
    if let Some(version) = headers.get("a2a-version").and_then(|v| v.to_str().ok()) {
        let major_minor: Vec<&str> = version.trim().split('.').take(2).collect();
        if major_minor != ["1", "0"] && major_minor != ["1"] {
            return Err(RpcError::new(
                VERSION_NOT_SUPPORTED,
                format!("A2A-Version {version} is not served; this endpoint speaks A2A {PROTOCOL_VERSION}"),
            ));
        }
    }
    let params = request.get("params").cloned().unwrap_or_else(|| json!({}));
    if !params.is_object() {
        return Err(RpcError::invalid("`params` must be an object"));
    }
    match method {
        "SendMessage" | "message/send" => send(api, who, &params, headers, false).await,
        "SendStreamingMessage" | "message/stream" => send(api, who, &params, headers, true).await,
        "GetTask" | "tasks/get" => Ok(Answer::Result(
            task_json(api, who, &api.gate.get(who, task_id(&params)?).await?, headers).await?,
        )),
        "CancelTask" | "tasks/cancel" => cancel(api, who, &params, headers).await,
        "SubscribeToTask" | "tasks/resubscribe" => {
            let state = api.gate.get(who, task_id(&params)?).await?;
            Ok(Answer::Stream(Box::new(
                subscribe(api, who, state, base_url(headers), last_event_id(headers)?).await?,
            )))
        }
        "ListTasks" | "tasks/list" => list(api, who, &params, headers).await,
        m if m.contains("PushNotification") || m.starts_with("tasks/pushNotificationConfig") => {
            Err(RpcError::new(
                PUSH_NOT_SUPPORTED,
                "push notification configs are given with the message only (SendMessage's `configuration.pushNotificationConfig`); they cannot be set, read or removed afterwards",
            ))
        }
        "GetExtendedAgentCard" | "agent/getAuthenticatedExtendedCard" => Err(RpcError::new(
            UNSUPPORTED_OPERATION,
            "there is no extended agent card; the public card at /.well-known/agent-card.json is the whole card",
        )),
        other => Err(RpcError::new(
            METHOD_NOT_FOUND,
            format!(
                "no method `{other}`: use SendMessage, SendStreamingMessage, GetTask, CancelTask, SubscribeToTask or ListTasks"
            ),
        )),
    }
}

fn task_id(params: &Value) -> Result<&str, RpcError> {
    let id = params
        .get("id")
        .and_then(Value::as_str)
        .ok_or_else(|| RpcError::invalid("`id` (the task id) is required"))?;
    goal_id_arg(id).map_err(|_| RpcError::new(TASK_NOT_FOUND, format!("no task `{id}`")))
}

/// `SendMessage` / `SendStreamingMessage`: a new goal, the same goal again for a repeated
/// `messageId`, or a decision on the approval a task waits for.
async fn send(
    api: &Api,
    who: &Caller,
    params: &Value,
    headers: &HeaderMap,
    stream: bool,
) -> Result<Answer, RpcError> {
    let message = params
        .get("message")
        .filter(|m| m.is_object())
        .ok_or_else(|| RpcError::invalid("`message` is required"))?;
    let message_id = message.get("messageId").and_then(Value::as_str).unwrap_or("");
    if message_id.is_empty() {
        return Err(RpcError::invalid("`message.messageId` is required (it makes a retried send one task)"));
    }
    let parts = message
        .get("parts")
        .and_then(Value::as_array)
        .filter(|p| !p.is_empty())
        .ok_or_else(|| RpcError::invalid("`message.parts` must hold at least one part"))?;
    let configuration = params.get("configuration").cloned().unwrap_or_default();
    let return_immediately = configuration.get("returnImmediately").and_then(Value::as_bool).unwrap_or(false);
    let (text, plan) = read_parts(parts)?;

    let state = if let Some(task) = message.get("taskId").and_then(Value::as_str).filter(|t| !t.is_empty()) {
        let goal_id =
            goal_id_arg(task).map_err(|_| RpcError::new(TASK_NOT_FOUND, format!("no task `{task}`")))?;
        answer_approval(api, who, goal_id, &text, plan.is_some()).await?
    } else {
        let session_id = message.get("contextId").and_then(Value::as_str).unwrap_or("").to_owned();
        let spec = GoalSpec {
            text,
            plan,
            session_id,
            idempotency_key: format!("a2a:{message_id}"),
            callbacks: push_config(&configuration)?.into_iter().collect(),
            ..Default::default()
        };
        let submitted = api.gate.submit(who, spec).await?;
        api.gate.get(who, &submitted.goal_id).await?
    };
    if stream {
        return Ok(Answer::Stream(Box::new(subscribe(api, who, state, base_url(headers), None).await?)));
    }
    if return_immediately || is_final(&state) {
        return Ok(Answer::Result(json!({"task": task_json(api, who, &state, headers).await?})));
    }
    // Blocking: wait until the task is final or needs input, then answer with it.
    let mut events = std::pin::pin!(api.gate.watch(who, &state.goal_id, state.event_seq).await?);
    while let Some(event) = events.next().await {
        let event = event?;
        if matches!(event.kind, Some(Kind::ApprovalRequired(_)))
            && !already_decided(&api.gate, &state, &event).await
        {
            break;
        }
    }
    let state = api.gate.get(who, &state.goal_id).await?;
    Ok(Answer::Result(json!({"task": task_json(api, who, &state, headers).await?})))
}

/// The push-notification endpoint a send names (`configuration.pushNotificationConfig`: `url`,
/// `token`, `authentication` with a `scheme` (or 0.3's `schemes`) and `credentials`), as the
/// goal's callback in the A2A format (docs/webhooks.md).
fn push_config(configuration: &Value) -> Result<Option<hermes_proto::Callback>, RpcError> {
    let Some(config) = configuration.get("pushNotificationConfig").filter(|c| !c.is_null()) else {
        return Ok(None);
    };
    let url = config
        .get("url")
        .and_then(Value::as_str)
        .filter(|u| !u.is_empty())
        .ok_or_else(|| RpcError::invalid("`configuration.pushNotificationConfig.url` is required"))?;
    let text = |v: Option<&Value>| v.and_then(Value::as_str).unwrap_or_default().to_owned();
    let authentication = config.get("authentication");
    let scheme = authentication
        .and_then(|a| a.get("scheme").or_else(|| a.get("schemes").and_then(|s| s.get(0))))
        .and_then(Value::as_str)
        .unwrap_or("Bearer");
    let credentials = text(authentication.and_then(|a| a.get("credentials")));
    Ok(Some(hermes_proto::Callback {
        url: url.to_owned(),
        format: crate::webhooks::FORMAT_A2A.to_owned(),
        token: text(config.get("token")),
        authorization: if credentials.is_empty() { String::new() } else { format!("{scheme} {credentials}") },
        ..Default::default()
    }))
}

/// A message's text parts (joined by newlines) and its plan, from a data part holding one.
fn read_parts(parts: &[Value]) -> Result<(String, Option<hermes_proto::TaskPlan>), RpcError> {
    let mut texts = Vec::new();
    let mut plan = None;
    for (i, part) in parts.iter().enumerate() {
        if let Some(text) = part.get("text").and_then(Value::as_str) {
            texts.push(text.to_owned());
        } else if let Some(data) = part.get("data") {
            let data = data.get("plan").unwrap_or(data);
            if data.get("nodes").is_none() {
                return Err(RpcError::new(
                    CONTENT_TYPE_NOT_SUPPORTED,
                    format!(
                        "part {i}: a data part must hold a Hermes plan ({{\"nodes\": [...]}}, or {{\"plan\": {{...}}}})"
                    ),
                ));
            }
            if plan.is_some() {
                return Err(RpcError::invalid(format!("part {i}: a message holds at most one plan")));
            }
            let file: PlanFile = serde_json::from_value(data.clone())
                .map_err(|e| RpcError::invalid(format!("part {i}: not a plan: {e}")))?;
            plan = Some(file.into_plan().map_err(|e| RpcError::invalid(format!("part {i}: {e}")))?);
        } else {
            return Err(RpcError::new(
                CONTENT_TYPE_NOT_SUPPORTED,
                format!(
                    "part {i}: only text parts (a goal) and data parts (a plan) are understood; files and URLs are not"
                ),
            ));
        }
    }
    if plan.is_some() && !texts.is_empty() {
        return Err(RpcError::invalid(
            "a message is either text (a goal) or one data part (a plan), not both",
        ));
    }
    Ok((texts.join("\n"), plan))
}

/// A message on a task waiting for approval decides it: `approve`, or `deny` with an optional
/// reason after it. The task's other states take no messages.
async fn answer_approval(
    api: &Api,
    who: &Caller,
    goal_id: &str,
    text: &str,
    has_plan: bool,
) -> Result<GoalState, RpcError> {
    let state = api.gate.get(who, goal_id).await?;
    let pending = api.gate.goal_approvals(who, &state).await?;
    let Some(approval) = pending.first() else {
        let why = if is_final(&state) { "it has ended" } else { "it waits on no input" };
        return Err(RpcError::new(
            UNSUPPORTED_OPERATION,
            format!(
                "task `{goal_id}` takes no message: {why}; send a new message without taskId for a new task"
            ),
        ));
    };
    let words = text.trim();
    let (verb, rest) = words.split_once(char::is_whitespace).unwrap_or((words, ""));
    let approve = match verb.to_ascii_lowercase().as_str() {
        "approve" | "approved" | "yes" if !has_plan => true,
        "deny" | "denied" | "no" | "reject" if !has_plan => false,
        _ => {
            return Err(RpcError::invalid(format!(
                "task `{goal_id}` waits for a decision on call `{}` ({}): answer `approve` or `deny <reason>`",
                approval.call_id, approval.tool
            )));
        }
    };
    api.gate.decide(who, goal_id, &approval.call_id, approve, rest.trim()).await?;
    Ok(api.gate.get(who, goal_id).await?)
}

async fn cancel(api: &Api, who: &Caller, params: &Value, headers: &HeaderMap) -> Result<Answer, RpcError> {
    let id = task_id(params)?;
    let before = api.gate.get(who, id).await?;
    if is_final(&before) {
        return Err(RpcError::new(
            TASK_NOT_CANCELABLE,
            format!(
                "task `{id}` is already {}",
                a2a_state(&before, false).trim_start_matches("TASK_STATE_").to_lowercase()
            ),
        ));
    }
    let reason = params.pointer("/metadata/reason").and_then(Value::as_str).unwrap_or("cancelled over A2A");
    let state = api.gate.cancel(who, id, reason).await?;
    Ok(Answer::Result(task_json(api, who, &state, headers).await?))
}

async fn list(api: &Api, who: &Caller, params: &Value, headers: &HeaderMap) -> Result<Answer, RpcError> {
    let page_size = params.get("pageSize").and_then(Value::as_u64).unwrap_or(50).clamp(1, 100) as usize;
    let context = params.get("contextId").and_then(Value::as_str).filter(|c| !c.is_empty());
    let status = params.get("status").and_then(Value::as_str).filter(|s| *s != "TASK_STATE_UNSPECIFIED");
    let after = params.get("pageToken").and_then(Value::as_str).filter(|t| !t.is_empty());
    // `totalSize` counts every match, so every goal of the caller's is read (the goal index
    // finds them without reading other tenants').
    let (mut goals, _) = api.gate.list(who, Default::default(), None, usize::MAX - 1).await?;
    goals.retain(|g| context.is_none_or(|c| context_id(g) == c));
    let mut tasks = Vec::new();
    for goal in goals {
        if let Some(status) = status
            && a2a_state(&goal, false) != status
        {
            continue;
        }
        tasks.push(goal);
    }
    let total = tasks.len();
    if let Some(after) = after {
        match tasks.iter().position(|g| g.goal_id == after) {
            Some(i) => drop(tasks.drain(..=i)),
            None => return Err(RpcError::invalid("malformed or stale `pageToken`")),
        }
    }
    let more = tasks.len() > page_size;
    tasks.truncate(page_size);
    let next = if more { tasks.last().map(|g| g.goal_id.clone()).unwrap_or_default() } else { String::new() };
    let mut out = Vec::with_capacity(tasks.len());
    for goal in &tasks {
        out.push(task_json(api, who, goal, headers).await?);
    }
    Ok(Answer::Result(
        json!({"tasks": out, "nextPageToken": next, "pageSize": page_size, "totalSize": total}),
    ))
}

/// The task for a goal, as A2A 1.0 shapes it.
async fn task_json(
    api: &Api,
    who: &Caller,
    state: &GoalState,
    headers: &HeaderMap,
) -> Result<Value, RpcError> {
    let pending = if is_final(state) { Vec::new() } else { api.gate.goal_approvals(who, state).await? };
    Ok(task_value(state, &pending, &base_url(headers)))
}

/// A task's stream: the task first (unless resuming after an event), then its events.
struct TaskStream {
    first: Option<(u64, Value)>,
    state: GoalState,
    base: String,
    events: std::pin::Pin<Box<dyn futures::Stream<Item = hermes_core::Result<Event>> + Send>>,
}

/// The `Last-Event-ID` a resuming stream sent, if any.
fn last_event_id(headers: &HeaderMap) -> Result<Option<u64>, RpcError> {
    match headers.get("last-event-id") {
        Some(v) => v
            .to_str()
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .map(Some)
            .ok_or_else(|| RpcError::invalid("Last-Event-ID is not an event sequence number")),
        None => Ok(None),
    }
}

/// The task's stream: from the task as it stands, or after event `resume`.
async fn subscribe(
    api: &Api,
    who: &Caller,
    state: GoalState,
    base: String,
    resume: Option<u64>,
) -> Result<TaskStream, RpcError> {
    let (first, after) = match resume {
        Some(after) => (None, after),
        None => {
            let pending =
                if is_final(&state) { Vec::new() } else { api.gate.goal_approvals(who, &state).await? };
            (Some((state.event_seq, json!({"task": task_value(&state, &pending, &base)}))), state.event_seq)
        }
    };
    let events = api.gate.watch(who, &state.goal_id, after).await?;
    Ok(TaskStream { first, state, base, events: Box::pin(events) })
}

/// Server-Sent Events of JSON-RPC responses, each carrying one `StreamResponse`.
fn stream_answer(api: &Api, id: Value, stream: TaskStream) -> Response {
    let TaskStream { first, state, base, events } = stream;
    // Ends after a final state, or after a task snapshot already final or waiting for input.
    let done_at_start = first.as_ref().is_some_and(|(_, task)| {
        let s = task.pointer("/task/status/state").and_then(Value::as_str).unwrap_or("");
        matches!(
            s,
            "TASK_STATE_COMPLETED"
                | "TASK_STATE_FAILED"
                | "TASK_STATE_CANCELED"
                | "TASK_STATE_REJECTED"
                | "TASK_STATE_INPUT_REQUIRED"
        )
    });
    let frame = {
        let id = id.clone();
        move |seq: u64, result: Value| {
            let event =
                SseEvent::default().data(json!({"jsonrpc": "2.0", "id": id, "result": result}).to_string());
            if seq > 0 { event.id(seq.to_string()) } else { event }
        }
    };
    let head = futures::stream::iter(first.map(|(seq, task)| frame(seq, task)));
    let gate = api.gate.clone();
    let tail = futures::stream::unfold((events, false, state), move |(mut events, done, state)| {
        let (frame, id, base, gate) = (frame.clone(), id.clone(), base.clone(), gate.clone());
        async move {
            if done {
                return None;
            }
            match events.next().await? {
                Ok(event) => {
                    let decided = already_decided(&gate, &state, &event).await;
                    let (responses, end) = stream_responses(&state, &event, &base, decided);
                    let frames: Vec<SseEvent> = responses.into_iter().map(|r| frame(event.seq, r)).collect();
                    Some((frames, (events, end, state)))
                }
                Err(e) => {
                    let error = RpcError::from(e).body(&id).to_string();
                    Some((vec![SseEvent::default().event("error").data(error)], (events, true, state)))
                }
            }
        }
    })
    .flat_map(futures::stream::iter);
    let tail = if done_at_start { futures::stream::empty().boxed() } else { tail.boxed() };
    let stream = head.chain(tail).map(Ok::<_, Infallible>).take_until(api.shutdown.clone().cancelled_owned());
    Sse::new(stream).keep_alive(KeepAlive::new().interval(HEARTBEAT).text("heartbeat")).into_response()
}

/// Whether `event` asks for an approval that was decided since. Approval events carry no `seq`,
/// so a stream resumed after the task's last numbered event can still replay the request of a
/// call decided meanwhile; that one no longer waits on anyone.
async fn already_decided(gate: &crate::gate::Gate, goal: &GoalState, event: &Event) -> bool {
    let Some(Kind::ApprovalRequired(asked)) = &event.kind else { return false };
    gate.decided(goal, &asked.call_id).await
}
