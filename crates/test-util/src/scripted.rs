//! A scripted OpenAI-compatible Chat Completions server for tests. It is a real HTTP server, so
//! tests exercise the real client code. Responses are queued per model name (so a planner model
//! and a summarizer model in one test each get their own script) and replayed in order; every
//! request received is recorded. An exhausted script answers 500, so a test never passes on a
//! response it did not write.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::extract::State;
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{Value, json};

/// One scripted reply.
#[derive(Debug, Clone)]
pub struct ScriptedResponse {
    status: u16,
    headers: Vec<(String, String)>,
    body: Value,
    delay: std::time::Duration,
    /// Usage counted from the request ([`ScriptedResponse::with_counted_usage`]).
    count_usage: bool,
}

impl ScriptedResponse {
    /// An assistant message with text content (which may be malformed JSON on purpose).
    pub fn content(text: impl Into<String>) -> Self {
        Self::ok(json!({"role": "assistant", "content": text.into()}), "stop")
    }

    /// An assistant message calling one tool with raw `arguments` text.
    pub fn tool_call(name: &str, arguments: &str) -> Self {
        Self::ok(
            json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": name, "arguments": arguments}}
            ]}),
            "tool_calls",
        )
    }

    /// An assistant message with `content` (text, `""`, or `None` for JSON null) and one tool call:
    /// how vLLM and llama.cpp answer a structured-output request with a tool-calling template.
    pub fn tool_call_with_content(content: Option<&str>, name: &str, arguments: &str) -> Self {
        Self::ok(
            json!({"role": "assistant", "content": content, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": name, "arguments": arguments}}
            ]}),
            "tool_calls",
        )
    }

    /// Says the answer ended for `reason`: `length` for an answer cut at the token limit.
    pub fn with_finish_reason(mut self, reason: &str) -> Self {
        self.body["choices"][0]["finish_reason"] = json!(reason);
        self
    }

    /// An error status with a text body.
    pub fn status(status: u16, body: &str) -> Self {
        Self {
            status,
            headers: Vec::new(),
            body: json!({"error": {"message": body}}),
            delay: Default::default(),
            count_usage: false,
        }
    }

    /// Answers only after `delay`, like a slow model (the request is recorded on arrival).
    pub fn with_delay(mut self, delay: std::time::Duration) -> Self {
        self.delay = delay;
        self
    }

    pub fn with_header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }

    /// Reports usage counted from the request instead of a fixed figure: four characters of the
    /// request's messages and tools a prompt token, and of the reply's message a completion token
    /// (the estimate OpenAI-compatible clients make, `hermes_llm::estimate_tokens`).
    pub fn with_counted_usage(mut self) -> Self {
        self.count_usage = true;
        self
    }

    pub fn with_usage(mut self, input: u64, output: u64) -> Self {
        self.body["usage"] =
            json!({"prompt_tokens": input, "completion_tokens": output, "total_tokens": input + output});
        self
    }

    fn ok(message: Value, finish_reason: &str) -> Self {
        Self {
            status: 200,
            delay: Default::default(),
            headers: Vec::new(),
            count_usage: false,
            body: json!({
                "id": "chatcmpl-scripted",
                "object": "chat.completion",
                "model": "",
                "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
            }),
        }
    }
}

#[derive(Default)]
struct Script {
    queues: Mutex<HashMap<String, VecDeque<ScriptedResponse>>>,
    received: Mutex<Vec<(Instant, Value)>>,
}

/// The running server; stops when dropped.
pub struct ScriptedLlm {
    addr: SocketAddr,
    script: Arc<Script>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ScriptedLlm {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ScriptedLlm {
    pub async fn start() -> ScriptedLlm {
        let script = Arc::new(Script::default());
        let app = Router::new()
            .route("/v1/chat/completions", post(complete))
            .route("/chat/completions", post(complete))
            .with_state(script.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind scripted llm");
        let addr = listener.local_addr().expect("local addr");
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        ScriptedLlm { addr, script, task }
    }

    /// The `base_url` to configure a client with.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Queues a reply for requests naming `model`.
    pub fn push(&self, model: &str, response: ScriptedResponse) {
        self.script.queues.lock().unwrap().entry(model.to_owned()).or_default().push_back(response);
    }

    /// Replies still queued for `model`.
    pub fn remaining(&self, model: &str) -> usize {
        self.script.queues.lock().unwrap().get(model).map_or(0, VecDeque::len)
    }

    /// Every request body received, in order.
    pub fn requests(&self) -> Vec<Value> {
        self.script.received.lock().unwrap().iter().map(|(_, v)| v.clone()).collect()
    }

    /// Request bodies that named `model`.
    pub fn requests_for(&self, model: &str) -> Vec<Value> {
        self.requests().into_iter().filter(|r| r["model"] == model).collect()
    }

    /// When each request arrived.
    pub fn request_times(&self) -> Vec<Instant> {
        self.script.received.lock().unwrap().iter().map(|(t, _)| *t).collect()
    }
}

async fn complete(State(script): State<Arc<Script>>, Json(body): Json<Value>) -> Response {
    let model = body["model"].as_str().unwrap_or_default().to_owned();
    script.received.lock().unwrap().push((Instant::now(), body));
    let next = script.queues.lock().unwrap().get_mut(&model).and_then(VecDeque::pop_front);
    let Some(mut reply) = next else {
        let error = json!({"error": {"message": format!("the script for model `{model}` is exhausted")}});
        return (StatusCode::INTERNAL_SERVER_ERROR, Json(error)).into_response();
    };
    if reply.status == 200 {
        reply.body["model"] = json!(model);
    }
    if reply.count_usage {
        let received = script.received.lock().unwrap();
        let request = &received.last().expect("just received").1;
        let prompt = (request["messages"].to_string().len() + request["tools"].to_string().len()).div_ceil(4);
        let completion = reply.body["choices"][0]["message"].to_string().len().div_ceil(4);
        reply.body["usage"] = json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion});
    }
    if !reply.delay.is_zero() {
        tokio::time::sleep(reply.delay).await;
    }
    let mut response =
        (StatusCode::from_u16(reply.status).unwrap_or(StatusCode::OK), Json(reply.body)).into_response();
    for (name, value) in reply.headers {
        if let (Ok(name), Ok(value)) = (HeaderName::try_from(name), HeaderValue::try_from(value)) {
            response.headers_mut().insert(name, value);
        }
    }
    response
}
