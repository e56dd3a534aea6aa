//! The HTTP/JSON adapter, beside the gRPC one and just as thin: requests map onto the same
//! caller [`Gate`] operations, so no rule has a second implementation. Every handler takes the
//! [`Caller`] as its first extractor, so authentication comes before anything else is read. Bodies and
//! answers are protobuf's canonical JSON mapping of the `hermes.v1` messages (derived by pbjson),
//! so a goal looks the same over both doors; errors are RFC 9457 problem details whose status
//! comes from [`ErrorCode::http_status`]; a goal's events stream as Server-Sent Events that
//! resume from `Last-Event-ID`. The routes are listed in docs/http.md.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures::{Stream, StreamExt};
use hermes_core::Error;
use hermes_core::error::ErrorCode;
use hermes_core::plan_file::PlanFile;
use hermes_proto::{GoalSpec, GoalStatus};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::gate::{Caller, Door, Gate, goal_id_arg, list_limit};
use crate::view::to_goal;

mod a2a;
mod openapi;
mod routes;

use routes::ROUTES;

pub use crate::config::{DEFAULT_MAX_BODY_BYTES, HttpConfig};

/// How often an idle event stream sends a comment, so proxies keep it open.
const HEARTBEAT: Duration = Duration::from_secs(15);

#[derive(Clone)]
struct Api {
    gate: Arc<Gate>,
    shutdown: CancellationToken,
    max_body_bytes: usize,
}

/// Binds `config.listen` (failing fast with the address) and returns the listener.
pub(crate) async fn bind(config: &HttpConfig) -> anyhow::Result<tokio::net::TcpListener> {
    use anyhow::Context as _;
    tokio::net::TcpListener::bind(config.listen).await.with_context(|| {
        format!(
            "cannot listen for HTTP on {} (set dispatcher.http.listen, HERMES_HTTP_LISTEN, to another address, or `off`)",
            config.listen
        )
    })
}

/// The router of the whole API.
pub(crate) fn router(gate: Arc<Gate>, shutdown: CancellationToken, config: &HttpConfig) -> Router {
    let console = crate::console::router(&config.console, gate.auth_enabled());
    let api = Api { gate, shutdown, max_body_bytes: config.max_body_bytes };
    let mut router = console;
    // Built from the same table as the OpenAPI document.
    for route in ROUTES {
        router = router.route(route.path, handler(route.id));
    }
    let router = router
        .fallback(|| async { Problem::new(StatusCode::NOT_FOUND, ErrorCode::NotFound, "no such route") })
        .method_not_allowed_fallback(|| async {
            Problem::new(
                StatusCode::METHOD_NOT_ALLOWED,
                ErrorCode::InvalidArgument,
                "method not allowed on this route",
            )
        })
        // The handlers read bodies themselves, so an oversized one gets a problem, not plain text.
        .layer(DefaultBodyLimit::max(config.max_body_bytes))
        .with_state(api)
        .layer(axum::middleware::from_fn_with_state(
            Arc::new(crate::gate::site::Site::new(
                config.listen,
                &config.allowed_hosts,
                &config.cors_allow_origins,
            )),
            same_site,
        ));
    match cors(&config.cors_allow_origins) {
        Some(cors) => router.layer(cors),
        None => router,
    }
}

/// The caller of an HTTP request (A2A's at `/a2a`): its `Authorization` header, the peer the
/// connection came from and the `traceparent` it sent, authenticated by the gate. The first
/// extractor of every handler, so nothing else is read before it.
impl axum::extract::FromRequestParts<Api> for Caller {
    type Rejection = Problem;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        api: &Api,
    ) -> std::result::Result<Caller, Problem> {
        let peer = parts.extensions.get::<axum::extract::ConnectInfo<SocketAddr>>().map(|c| c.0);
        let trace = parts
            .headers
            .get("traceparent")
            .and_then(|v| v.to_str().ok())
            .and_then(hermes_core::trace::TraceContext::parse);
        let door = if parts.uri.path() == a2a::RPC_PATH { Door::A2a } else { Door::Http };
        Ok(api.gate.authenticate(authorization(&parts.headers), door, peer, trace).await?)
    }
}

/// Refuses what [`crate::gate::site::Site`] says is not this server's own request, before any route.
async fn same_site(
    State(site): State<Arc<crate::gate::site::Site>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let host = match request.headers().get(header::HOST) {
        Some(host) => host.to_str().ok().map(str::to_owned).or(Some(String::new())),
        None => request.uri().authority().map(|a| a.as_str().to_owned()),
    };
    match site.check(request.method(), host.as_deref(), request.headers()) {
        Ok(()) => next.run(request).await,
        Err(refusal) => {
            let code = match refusal.status {
                StatusCode::FORBIDDEN => ErrorCode::Denied,
                _ => ErrorCode::InvalidArgument,
            };
            tracing::info!(status = %refusal.status, reason = %refusal.reason, "HTTP request refused");
            Problem::new(refusal.status, code, refusal.reason).into_response()
        }
    }
}

fn cors(origins: &[String]) -> Option<tower_http::cors::CorsLayer> {
    use tower_http::cors::{AllowOrigin, CorsLayer};
    if origins.is_empty() {
        return None;
    }
    let allow = if origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        AllowOrigin::list(origins.iter().filter_map(|o| HeaderValue::from_str(o).ok()))
    };
    Some(
        CorsLayer::new()
            .allow_origin(allow)
            .allow_methods([Method::GET, Method::POST])
            .allow_headers([
                header::CONTENT_TYPE,
                header::AUTHORIZATION,
                "idempotency-key".parse().unwrap(),
                "last-event-id".parse().unwrap(),
            ])
            .expose_headers([header::LOCATION]),
    )
}

/// The handler of a route of [`ROUTES`].
fn handler(id: &str) -> axum::routing::MethodRouter<Api> {
    match id {
        "submitGoal" => post(submit),
        "listGoals" => get(list),
        "getGoal" => get(get_goal),
        "cancelGoal" => post(goal_action),
        "goalEvents" => get(events),
        "goalEventsWebSocket" => get(events_ws),
        "listApprovals" => get(approvals),
        "changes" => get(changes),
        "decideApproval" => post(decide),
        "listDeadLetters" => get(dead_letters_list),
        "getDeadLetter" => get(dead_letter),
        "replayDeadLetter" => post(dead_letter_action),
        "listAudit" => get(audit),
        "getGoalArtifact" => get(goal_artifact),
        "listAgents" => get(agents),
        "listSessions" => get(sessions),
        "getSession" => get(session),
        "createWebhook" => post(create_webhook),
        "listWebhooks" => get(list_webhooks),
        "deleteWebhook" => axum::routing::delete(delete_webhook),
        "rotateWebhook" => post(webhook_action),
        "listWebhookDeliveries" => get(webhook_deliveries),
        "resendWebhookDelivery" => post(webhook_delivery_action),
        "openapi" => get(openapi),
        "a2aAgentCard" => get(a2a::agent_card),
        "a2aJsonRpc" => post(a2a::rpc),
        other => unreachable!("route {other} of ROUTES has no handler"),
    }
}

async fn openapi() -> Response {
    static DOCUMENT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let body = DOCUMENT.get_or_init(|| openapi::document().to_string()).clone();
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// An RFC 9457 problem: the HTTP status, the Hermes error code, what went wrong, and every
/// validation problem when there are several.
#[derive(Debug)]
pub struct Problem {
    status: StatusCode,
    code: ErrorCode,
    detail: String,
    problems: Vec<String>,
    /// Seconds to wait before trying again (`Retry-After`), for a spent quota.
    retry_after: Option<u64>,
}

impl Problem {
    fn new(status: StatusCode, code: ErrorCode, detail: impl Into<String>) -> Problem {
        Problem { status, code, detail: detail.into(), problems: Vec::new(), retry_after: None }
    }

    fn invalid(detail: impl Into<String>) -> Problem {
        Problem::new(StatusCode::BAD_REQUEST, ErrorCode::InvalidArgument, detail)
    }

    /// The problem document.
    fn body(&self) -> Value {
        let mut body = json!({
            "type": format!("urn:hermes:error:{}", self.code.as_str()),
            "title": self.status.canonical_reason().unwrap_or("Error"),
            "status": self.status.as_u16(),
            "detail": self.detail,
            "code": self.code.as_str(),
        });
        if !self.problems.is_empty() {
            body["problems"] = json!(self.problems);
        }
        body
    }
}

impl From<Error> for Problem {
    fn from(err: Error) -> Problem {
        let code = err.code();
        let problems = match &err {
            Error::PlanInvalid { problems } => problems.clone(),
            _ => Vec::new(),
        };
        let status = StatusCode::from_u16(code.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        Problem {
            status,
            code,
            detail: format!("{code}: {err}"),
            problems,
            retry_after: err.retry_after_secs(),
        }
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let body = self.body().to_string();
        let mut response =
            (self.status, [(header::CONTENT_TYPE, "application/problem+json")], body).into_response();
        if self.code == ErrorCode::Unauthenticated {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer realm=\"hermes\""));
        }
        if let Some(secs) = self.retry_after {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

type Answer = std::result::Result<Response, Problem>;

/// Canonical JSON of a `hermes.v1` message.
fn message_json<T: serde::Serialize>(message: &T) -> Value {
    serde_json::to_value(message).unwrap_or(Value::Null)
}

fn json_response(status: StatusCode, body: Value) -> Response {
    (status, [(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}

/// The request body, read here so that an oversized one is a problem naming the limit.
fn body_bytes(
    api: &Api,
    body: std::result::Result<Bytes, BytesRejection>,
) -> std::result::Result<Bytes, Problem> {
    body.map_err(|rejection| match rejection.status() {
        StatusCode::PAYLOAD_TOO_LARGE => Problem::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            ErrorCode::LimitExceeded,
            format!(
                "the request body is over this server's limit of {} bytes (dispatcher.http.max_body_bytes)",
                api.max_body_bytes
            ),
        ),
        status => Problem::new(status, ErrorCode::InvalidArgument, rejection.body_text()),
    })
}

/// Parses a body as JSON, or as YAML when its content type says so; malformed input is a `400`
/// naming the line and column.
fn parse_body<T: DeserializeOwned>(headers: &HeaderMap, bytes: &Bytes) -> std::result::Result<T, Problem> {
    let media = crate::gate::site::media_type(headers).unwrap_or_default();
    if bytes.is_empty() {
        return Err(Problem::invalid("the request has no body"));
    }
    match media.as_str() {
        "application/yaml" | "application/x-yaml" | "text/yaml" | "text/x-yaml" => {
            serde_norway::from_slice(bytes).map_err(|e| {
                let at = e.location().map(|l| format!(" at line {} column {}", l.line(), l.column()));
                Problem::invalid(format!("malformed YAML{}: {e}", at.unwrap_or_default()))
            })
        }
        "application/json" | "application/a2a+json" | "text/json" => {
            serde_json::from_slice(bytes).map_err(|e| {
                Problem::invalid(format!("malformed JSON at line {} column {}: {e}", e.line(), e.column()))
            })
        }
        "" => Err(Problem::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ErrorCode::InvalidArgument,
            "the request has a body but no Content-Type: send application/json or application/yaml",
        )),
        other => Err(Problem::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ErrorCode::InvalidArgument,
            format!("content type `{other}` is not accepted: send application/json or application/yaml"),
        )),
    }
}

/// The query's parameters, or a `400` naming what is wrong with them.
fn query_arg<T>(
    query: std::result::Result<Query<T>, axum::extract::rejection::QueryRejection>,
) -> std::result::Result<T, Problem> {
    query.map(|Query(q)| q).map_err(|e| Problem::invalid(e.body_text()))
}

/// The `404` of an action route (`{resource}:{action}`) given an unknown action, showing `usage`.
fn no_such_action(usage: &str) -> Problem {
    Problem::new(StatusCode::NOT_FOUND, ErrorCode::NotFound, format!("no such action: use {usage}"))
}

/// The `Authorization` header's value, when it is text.
fn authorization(headers: &HeaderMap) -> Option<&str> {
    headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok())
}

/// `POST /v1/goals`: a goal given as `text` or as a `plan` (the plan file's shape: inputs as
/// objects), with the goal's options. Field names are snake_case or lowerCamelCase.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct SubmitBody {
    #[serde(default)]
    text: String,
    #[serde(default)]
    plan: Option<PlanFile>,
    #[serde(default, alias = "sessionId")]
    session_id: String,
    #[serde(default, alias = "idempotencyKey")]
    idempotency_key: String,
    #[serde(default, alias = "timeoutMs")]
    timeout_ms: u64,
    #[serde(default)]
    labels: std::collections::HashMap<String, String>,
    #[serde(default, alias = "maxTokens")]
    max_tokens: u64,
    #[serde(default, alias = "maxCostUsd")]
    max_cost_usd: f64,
    /// Webhooks of this goal (docs/webhooks.md); the answer's `callbackSecrets` holds each one's
    /// signing secret, this once.
    #[serde(default)]
    callbacks: Vec<WebhookBody>,
}

/// A webhook endpoint: a goal's callback, or a tenant's standing endpoint (`POST /v1/webhooks`).
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct WebhookBody {
    /// An http or https URL.
    url: String,
    /// `goal.completed`, `goal.failed`, `goal.cancelled`, `goal.needs_input`, `approval.expired`;
    /// none: all of them.
    #[serde(default)]
    events: Vec<String>,
    /// A signing secret (`whsec_...`) to use; none: one is made and returned once.
    #[serde(default)]
    secret: String,
}

async fn submit(
    caller: Caller,
    State(api): State<Api>,
    headers: HeaderMap,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Answer {
    let bytes = body_bytes(&api, body)?;
    let mut body: Value = parse_body(&headers, &bytes)?;
    // A bare plan (a plan file's content) is a goal with that plan.
    if body.get("nodes").is_some() {
        body = json!({ "plan": body });
    }
    let body: SubmitBody =
        serde_json::from_value(body).map_err(|e| Problem::invalid(format!("not a goal: {e}")))?;
    let header_key = match headers.get("idempotency-key") {
        Some(v) => {
            v.to_str().map_err(|_| Problem::invalid("the Idempotency-Key header is not text"))?.to_owned()
        }
        None => String::new(),
    };
    let idempotency_key = match (header_key.is_empty(), body.idempotency_key.is_empty()) {
        (false, false) if header_key != body.idempotency_key => {
            return Err(Problem::invalid("the Idempotency-Key header and the body's idempotency_key differ"));
        }
        (false, _) => header_key,
        (true, _) => body.idempotency_key,
    };
    let plan = body.plan.map(|p| p.into_plan()).transpose().map_err(|e| Problem::invalid(e.to_string()))?;
    let spec = GoalSpec {
        text: body.text,
        plan,
        session_id: body.session_id,
        idempotency_key,
        timeout_ms: body.timeout_ms,
        labels: body.labels,
        max_tokens: body.max_tokens,
        max_cost_usd: body.max_cost_usd,
        callbacks: body
            .callbacks
            .into_iter()
            .map(|c| hermes_proto::Callback {
                url: c.url,
                events: c.events,
                secret: c.secret,
                ..Default::default()
            })
            .collect(),
    };
    let submitted = api.gate.submit(&caller, spec).await?;
    let state = api.gate.get(&caller, &submitted.goal_id).await?;
    let status = if submitted.duplicate { StatusCode::OK } else { StatusCode::CREATED };
    let mut goal = message_json(&to_goal(state));
    if !submitted.callback_secrets.is_empty() {
        goal["callbackSecrets"] = json!(submitted.callback_secrets);
    }
    let mut response = json_response(status, goal);
    if let Ok(location) = HeaderValue::from_str(&format!("/v1/goals/{}", submitted.goal_id)) {
        response.headers_mut().insert(header::LOCATION, location);
    }
    Ok(response)
}

/// `GET /v1/goals` filters and page.
#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    /// Goals per page (100 by default, at most 1000).
    limit: Option<usize>,
    /// `running`, `completed`, ... (or `GOAL_STATUS_RUNNING`).
    status: Option<String>,
    /// Only goals of this session.
    session: Option<String>,
    /// Only goals whose text contains this (case-insensitive).
    q: Option<String>,
    /// The `next_page_token` of the previous page.
    page_token: Option<String>,
}

fn parse_status(text: &str) -> std::result::Result<GoalStatus, Problem> {
    let wanted = text.trim().to_ascii_uppercase();
    let wanted = wanted.strip_prefix("GOAL_STATUS_").unwrap_or(&wanted);
    (1..=20)
        .filter_map(|n| GoalStatus::try_from(n).ok())
        .find(|s| s.as_str_name().strip_prefix("GOAL_STATUS_") == Some(wanted))
        .ok_or_else(|| {
            Problem::invalid(format!(
                "unknown status `{text}`: use running, completed, failed, cancelled, needs_input, ..."
            ))
        })
}

/// Goals are listed newest first; the page token is the position of the last goal listed
/// (creation time and id), so pages do not shift when new goals arrive.
async fn list(
    caller: Caller,
    State(api): State<Api>,
    query: std::result::Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Answer {
    let query = query_arg(query)?;
    let limit = list_limit(query.limit.unwrap_or(0));
    let status = query.status.as_deref().map(parse_status).transpose()?;
    let after = match query.page_token.as_deref() {
        Some(token) => {
            let (ms, id) = token.split_once('.').ok_or_else(|| Problem::invalid("malformed page_token"))?;
            Some((ms.parse::<u64>().map_err(|_| Problem::invalid("malformed page_token"))?, id.to_owned()))
        }
        None => None,
    };
    let needle = query.q.as_deref().map(str::to_lowercase);
    let page = crate::goal_index::PageQuery {
        tenant: None,
        status: status.map(|s| s as i32),
        session: query.session.as_deref(),
        after,
    };
    let (goals, more) = api.gate.list(&caller, page, needle.as_deref(), limit).await?;
    let next = match (more, goals.last()) {
        (true, Some(last)) => format!("{}.{}", last.created_unix_ms, last.goal_id),
        _ => String::new(),
    };
    let goals: Vec<Value> = goals.into_iter().map(|g| message_json(&to_goal(g))).collect();
    Ok(json_response(StatusCode::OK, json!({"goals": goals, "nextPageToken": next})))
}

async fn get_goal(caller: Caller, State(api): State<Api>, Path(id): Path<String>) -> Answer {
    let state = api.gate.get(&caller, goal_id_arg(&id)?).await?;
    Ok(json_response(StatusCode::OK, message_json(&to_goal(state))))
}

/// A reason for cancelling or deciding, optional.
#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct ReasonBody {
    #[serde(default, alias = "note")]
    reason: String,
}

fn optional_reason(headers: &HeaderMap, bytes: &Bytes) -> std::result::Result<String, Problem> {
    if bytes.is_empty() {
        return Ok(String::new());
    }
    Ok(parse_body::<ReasonBody>(headers, bytes)?.reason)
}

/// `POST /v1/goals/{id}:cancel`.
async fn goal_action(
    caller: Caller,
    State(api): State<Api>,
    Path(target): Path<String>,
    headers: HeaderMap,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Answer {
    let bytes = body_bytes(&api, body)?;
    let Some(id) = target.strip_suffix(":cancel") else {
        return Err(no_such_action("/v1/goals/{id}:cancel"));
    };
    let reason = optional_reason(&headers, &bytes)?;
    let state = api.gate.cancel(&caller, goal_id_arg(id)?, &reason).await?;
    Ok(json_response(StatusCode::OK, message_json(&to_goal(state))))
}

/// `GET /v1/goals/{id}/events?after=SEQ`.
#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct EventsQuery {
    after: Option<u64>,
}

/// The goal's events as Server-Sent Events: each event's `id:` is its per-goal `seq` (events
/// written outside the sequence, which have none, carry no id), `data:` its canonical JSON. Resumes after
/// `Last-Event-ID` (or `?after=`), with no gap and no repeat; the first request replays from
/// the start. The stream ends after the terminal event; comments keep idle proxies open.
async fn events(
    caller: Caller,
    State(api): State<Api>,
    Path(id): Path<String>,
    headers: HeaderMap,
    query: std::result::Result<Query<EventsQuery>, axum::extract::rejection::QueryRejection>,
) -> std::result::Result<Sse<impl Stream<Item = std::result::Result<SseEvent, Infallible>>>, Problem> {
    let query = query_arg(query)?;
    let last_event_id = match headers.get("last-event-id") {
        Some(v) => Some(
            v.to_str()
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
                .ok_or_else(|| Problem::invalid("Last-Event-ID is not an event sequence number"))?,
        ),
        None => None,
    };
    let after = last_event_id.or(query.after).unwrap_or(0);
    let events = api.gate.watch(&caller, goal_id_arg(&id)?, after).await?;
    let stream = events
        .map(|event| {
            Ok::<_, Infallible>(match event {
                Ok(event) => {
                    let data = message_json(&event).to_string();
                    let sse = SseEvent::default().data(data);
                    if event.seq > 0 { sse.id(event.seq.to_string()) } else { sse }
                }
                // The stream ends after this; the client resumes from the last id it saw.
                Err(e) => SseEvent::default().event("error").data(Problem::from(e).body().to_string()),
            })
        })
        .take_until(api.shutdown.clone().cancelled_owned());
    Ok(Sse::new(stream).keep_alive(KeepAlive::new().interval(HEARTBEAT).text("heartbeat")))
}

/// `GET /v1/changes`: what changes in the lists, as Server-Sent Events, from now on: `event:
/// goal` with a goal's index entry when it is created or its status changes, `event: approval`
/// with an approval asked for or decided, `event: lagged` when this stream fell behind (list
/// again). The caller's tenant's only. The console's Goals and Approvals pages follow it instead
/// of polling.
async fn changes(
    caller: Caller,
    State(api): State<Api>,
) -> std::result::Result<Sse<impl Stream<Item = std::result::Result<SseEvent, Infallible>>>, Problem> {
    use crate::gate::Change;
    let stream = api
        .gate
        .changes(&caller)?
        .map(|change| {
            Ok::<_, Infallible>(match change {
                Change::Goal(entry) => {
                    SseEvent::default().event("goal").data(message_json(&*entry).to_string())
                }
                Change::Approval(a) => {
                    SseEvent::default().event("approval").data(message_json(&*a).to_string())
                }
                Change::Lagged => SseEvent::default().event("lagged").data("{}"),
            })
        })
        .take_until(api.shutdown.clone().cancelled_owned());
    Ok(Sse::new(stream).keep_alive(KeepAlive::new().interval(HEARTBEAT).text("heartbeat")))
}

/// The goal's events over a WebSocket: one text message per event, its canonical JSON (the
/// `seq` field is the resume point), from the start or after `?after=SEQ`. The server closes
/// with 1000 after the terminal event, 1001 when it shuts down, 1011 on an error (its problem
/// in a text message first). Errors before the upgrade (no such goal) are problem documents.
async fn events_ws(
    caller: Caller,
    State(api): State<Api>,
    Path(id): Path<String>,
    query: std::result::Result<Query<EventsQuery>, axum::extract::rejection::QueryRejection>,
    upgrade: std::result::Result<
        axum::extract::ws::WebSocketUpgrade,
        axum::extract::ws::rejection::WebSocketUpgradeRejection,
    >,
) -> Answer {
    let query = query_arg(query)?;
    let events = api.gate.watch(&caller, goal_id_arg(&id)?, query.after.unwrap_or(0)).await?;
    let upgrade = upgrade.map_err(|e| {
        Problem::new(
            StatusCode::UPGRADE_REQUIRED,
            ErrorCode::InvalidArgument,
            format!("this route is a WebSocket: {} (or use /v1/goals/{{id}}/events for SSE)", e.body_text()),
        )
    })?;
    let shutdown = api.shutdown.clone();
    Ok(upgrade.on_upgrade(move |socket| forward_events(socket, events, shutdown)))
}

async fn forward_events(
    mut socket: axum::extract::ws::WebSocket,
    events: impl Stream<Item = Result<hermes_proto::Event, Error>> + Send,
    shutdown: CancellationToken,
) {
    use axum::extract::ws::{CloseFrame, Message};
    let close =
        |code: u16, reason: &'static str| Message::Close(Some(CloseFrame { code, reason: reason.into() }));
    let mut events = std::pin::pin!(events);
    let mut heartbeat = tokio::time::interval(HEARTBEAT);
    heartbeat.reset();
    loop {
        let message = tokio::select! {
            event = events.next() => match event {
                Some(Ok(event)) => Message::Text(message_json(&event).to_string().into()),
                Some(Err(e)) => {
                    let _ = socket.send(Message::Text(Problem::from(e).body().to_string().into())).await;
                    close(1011, "event stream failed")
                }
                None => close(1000, "the goal ended"),
            },
            _ = heartbeat.tick() => Message::Ping(Default::default()),
            incoming = socket.recv() => match incoming {
                // The client went away or closed.
                None | Some(Err(_)) | Some(Ok(Message::Close(_))) => return,
                Some(Ok(_)) => continue,
            },
            _ = shutdown.cancelled() => close(1001, "the server is shutting down"),
        };
        let closing = matches!(message, Message::Close(_));
        if socket.send(message).await.is_err() || closing {
            return;
        }
    }
}

/// `GET /v1/goals/{id}/artifacts/{reference}`: an artifact the goal produced, in its content
/// type. An artifact of another goal is `404`, as one that does not exist.
async fn goal_artifact(
    caller: Caller,
    State(api): State<Api>,
    Path((id, reference)): Path<(String, String)>,
) -> Answer {
    let (info, bytes) = api.gate.artifact(&caller, goal_id_arg(&id)?, &reference).await?;
    let content_type = HeaderValue::from_str(&info.content_type)
        .unwrap_or_else(|_| HeaderValue::from_static("application/octet-stream"));
    Ok(([(header::CONTENT_TYPE, content_type)], bytes).into_response())
}

/// `GET /v1/agents`: the registry's view of every agent (`Registry.ListAgents`), over NATS.
async fn agents(caller: Caller, State(api): State<Api>) -> Answer {
    let agents = api.gate.agents(&caller).await?;
    let agents: Vec<Value> = agents.iter().map(message_json).collect();
    Ok(json_response(StatusCode::OK, json!({"agents": agents})))
}

/// `GET /v1/sessions`: the caller's tenant's memory sessions, from the memory service.
async fn sessions(caller: Caller, State(api): State<Api>) -> Answer {
    let sessions = api.gate.sessions(&caller).await?;
    let sessions: Vec<Value> = sessions.iter().map(message_json).collect();
    Ok(json_response(StatusCode::OK, json!({"sessions": sessions})))
}

/// `GET /v1/sessions/{id}`: one session of the caller's tenant.
async fn session(caller: Caller, State(api): State<Api>, Path(id): Path<String>) -> Answer {
    let session = api.gate.session(&caller, &id).await?;
    Ok(json_response(StatusCode::OK, message_json(&session)))
}

/// `GET /v1/approvals`: every tool call waiting for a person, across goals, oldest first, with
/// when it expires.
async fn approvals(caller: Caller, State(api): State<Api>) -> Answer {
    let pending = api.gate.pending_approvals(&caller).await?;
    let approvals: Vec<Value> = pending.iter().map(message_json).collect();
    Ok(json_response(StatusCode::OK, json!({"approvals": approvals})))
}

/// `POST /v1/approvals/{goal}/{call}:approve` or `:deny`, with an optional `{"reason": ...}`.
async fn decide(
    caller: Caller,
    State(api): State<Api>,
    Path((goal, target)): Path<(String, String)>,
    headers: HeaderMap,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Answer {
    let bytes = body_bytes(&api, body)?;
    let (call, approve) = match (target.strip_suffix(":approve"), target.strip_suffix(":deny")) {
        (Some(call), _) => (call, true),
        (_, Some(call)) => (call, false),
        _ => return Err(no_such_action("/v1/approvals/{goal}/{call}:approve or :deny")),
    };
    let reason = optional_reason(&headers, &bytes)?;
    let decision = api.gate.decide(&caller, goal_id_arg(&goal)?, call, approve, &reason).await?;
    Ok(json_response(StatusCode::OK, message_json(&decision)))
}

#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct LimitQuery {
    limit: Option<usize>,
}

async fn dead_letters_list(
    caller: Caller,
    State(api): State<Api>,
    query: std::result::Result<Query<LimitQuery>, axum::extract::rejection::QueryRejection>,
) -> Answer {
    let query = query_arg(query)?;
    let letters = api.gate.dead_letters(&caller, query.limit.unwrap_or(0)).await?;
    let letters: Vec<Value> = letters.iter().map(message_json).collect();
    Ok(json_response(StatusCode::OK, json!({"deadLetters": letters})))
}

#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct AuditQuery {
    /// At most this many records (default 100, at most 1000).
    limit: Option<usize>,
    /// Records after this sequence number.
    after: Option<u64>,
}

/// `GET /v1/audit?after=SEQ&limit=N`.
async fn audit(
    caller: Caller,
    State(api): State<Api>,
    query: std::result::Result<Query<AuditQuery>, axum::extract::rejection::QueryRejection>,
) -> Answer {
    let query = query_arg(query)?;
    let records = api.gate.audit(&caller, query.limit.unwrap_or(0), query.after.unwrap_or(0)).await?;
    let records: Vec<Value> = records.iter().map(message_json).collect();
    Ok(json_response(StatusCode::OK, json!({"records": records})))
}

/// `POST /v1/webhooks`: a standing endpoint for the caller's tenant.
async fn create_webhook(
    caller: Caller,
    State(api): State<Api>,
    headers: HeaderMap,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Answer {
    let bytes = body_bytes(&api, body)?;
    let body: WebhookBody = serde_json::from_value(parse_body(&headers, &bytes)?)
        .map_err(|e| Problem::invalid(format!("not a webhook: {e}")))?;
    let (endpoint, secret) = api.gate.create_webhook(&caller, &body.url, body.events, &body.secret).await?;
    let answer = hermes_proto::CreateWebhookResponse { endpoint: Some(endpoint), secret };
    Ok(json_response(StatusCode::CREATED, message_json(&answer)))
}

async fn list_webhooks(caller: Caller, State(api): State<Api>) -> Answer {
    let endpoints: Vec<Value> = api.gate.webhooks(&caller).await?.iter().map(message_json).collect();
    Ok(json_response(StatusCode::OK, json!({"endpoints": endpoints})))
}

async fn delete_webhook(caller: Caller, State(api): State<Api>, Path(id): Path<String>) -> Answer {
    Ok(json_response(StatusCode::OK, message_json(&api.gate.delete_webhook(&caller, &id).await?)))
}

/// `POST /v1/webhooks/{id}:rotate`.
async fn webhook_action(caller: Caller, State(api): State<Api>, Path(target): Path<String>) -> Answer {
    let Some(id) = target.strip_suffix(":rotate") else {
        return Err(no_such_action("/v1/webhooks/{id}:rotate"));
    };
    let (endpoint, secret) = api.gate.rotate_webhook(&caller, id).await?;
    let answer = hermes_proto::CreateWebhookResponse { endpoint: Some(endpoint), secret };
    Ok(json_response(StatusCode::OK, message_json(&answer)))
}

/// `GET /v1/webhooks/deliveries` filters.
#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct DeliveriesQuery {
    /// Only this goal's deliveries.
    goal_id: Option<String>,
    /// Only this endpoint's.
    endpoint_id: Option<String>,
    /// At most this many (default 100, at most 1000).
    limit: Option<usize>,
}

async fn webhook_deliveries(
    caller: Caller,
    State(api): State<Api>,
    query: std::result::Result<Query<DeliveriesQuery>, axum::extract::rejection::QueryRejection>,
) -> Answer {
    let query = query_arg(query)?;
    let deliveries = api
        .gate
        .webhook_deliveries(
            &caller,
            query.goal_id.as_deref().unwrap_or_default(),
            query.endpoint_id.as_deref().unwrap_or_default(),
            query.limit.unwrap_or(0),
        )
        .await?;
    let deliveries: Vec<Value> = deliveries.iter().map(message_json).collect();
    Ok(json_response(StatusCode::OK, json!({"deliveries": deliveries})))
}

/// `POST /v1/webhooks/deliveries/{id}:resend`.
async fn webhook_delivery_action(
    caller: Caller,
    State(api): State<Api>,
    Path(target): Path<String>,
) -> Answer {
    let Some(id) = target.strip_suffix(":resend") else {
        return Err(no_such_action("/v1/webhooks/deliveries/{id}:resend"));
    };
    Ok(json_response(StatusCode::OK, message_json(&api.gate.resend_webhook(&caller, id).await?)))
}

fn sequence_arg(text: &str) -> std::result::Result<u64, Problem> {
    text.parse().map_err(|_| Problem::invalid(format!("`{text}` is not a dead letter's sequence number")))
}

async fn dead_letter(caller: Caller, State(api): State<Api>, Path(seq): Path<String>) -> Answer {
    let letter = api.gate.dead_letter(&caller, sequence_arg(&seq)?).await?;
    Ok(json_response(StatusCode::OK, message_json(&letter)))
}

/// `POST /v1/dead-letters/{seq}:replay`.
async fn dead_letter_action(caller: Caller, State(api): State<Api>, Path(target): Path<String>) -> Answer {
    let Some(seq) = target.strip_suffix(":replay") else {
        return Err(no_such_action("/v1/dead-letters/{seq}:replay"));
    };
    let (subject, sequence) = api.gate.replay_dead_letter(&caller, sequence_arg(seq)?).await?;
    Ok(json_response(StatusCode::OK, json!({"subject": subject, "sequence": sequence.to_string()})))
}
