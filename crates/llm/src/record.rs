//! Recording model exchanges and serving them again (docs/evaluation.md).
//!
//! [`exchange`] turns one call (its request, its answer, how long it took) into the
//! `ModelExchange` the dispatcher keeps in `HERMES_RECORDS`. A request is identified by the
//! sha256 of its canonical JSON ([`digest`]), and each of its messages by its own digest, so
//! a request that changed can be named by its first message that differs.
//!
//! [`ReplayModel`] is a [`ChatModel`] that answers from those records: each request gets the
//! first unused record with the same digest. A request with none is not answered: the call fails
//! with an error naming the purpose, the request's position and the first message that differs,
//! and the divergence is kept for the replay's report.

use std::sync::Mutex;
use std::time::Duration;

use futures::future::BoxFuture;
use hermes_proto::{ModelExchange, RecordedToolCall, TokenUsage};
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};

use crate::{ChatModel, ChatRequest, ChatResponse, LlmError, Message, Role, ToolCall, Usage};

/// Most bytes of a request's JSON kept in its record, for a person to read.
const REQUEST_TEXT_LIMIT: usize = 16 * 1024;
/// Most characters of each message kept there.
const MESSAGE_TEXT_LIMIT: usize = 1500;

fn role_name(role: &Role) -> &'static str {
    match role {
        Role::System => "system",
        Role::User => "user",
        Role::Assistant => "assistant",
        Role::Tool => "tool",
    }
}

fn message_json(m: &Message) -> Value {
    json!({
        "role": role_name(&m.role),
        "content": m.content,
        "tool_calls": m.tool_calls.iter().map(|c| json!({"id": c.id, "name": c.name, "arguments": c.arguments})).collect::<Vec<_>>(),
        "tool_call_id": m.tool_call_id,
    })
}

/// The request as canonical JSON: what its digest is taken over.
pub fn request_json(request: &ChatRequest) -> Value {
    json!({
        "messages": request.messages.iter().map(message_json).collect::<Vec<_>>(),
        "tools": request.tools.iter().map(|t| json!({"name": t.name, "description": t.description, "parameters": t.parameters})).collect::<Vec<_>>(),
        "response_schema": request.response_schema.as_ref().map(|(name, schema)| json!({"name": name, "schema": schema})),
        "temperature": request.temperature,
        "max_tokens": request.max_tokens,
    })
}

/// The sha256 of `text`, in hex.
pub fn sha256(text: &str) -> String {
    Sha256::digest(text.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

/// The sha256 of the request's canonical JSON.
pub fn digest(request: &ChatRequest) -> String {
    sha256(&request_json(request).to_string())
}

/// `<role>:<sha256>` of each message, in order.
pub fn message_digests(request: &ChatRequest) -> Vec<String> {
    request
        .messages
        .iter()
        .map(|m| format!("{}:{}", role_name(&m.role), sha256(&message_json(m).to_string())))
        .collect()
}

/// The record of one call.
pub fn exchange(
    purpose: &str,
    request: &ChatRequest,
    response: &ChatResponse,
    latency: Duration,
) -> ModelExchange {
    // Each message cut to its start, so that every one of them shows (the system prompt with
    // the catalogue is long; the user's message is what a reader wants).
    let mut readable = request_json(request);
    if let Some(messages) = readable["messages"].as_array_mut() {
        for m in messages {
            if let Some(content) = m["content"].as_str() {
                m["content"] = Value::String(hermes_core::text::clip(content, MESSAGE_TEXT_LIMIT));
            }
        }
    }
    if let Some(tools) = readable["tools"].as_array_mut() {
        for t in tools {
            t["parameters"] = Value::Null;
        }
    }
    readable["response_schema"] = Value::Null;
    let mut text = hermes_core::redact::redact_json_text(&readable.to_string());
    if text.len() > REQUEST_TEXT_LIMIT {
        let mut cut = REQUEST_TEXT_LIMIT;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push('…');
    }
    ModelExchange {
        purpose: purpose.to_owned(),
        request_digest: digest(request),
        message_digests: message_digests(request),
        request_json: text,
        content: response.content.clone().unwrap_or_default(),
        tool_calls: response
            .tool_calls
            .iter()
            .map(|c| RecordedToolCall {
                id: c.id.clone(),
                name: c.name.clone(),
                arguments_json: c.arguments.clone(),
            })
            .collect(),
        finish_reason: response.finish_reason.clone(),
        model: response.model.clone(),
        tokens: Some(TokenUsage {
            input_tokens: response.usage.input_tokens,
            output_tokens: response.usage.output_tokens,
        }),
        latency_ms: latency.as_millis() as u64,
        at_unix_ms: hermes_core::now_unix_ms(),
        ..Default::default()
    }
}

/// The answer a record holds.
fn response_of(record: &ModelExchange) -> ChatResponse {
    ChatResponse {
        content: (!record.content.is_empty() || record.tool_calls.is_empty()).then(|| record.content.clone()),
        tool_calls: record
            .tool_calls
            .iter()
            .map(|c| ToolCall { id: c.id.clone(), name: c.name.clone(), arguments: c.arguments_json.clone() })
            .collect(),
        usage: record
            .tokens
            .map(|t| Usage { input_tokens: t.input_tokens, output_tokens: t.output_tokens })
            .unwrap_or_default(),
        finish_reason: record.finish_reason.clone(),
        model: record.model.clone(),
    }
}

/// A model that answers from a goal's records, for `hermes replay`.
pub struct ReplayModel {
    model: String,
    state: Mutex<ReplayState>,
}

struct ReplayState {
    records: Vec<(ModelExchange, bool)>,
    requests: usize,
    divergences: Vec<String>,
}

impl ReplayModel {
    pub fn new(records: Vec<ModelExchange>) -> ReplayModel {
        let model = records.first().map(|r| r.model.clone()).unwrap_or_else(|| "replay".into());
        ReplayModel {
            model,
            state: Mutex::new(ReplayState {
                records: records.into_iter().map(|r| (r, false)).collect(),
                requests: 0,
                divergences: Vec::new(),
            }),
        }
    }

    /// The requests no record matched, in words, in the order they came.
    pub fn divergences(&self) -> Vec<String> {
        self.state.lock().expect("replay state").divergences.clone()
    }

    /// Records never asked for: the new run made fewer calls than the recorded one.
    pub fn unused(&self) -> Vec<ModelExchange> {
        self.state
            .lock()
            .expect("replay state")
            .records
            .iter()
            .filter(|(_, used)| !used)
            .map(|(r, _)| r.clone())
            .collect()
    }

    fn answer(&self, request: &ChatRequest) -> Result<ChatResponse, LlmError> {
        self.take(request).1.map(|record| response_of(&record))
    }

    /// The request's number and the first unused record whose digest matches it. A request
    /// with none is a divergence, named against the next unused record, message by message.
    fn take(&self, request: &ChatRequest) -> (usize, Result<ModelExchange, LlmError>) {
        let mut state = self.state.lock().expect("replay state");
        state.requests += 1;
        let number = state.requests;
        let wanted = digest(request);
        if let Some((record, used)) =
            state.records.iter_mut().find(|(r, used)| !used && r.request_digest == wanted)
        {
            *used = true;
            return (number, Ok(record.clone()));
        }
        let why = match state.records.iter().find(|(_, used)| !used) {
            None => format!(
                "model request {number} has no record: the recorded run made only {} model calls",
                state.records.len()
            ),
            Some((record, _)) => {
                let now = message_digests(request);
                let at = now.iter().zip(&record.message_digests).position(|(a, b)| a != b);
                let detail = match at {
                    Some(i) => {
                        let role = now[i].split(':').next().unwrap_or_default();
                        let content: String = request.messages[i].content.chars().take(300).collect();
                        format!("its message {} ({role}) differs; it now reads: {content:?}", i + 1)
                    }
                    None if now.len() != record.message_digests.len() => {
                        format!("it has {} messages, the record {}", now.len(), record.message_digests.len())
                    }
                    None => "its messages are the same but its tools, schema or sampling differ".into(),
                };
                format!("model request {number} ({}) does not match its record: {detail}", record.purpose)
            }
        };
        state.divergences.push(why.clone());
        (number, Err(LlmError::Config(format!("replay: {why}"))))
    }
}

/// A live model whose every answer is compared with the record, for `hermes replay --model
/// live`: the run goes on with the live answers, and each request whose recorded answer differs
/// (content or tool calls), or that has no record, is a divergence.
pub struct LiveModel {
    live: std::sync::Arc<dyn ChatModel>,
    record: ReplayModel,
    differences: Mutex<Vec<String>>,
}

impl LiveModel {
    pub fn new(live: std::sync::Arc<dyn ChatModel>, records: Vec<ModelExchange>) -> LiveModel {
        LiveModel { live, record: ReplayModel::new(records), differences: Mutex::default() }
    }

    /// The requests with no record, then the answers that differ from theirs, in words.
    pub fn divergences(&self) -> Vec<String> {
        let mut all = self.record.divergences();
        all.extend(self.differences.lock().expect("live differences").iter().cloned());
        all
    }

    /// Records never asked for.
    pub fn unused(&self) -> Vec<ModelExchange> {
        self.record.unused()
    }

    async fn ask(&self, request: ChatRequest) -> Result<ChatResponse, LlmError> {
        let (number, recorded) = self.record.take(&request);
        let response = self.live.chat(request).await?;
        if let Ok(record) = recorded {
            let was = response_of(&record);
            if let Some(how) = answer_difference(&was, &response) {
                let why = format!("model request {number} ({}): {how}", record.purpose);
                self.differences.lock().expect("live differences").push(why);
            }
        }
        Ok(response)
    }
}

/// How two answers to one request differ, in words; `None` when they say the same (the same
/// text, and the same tool calls with the same arguments as JSON values).
pub fn answer_difference(recorded: &ChatResponse, live: &ChatResponse) -> Option<String> {
    let text = |r: &ChatResponse| r.content.as_deref().unwrap_or_default().trim().to_owned();
    let calls = |r: &ChatResponse| -> Vec<(String, Value)> {
        r.tool_calls
            .iter()
            .map(|c| {
                let args =
                    serde_json::from_str(&c.arguments).unwrap_or_else(|_| Value::String(c.arguments.clone()));
                (c.name.clone(), args)
            })
            .collect()
    };
    let clip = |t: &str| hermes_core::text::clip(t, 200);
    if calls(recorded) != calls(live) {
        let names = |r: &ChatResponse| {
            r.tool_calls
                .iter()
                .map(|c| format!("{}({})", c.name, clip(&c.arguments)))
                .collect::<Vec<_>>()
                .join(", ")
        };
        return Some(format!("the record called [{}], the live model [{}]", names(recorded), names(live)));
    }
    if text(recorded) != text(live) {
        return Some(format!(
            "the record answered {:?}, the live model {:?}",
            clip(&text(recorded)),
            clip(&text(live))
        ));
    }
    None
}

impl ChatModel for LiveModel {
    fn provider(&self) -> &str {
        self.live.provider()
    }

    fn model(&self) -> &str {
        self.live.model()
    }

    fn context_window(&self) -> usize {
        self.live.context_window()
    }

    fn count_tokens(&self, text: &str) -> usize {
        self.live.count_tokens(text)
    }

    fn chat<'a>(&'a self, request: ChatRequest) -> BoxFuture<'a, Result<ChatResponse, LlmError>> {
        Box::pin(self.ask(request))
    }
}

impl ChatModel for ReplayModel {
    fn provider(&self) -> &str {
        "replay"
    }

    fn model(&self) -> &str {
        &self.model
    }

    fn chat<'a>(&'a self, request: ChatRequest) -> BoxFuture<'a, Result<ChatResponse, LlmError>> {
        let answer = self.answer(&request);
        Box::pin(async move { answer })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(user: &str) -> ChatRequest {
        ChatRequest { messages: vec![Message::system("plan it"), Message::user(user)], ..Default::default() }
    }

    fn answer(text: &str) -> ChatResponse {
        ChatResponse {
            content: Some(text.into()),
            finish_reason: "stop".into(),
            model: "m".into(),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn a_recorded_request_is_answered_and_a_changed_one_is_named() {
        let recorded =
            exchange("plan", &request("add 2 and 2"), &answer("{\"nodes\": []}"), Duration::from_millis(5));
        assert_eq!(recorded.message_digests.len(), 2);
        let model = ReplayModel::new(vec![recorded.clone(), recorded]);
        let got = model.chat(request("add 2 and 2")).await.unwrap();
        assert_eq!(got.content.as_deref(), Some("{\"nodes\": []}"));
        assert_eq!(got.finish_reason, "stop");

        let err = model.chat(request("add 2 and 3")).await.unwrap_err().to_string();
        assert!(
            err.contains("model request 2 (plan) does not match its record: its message 2 (user) differs"),
            "{err}"
        );
        assert!(err.contains("add 2 and 3"), "{err}");
        assert_eq!(model.divergences().len(), 1);
        assert_eq!(model.unused().len(), 1);
        // The unused record still answers its own request.
        assert!(model.chat(request("add 2 and 2")).await.is_ok());
        let err = model.chat(request("add 2 and 2")).await.unwrap_err().to_string();
        assert!(err.contains("has no record: the recorded run made only 2 model calls"), "{err}");
    }

    #[test]
    fn the_digest_covers_every_part_of_the_request() {
        let base = request("x");
        let mut warmer = base.clone();
        warmer.temperature = Some(0.5);
        let mut schema = base.clone();
        schema.response_schema = Some(("plan".into(), json!({"type": "object"})));
        let digests = [digest(&base), digest(&warmer), digest(&schema), digest(&request("y"))];
        let unique: std::collections::HashSet<_> = digests.iter().collect();
        assert_eq!(unique.len(), 4);
        assert_eq!(digest(&base), digest(&request("x")));
    }

    #[test]
    fn secrets_in_a_request_are_redacted_in_its_record() {
        let asked = request("use the key sk-live-0123456789abcdefghij to call it");
        let record = exchange("plan", &asked, &answer("ok"), Duration::ZERO);
        assert!(!record.request_json.contains("sk-live-0123456789abcdefghij"), "{}", record.request_json);
        assert_eq!(record.request_digest, digest(&asked));
    }
}
