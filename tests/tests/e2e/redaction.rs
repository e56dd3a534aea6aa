//! Redaction over the whole message, as a property: secret-shaped values, made fresh for each
//! case, in every field a client sets on a submit (goal text, labels by key and by value, session
//! id, idempotency key, plan inputs, the A2A message's id and context) never come back on any
//! stream or view a principal without the `secrets` role reads: WatchGoal, GetGoal, ListGoals,
//! SSE, the WebSocket, the A2A task (GetTask) and its stream (SubscribeToTask).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use hermes_proto::{GetGoalRequest, GoalSpec, ListGoalsRequest, SubmitGoalRequest, TaskPlan};
use hermes_test_util::scripted::{ScriptedLlm, ScriptedResponse};
use hermes_tests::{Sandbox, node, with_token};
use serde_json::{Value, json};

use crate::planning::{PLANNER, SUMMARIZER, answer};

const SUBMITTER: &str = "token-redaction-submitter";

/// A small deterministic generator, seeded per run and printed, so a failing case can be rerun.
struct Rng(hermes_test_util::XorShift);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0.next_u64()
    }

    fn word(&mut self, len: usize) -> String {
        const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
        (0..len).map(|_| ALPHABET[(self.next() % ALPHABET.len() as u64) as usize] as char).collect()
    }
}

/// A secret shape the rules know, as (the value a client sends, the part of it that must never
/// come back). `dotted`: only shapes that fit an id of `[A-Za-z0-9._-]` (session ids).
fn shaped(rng: &mut Rng, dotted: bool) -> (String, String) {
    let len = 20 + (rng.next() % 12) as usize;
    let secret = rng.word(len);
    let choices = if dotted { 1 } else { 4 };
    match rng.next() % choices {
        0 => {
            let key = format!("sk-{secret}");
            (key.clone(), key)
        }
        1 => (format!("Bearer {secret}"), secret),
        2 => (format!("see password={secret} here"), secret),
        _ => (format!("{{\"api_key\": \"{secret}\"}}"), secret),
    }
}

/// Every line of an SSE response until the stream ends.
async fn sse(http: &reqwest::Client, url: String) -> String {
    let response = http.get(url).bearer_auth(SUBMITTER).send().await.unwrap();
    assert!(response.status().is_success(), "{}", response.status());
    tokio::time::timeout(Duration::from_secs(30), response.text()).await.expect("the stream ends").unwrap()
}

async fn websocket(base: &str, goal_id: &str) -> String {
    use tokio_tungstenite::tungstenite::Message;
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let url = format!("{}/v1/goals/{goal_id}/ws", base.replacen("http://", "ws://", 1));
    let mut request = url.into_client_request().unwrap();
    request.headers_mut().insert("authorization", format!("Bearer {SUBMITTER}").parse().unwrap());
    let (mut socket, _) = tokio_tungstenite::connect_async(request).await.unwrap();
    let mut said = String::new();
    while let Some(message) = tokio::time::timeout(Duration::from_secs(30), socket.next()).await.unwrap() {
        match message.unwrap() {
            Message::Text(text) => said.push_str(&text),
            Message::Close(_) => break,
            _ => {}
        }
    }
    said
}

/// One JSON-RPC call (a stream is read to its end); `after`: a `Last-Event-ID`, so a stream
/// replays the task's events from there.
async fn a2a(http: &reqwest::Client, base: &str, method: &str, params: Value, after: Option<u64>) -> String {
    let rpc = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
    let mut request = http.post(format!("{base}/a2a")).bearer_auth(SUBMITTER).json(&rpc);
    if let Some(after) = after {
        request = request.header("last-event-id", after.to_string());
    }
    let response = request.send().await.unwrap();
    assert!(response.status().is_success(), "{method}: {}", response.status());
    let said =
        tokio::time::timeout(Duration::from_secs(30), response.text()).await.expect("answered").unwrap();
    assert!(!said.contains("\"error\""), "{method}: {said}");
    said
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn secret_shaped_values_in_any_submit_field_come_back_on_no_stream() {
    let seed = std::env::var("HERMES_REDACTION_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64 | 1);
    eprintln!("HERMES_REDACTION_SEED={seed}");
    let mut rng = Rng(hermes_test_util::XorShift(seed));
    const CASES: usize = 3;

    let llm = ScriptedLlm::start().await;
    let plan = json!({"nodes": [{"id": "one", "task_type": "math.evaluate", "inputs": {"expression": "1 + 1"}}],
        "output_node": "one"});
    // Two text goals a case: one over gRPC, one over A2A.
    for _ in 0..CASES * 2 {
        llm.push(PLANNER, ScriptedResponse::content(plan.to_string()));
        llm.push(SUMMARIZER, answer("It is 2.", &["one"]));
    }
    let workspace = tempfile::tempdir().unwrap();
    let tokens = hermes_test_util::api_token("ci", SUBMITTER, "team-r", &["submitter", "viewer"]);
    let t =
        Sandbox::builder().llm(llm.base_url()).api_tokens(&tokens).workspace(workspace.path()).start().await;
    let base = t.http_url();
    let http = reqwest::Client::builder().timeout(Duration::from_secs(60)).build().unwrap();
    let mut client = t.client.clone();

    for case in 0..CASES {
        // (field, value, what must not come back)
        let mut planted: Vec<(&str, String, String)> = Vec::new();
        let mut plant = |field: &'static str, rng: &mut Rng, dotted: bool| {
            let (value, secret) = shaped(rng, dotted);
            planted.push((field, value.clone(), secret));
            value
        };
        let content = plant("plan input", &mut rng, false);
        let note = plant("label value", &mut rng, false);
        let session = plant("session id", &mut rng, true);
        let key = plant("idempotency key", &mut rng, false);
        let text = format!("add one and one; {}", plant("goal text", &mut rng, false));
        let text_session = plant("text goal's session id", &mut rng, true);
        let message_id = plant("A2A message id", &mut rng, true);
        let context = plant("A2A context id", &mut rng, true);
        let a2a_text = format!("add one and one; {}", plant("A2A text", &mut rng, false));
        let label_key_value = rng.word(24);
        planted.push(("the value of an api_key label", label_key_value.clone(), label_key_value.clone()));

        let labels = [("api_key".to_owned(), label_key_value), ("note".to_owned(), note)].into();
        let planned = GoalSpec {
            plan: Some(TaskPlan {
                nodes: vec![node(
                    "w",
                    "fs.write",
                    json!({"path": format!("case-{case}.txt"), "content": content}),
                    &[],
                )],
                ..Default::default()
            }),
            labels,
            session_id: session,
            idempotency_key: key,
            ..Default::default()
        };
        let spoken = GoalSpec { text, session_id: text_session, ..Default::default() };
        let mut goals = Vec::new();
        for spec in [planned, spoken] {
            let submitted = client
                .submit_goal(with_token(SubmitGoalRequest { spec: Some(spec) }, SUBMITTER))
                .await
                .expect("the submit is accepted")
                .into_inner();
            goals.push(submitted.goal_id);
        }
        // Over A2A, streamed: the task, then its events to the end.
        let message = json!({"message": {"messageId": message_id, "contextId": context, "role": "ROLE_USER",
            "parts": [{"text": a2a_text}]}});
        let streamed = a2a(&http, &base, "SendStreamingMessage", message, None).await;
        let first = streamed.lines().find_map(|l| l.strip_prefix("data:")).expect("a first answer");
        let first: Value = serde_json::from_str(first.trim()).unwrap();
        goals.push(
            first["result"]["task"]["id"].as_str().unwrap_or_else(|| panic!("a task: {first}")).to_owned(),
        );
        assert!(
            streamed.contains("TASK_STATE_COMPLETED"),
            "the stream follows the task to its end: {streamed}"
        );

        let mut seen: Vec<(String, String)> = vec![("A2A SendStreamingMessage".into(), streamed)];
        for goal_id in &goals {
            let events = t.events_as(goal_id, SUBMITTER).await;
            assert!(
                events
                    .last()
                    .is_some_and(|e| matches!(e.kind, Some(hermes_proto::event::Kind::GoalCompleted(_)))),
                "case {case}: {goal_id} completes: {events:?}"
            );
            seen.push((format!("WatchGoal {goal_id}"), format!("{events:?}")));
            let goal = client
                .get_goal(with_token(GetGoalRequest { goal_id: goal_id.clone() }, SUBMITTER))
                .await
                .unwrap()
                .into_inner();
            seen.push((format!("GetGoal {goal_id}"), format!("{goal:?}")));
            let body =
                http.get(format!("{base}/v1/goals/{goal_id}")).bearer_auth(SUBMITTER).send().await.unwrap();
            seen.push((format!("GET /v1/goals/{goal_id}"), body.text().await.unwrap()));
            seen.push((
                format!("SSE {goal_id}"),
                sse(&http, format!("{base}/v1/goals/{goal_id}/events")).await,
            ));
            seen.push((format!("WebSocket {goal_id}"), websocket(&base, goal_id).await));
            let id = json!({"id": goal_id});
            seen.push((
                format!("A2A GetTask {goal_id}"),
                a2a(&http, &base, "GetTask", id.clone(), None).await,
            ));
            for after in [None, Some(0)] {
                let said = a2a(&http, &base, "SubscribeToTask", id.clone(), after).await;
                seen.push((format!("A2A SubscribeToTask {goal_id} after {after:?}"), said));
            }
        }
        let listed =
            client.list_goals(with_token(ListGoalsRequest::default(), SUBMITTER)).await.unwrap().into_inner();
        seen.push(("ListGoals".into(), format!("{listed:?}")));
        let listed = http.get(format!("{base}/v1/goals")).bearer_auth(SUBMITTER).send().await.unwrap();
        seen.push(("GET /v1/goals".into(), listed.text().await.unwrap()));

        // The agent got the plan input whole: redaction is of what clients read, not of the work.
        let written = std::fs::read_to_string(workspace.path().join(format!("case-{case}.txt"))).unwrap();
        assert_eq!(written, planted[0].1, "case {case}: the agent got its input whole");
        for (field, value, secret) in &planted {
            for (door, said) in &seen {
                assert!(
                    !said.contains(secret.as_str()),
                    "seed {seed}, case {case}: {field} ({value:?}) came back on {door}: {}",
                    said.chars().take(2000).collect::<String>()
                );
            }
        }
    }
    t.stop().await;
}
