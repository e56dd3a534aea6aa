//! The HTTP API through a real HTTP client (reqwest) against the stack `hermes up` runs: goals,
//! idempotency, Server-Sent Events with resumption, the approval inbox, and problem details.

use std::time::Duration;

use futures::StreamExt;
use hermes_tests::Sandbox;
use reqwest::StatusCode;
use serde_json::{Value, json};

fn client() -> reqwest::Client {
    reqwest::Client::builder().timeout(Duration::from_secs(30)).build().unwrap()
}

fn sleep_plan(ms: u64) -> Value {
    json!({
        "nodes": [
            {"id": "nap", "task_type": "time.sleep", "inputs": {"ms": ms}},
            {"id": "sum", "task_type": "math.evaluate",
             "inputs": {"expression": "x + 1", "variables": {"x": 41}}, "depends_on": ["nap"]}
        ],
        "output_node": "sum"
    })
}

async fn post(url: &str, body: &Value) -> (StatusCode, Value) {
    let response = client().post(url).json(body).send().await.unwrap();
    let status = response.status();
    (status, response.json().await.unwrap())
}

async fn get(url: &str) -> (StatusCode, Value) {
    let response = client().get(url).send().await.unwrap();
    let status = response.status();
    (status, response.json().await.unwrap())
}

/// Polls the goal until its status is `status` (canonical JSON enum name).
async fn wait_status(base: &str, goal_id: &str, status: &str) -> Value {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (code, goal) = get(&format!("{base}/v1/goals/{goal_id}")).await;
        assert_eq!(code, StatusCode::OK, "{goal}");
        if goal["status"] == status {
            return goal;
        }
        assert!(std::time::Instant::now() < deadline, "{goal_id} never reached {status}: {goal}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A stack whose `fs.write` calls wait for a person's approval (a minute at most).
async fn writes_need_approval(workspace: &std::path::Path) -> Sandbox {
    Sandbox::builder().workspace(workspace).confirm(&["fs.write"], Duration::from_secs(60)).start().await
}

/// One parsed Server-Sent Event: its `id:` (if any) and its `data:` as JSON.
#[derive(Debug, Clone, PartialEq)]
struct Sse {
    id: Option<u64>,
    data: Value,
}

/// Reads SSE events from `response` until the stream ends or `stop_after` events were read.
async fn read_sse(response: reqwest::Response, stop_after: usize) -> (Vec<Sse>, bool) {
    assert_eq!(response.status(), StatusCode::OK);
    let content_type = response.headers()["content-type"].to_str().unwrap().to_owned();
    assert!(content_type.starts_with("text/event-stream"), "{content_type}");
    let mut body = response.bytes_stream();
    let mut buffer = String::new();
    let mut events = Vec::new();
    while events.len() < stop_after {
        let Some(chunk) =
            tokio::time::timeout(Duration::from_secs(20), body.next()).await.expect("an event within 20 s")
        else {
            return (events, true);
        };
        buffer.push_str(std::str::from_utf8(&chunk.unwrap()).unwrap());
        while let Some(end) = buffer.find("\n\n") {
            let block: String = buffer.drain(..end + 2).collect();
            let (mut id, mut data) = (None, String::new());
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("id:") {
                    id = Some(v.trim().parse().unwrap());
                } else if let Some(v) = line.strip_prefix("data:") {
                    data.push_str(v.trim_start());
                }
            }
            // Comments (heartbeats) carry no data.
            if !data.is_empty() {
                events.push(Sse { id, data: serde_json::from_str(&data).unwrap() });
                if events.len() == stop_after {
                    break;
                }
            }
        }
    }
    (events, false)
}

fn is_terminal(event: &Sse) -> bool {
    ["goalCompleted", "goalFailed", "goalCancelled", "goalNeedsInput"]
        .iter()
        .any(|k| event.data.get(*k).is_some())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn submit_get_list_and_cancel() {
    let t = Sandbox::start().await;
    let base = t.http_url();

    let (code, goal) = post(&format!("{base}/v1/goals"), &json!({"plan": sleep_plan(10)})).await;
    assert_eq!(code, StatusCode::CREATED, "{goal}");
    let done = goal["goalId"].as_str().unwrap().to_owned();
    let goal = wait_status(&base, &done, "GOAL_STATUS_COMPLETED").await;
    assert_eq!(serde_json::from_str::<Value>(goal["outputJson"].as_str().unwrap()).unwrap()["value"], 42.0);

    // A bare plan file, in YAML.
    let yaml =
        std::fs::read_to_string(hermes_tests::repo_root().join("examples/plans/sales-report.yaml")).unwrap();
    let response = client()
        .post(format!("{base}/v1/goals"))
        .header("content-type", "application/yaml")
        .body(yaml)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    let location = response.headers()["location"].to_str().unwrap().to_owned();
    let report: Value = response.json().await.unwrap();
    assert_eq!(location, format!("/v1/goals/{}", report["goalId"].as_str().unwrap()));
    wait_status(&base, report["goalId"].as_str().unwrap(), "GOAL_STATUS_COMPLETED").await;

    let (code, running) = post(&format!("{base}/v1/goals"), &json!({"plan": sleep_plan(30_000)})).await;
    assert_eq!(code, StatusCode::CREATED);
    let running = running["goalId"].as_str().unwrap().to_owned();
    wait_status(&base, &running, "GOAL_STATUS_RUNNING").await;

    let (code, page) = get(&format!("{base}/v1/goals?status=running")).await;
    assert_eq!(code, StatusCode::OK);
    let ids: Vec<&str> =
        page["goals"].as_array().unwrap().iter().map(|g| g["goalId"].as_str().unwrap()).collect();
    assert_eq!(ids, [running.as_str()]);

    // Pagination: one goal a page, newest first, every goal once.
    let mut seen = Vec::new();
    let mut url = format!("{base}/v1/goals?limit=1");
    loop {
        let (code, page) = get(&url).await;
        assert_eq!(code, StatusCode::OK, "{page}");
        seen.extend(
            page["goals"].as_array().unwrap().iter().map(|g| g["goalId"].as_str().unwrap().to_owned()),
        );
        match page["nextPageToken"].as_str().filter(|t| !t.is_empty()) {
            Some(token) => url = format!("{base}/v1/goals?limit=1&page_token={token}"),
            None => break,
        }
    }
    assert_eq!(seen.len(), 3, "{seen:?}");
    assert_eq!(seen[0], running);
    assert!(seen.contains(&done));

    let (code, cancelled) =
        post(&format!("{base}/v1/goals/{running}:cancel"), &json!({"reason": "not needed"})).await;
    assert_eq!(code, StatusCode::OK, "{cancelled}");
    wait_status(&base, &running, "GOAL_STATUS_CANCELLED").await;

    let (code, missing) = get(&format!("{base}/v1/goals/g-nope")).await;
    assert_eq!(code, StatusCode::NOT_FOUND);
    assert_eq!(missing["code"], "NOT_FOUND");
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_idempotency_key_gives_one_goal_sequentially_and_concurrently() {
    let t = Sandbox::start().await;
    let base = t.http_url();
    let submit = |key: &'static str| {
        let url = format!("{base}/v1/goals");
        async move {
            let response = client()
                .post(url)
                .header("Idempotency-Key", key)
                .json(&json!({"plan": sleep_plan(10)}))
                .send()
                .await
                .unwrap();
            let status = response.status();
            let goal: Value = response.json().await.unwrap();
            (status, goal["goalId"].as_str().unwrap().to_owned())
        }
    };
    let (first, id) = submit("nightly-1").await;
    let (again, same) = submit("nightly-1").await;
    assert_eq!((first, again), (StatusCode::CREATED, StatusCode::OK));
    assert_eq!(id, same);

    let answers = futures::future::join_all((0..8).map(|_| submit("burst-1"))).await;
    let ids: std::collections::BTreeSet<&String> = answers.iter().map(|(_, id)| id).collect();
    assert_eq!(ids.len(), 1, "{answers:?}");
    let created = answers.iter().filter(|(s, _)| *s == StatusCode::CREATED).count();
    assert_eq!(created, 1, "{answers:?}");
    assert!(answers.iter().all(|(s, _)| *s == StatusCode::CREATED || *s == StatusCode::OK));

    // The header and the body disagreeing is an error, not a guess.
    let response = client()
        .post(format!("{base}/v1/goals"))
        .header("Idempotency-Key", "a")
        .json(&json!({"plan": sleep_plan(10), "idempotency_key": "b"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn events_stream_from_the_start_and_resume_after_a_drop_with_nothing_missing_or_repeated() {
    let t = Sandbox::start().await;
    let base = t.http_url();
    let (_, goal) = post(&format!("{base}/v1/goals"), &json!({"plan": sleep_plan(1500)})).await;
    let id = goal["goalId"].as_str().unwrap().to_owned();
    let events_url = format!("{base}/v1/goals/{id}/events");

    // Two events, then the client drops the connection mid-goal.
    let (head, ended) = read_sse(client().get(&events_url).send().await.unwrap(), 2).await;
    assert!(!ended);
    assert!(head[0].data.get("goalAccepted").is_some(), "{:?}", head[0]);
    let last_id = head.iter().filter_map(|e| e.id).max().unwrap();

    // Resumed with Last-Event-ID: the rest, to the terminal event, and the stream ends.
    let response =
        client().get(&events_url).header("Last-Event-ID", last_id.to_string()).send().await.unwrap();
    let (tail, ended) = read_sse(response, usize::MAX).await;
    assert!(ended, "the stream ends after the terminal event");
    assert!(is_terminal(tail.last().unwrap()), "{:?}", tail.last());
    assert!(tail.last().unwrap().data.get("goalCompleted").is_some());

    // Against a full replay: exactly the missing events, in order (agent progress events, which
    // have no id, are not part of the numbered sequence).
    let (all, ended) = read_sse(client().get(&events_url).send().await.unwrap(), usize::MAX).await;
    assert!(ended);
    let numbered = |events: &[Sse]| events.iter().filter(|e| e.id.is_some()).cloned().collect::<Vec<_>>();
    let all = numbered(&all);
    let cut = all.iter().position(|e| e.id == Some(last_id)).unwrap();
    assert_eq!(numbered(&tail), all[cut + 1..].to_vec());
    let mut got = numbered(&head);
    got.extend(numbered(&tail));
    assert_eq!(got, all, "head + tail is the whole stream");
    let seqs: Vec<u64> = all.iter().map(|e| e.id.unwrap()).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");

    // `?after=` does the same; after the last one there is nothing more.
    let last = *seqs.last().unwrap();
    let (rest, ended) =
        read_sse(client().get(format!("{events_url}?after={}", seqs[0])).send().await.unwrap(), usize::MAX)
            .await;
    assert!(ended);
    assert_eq!(numbered(&rest), all[1..].to_vec());
    let (nothing, ended) =
        read_sse(client().get(format!("{events_url}?after={last}")).send().await.unwrap(), usize::MAX).await;
    assert!(ended && numbered(&nothing).is_empty(), "{nothing:?}");

    let response = client().get(&events_url).header("Last-Event-ID", "yesterday").send().await.unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_approval_inbox_lists_pending_calls_and_approve_and_deny_decide_them() {
    let workspace = tempfile::tempdir().unwrap();
    let t = writes_need_approval(workspace.path()).await;
    let base = t.http_url();
    let write = |path: &str, content: &str| {
        let node = json!({"id": "w", "task_type": "fs.write", "inputs": {"path": path, "content": content}});
        json!({"plan": {"nodes": [node]}})
    };
    let (_, a) = post(&format!("{base}/v1/goals"), &write("a.txt", "yes")).await;
    // Its content looks like a credential: the inbox shows it redacted.
    let (_, b) = post(&format!("{base}/v1/goals"), &write("b.txt", "Bearer s3cr3t-canary")).await;
    let (a, b) = (a["goalId"].as_str().unwrap().to_owned(), b["goalId"].as_str().unwrap().to_owned());

    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let inbox = loop {
        let (code, inbox) = get(&format!("{base}/v1/approvals")).await;
        assert_eq!(code, StatusCode::OK);
        if inbox["approvals"].as_array().is_some_and(|l| l.len() == 2) {
            break inbox;
        }
        assert!(std::time::Instant::now() < deadline, "two pending approvals: {inbox}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let call_of = |goal: &str| {
        let approval =
            inbox["approvals"].as_array().unwrap().iter().find(|x| x["goalId"] == goal).unwrap().clone();
        assert_eq!(approval["tool"], "fs.write");
        assert!(approval["expiresUnixMs"].as_str().unwrap().parse::<u64>().unwrap() > 0, "{approval}");
        approval["callId"].as_str().unwrap().to_owned()
    };
    let (call_a, call_b) = (call_of(&a), call_of(&b));
    assert!(!inbox.to_string().contains("s3cr3t-canary"), "{inbox}");

    let (code, decision) =
        post(&format!("{base}/v1/approvals/{a}/{call_a}:approve"), &json!({"reason": "looks fine"})).await;
    assert_eq!(code, StatusCode::OK, "{decision}");
    assert_eq!(decision["approved"], true);
    let (code, decision) =
        post(&format!("{base}/v1/approvals/{b}/{call_b}:deny"), &json!({"reason": "no"})).await;
    assert_eq!(code, StatusCode::OK, "{decision}");
    assert!(decision.get("approved").is_none() || decision["approved"] == false, "{decision}");

    wait_status(&base, &a, "GOAL_STATUS_COMPLETED").await;
    wait_status(&base, &b, "GOAL_STATUS_FAILED").await;
    assert_eq!(std::fs::read_to_string(workspace.path().join("a.txt")).unwrap(), "yes");
    assert!(!workspace.path().join("b.txt").exists());
    let (_, inbox) = get(&format!("{base}/v1/approvals")).await;
    assert!(inbox["approvals"].as_array().unwrap().is_empty(), "{inbox}");

    // A second decision does not change the first.
    let (code, again) = post(&format!("{base}/v1/approvals/{a}/{call_a}:deny"), &json!({})).await;
    assert_eq!(code, StatusCode::OK);
    assert_eq!(again["approved"], true);
    let (code, problem) = post(&format!("{base}/v1/approvals/{a}/nope:approve"), &json!({})).await;
    assert_eq!(code, StatusCode::NOT_FOUND, "{problem}");
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_requests_get_problem_details() {
    let t = Sandbox::start().await;
    let base = t.http_url();
    let problem = |response: reqwest::Response| async move {
        let status = response.status();
        let content_type = response.headers()["content-type"].to_str().unwrap().to_owned();
        assert_eq!(content_type, "application/problem+json");
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["status"], status.as_u16(), "{body}");
        (status, body)
    };

    // A cyclic plan: 422 with every problem listed.
    let cyclic = json!({"plan": {"nodes": [
        {"id": "a", "task_type": "time.now", "depends_on": ["b"]},
        {"id": "b", "task_type": "time.now", "depends_on": ["a"]}
    ]}});
    let (status, body) =
        problem(client().post(format!("{base}/v1/goals")).json(&cyclic).send().await.unwrap()).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(body["code"], "PLAN_INVALID");
    assert_eq!(body["type"], "urn:hermes:error:PLAN_INVALID");
    assert!(
        body["problems"].as_array().unwrap().iter().any(|p| p.as_str().unwrap().contains("cycle")),
        "{body}"
    );

    // Malformed JSON and YAML: 400 naming the line and column.
    let response = client()
        .post(format!("{base}/v1/goals"))
        .header("content-type", "application/json")
        .body("{\"plan\": {\"nodes\": [\n  {\"id\": \"a\",, }]}}")
        .send()
        .await
        .unwrap();
    let (status, body) = problem(response).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body["detail"].as_str().unwrap().contains("malformed JSON at line 2 column"), "{body}");
    let response = client()
        .post(format!("{base}/v1/goals"))
        .header("content-type", "application/yaml")
        .body("nodes:\n  - id: a\n    task_type: [time.now\n")
        .send()
        .await
        .unwrap();
    let (status, body) = problem(response).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body["detail"].as_str().unwrap().contains("malformed YAML at line"), "{body}");

    // An unknown field is named, not dropped.
    let (status, body) = problem(
        client().post(format!("{base}/v1/goals")).json(&json!({"txet": "hello"})).send().await.unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body["detail"].as_str().unwrap().contains("txet"), "{body}");

    // Oversized: 413 naming the limit.
    let huge =
        format!("{{\"text\": \"{}\"}}", "x".repeat(hermes_dispatcher::http::DEFAULT_MAX_BODY_BYTES + 10));
    let response = client()
        .post(format!("{base}/v1/goals"))
        .header("content-type", "application/json")
        .body(huge)
        .send()
        .await
        .unwrap();
    let (status, body) = problem(response).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(body["detail"].as_str().unwrap().contains("limit of 1048576 bytes"), "{body}");

    // Text goals without a planner: the reason, with its code.
    let (status, body) = problem(
        client().post(format!("{base}/v1/goals")).json(&json!({"text": "hello"})).send().await.unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(body["code"], "FAILED_PRECONDITION");

    let (status, _) = problem(client().get(format!("{base}/v2/nothing")).send().await.unwrap()).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = problem(client().delete(format!("{base}/v1/goals")).send().await.unwrap()).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    let (status, _) = problem(
        client()
            .post(format!("{base}/v1/goals"))
            .header("content-type", "text/plain")
            .body("hi")
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_websocket_streams_the_same_events_and_resumes_after_a_drop() {
    use tokio_tungstenite::tungstenite::Message;
    let t = Sandbox::start().await;
    let base = t.http_url();
    let (_, goal) = post(&format!("{base}/v1/goals"), &json!({"plan": sleep_plan(1500)})).await;
    let id = goal["goalId"].as_str().unwrap().to_owned();
    let ws_url = |after: Option<u64>| {
        let query = after.map(|a| format!("?after={a}")).unwrap_or_default();
        format!("{}/v1/goals/{id}/ws{query}", base.replacen("http://", "ws://", 1))
    };
    let seq = |event: &Value| event["seq"].as_str().map(|s| s.parse::<u64>().unwrap());

    // Two events, then the client drops.
    let (mut socket, _) = tokio_tungstenite::connect_async(ws_url(None)).await.unwrap();
    let mut head = Vec::new();
    while head.len() < 2 {
        match tokio::time::timeout(Duration::from_secs(20), socket.next()).await.unwrap().unwrap().unwrap() {
            Message::Text(text) => head.push(serde_json::from_str::<Value>(&text).unwrap()),
            _ => continue,
        }
    }
    drop(socket);
    assert!(head[0].get("goalAccepted").is_some(), "{head:?}");
    let last = head.iter().filter_map(seq).max().unwrap();

    // Resumed after the last seq seen: the rest, then a normal close.
    let read_all = |url: String| async move {
        let (mut socket, _) = tokio_tungstenite::connect_async(url).await.unwrap();
        let mut events = Vec::new();
        loop {
            match tokio::time::timeout(Duration::from_secs(20), socket.next()).await.unwrap() {
                Some(Ok(Message::Text(text))) => events.push(serde_json::from_str::<Value>(&text).unwrap()),
                Some(Ok(Message::Close(frame))) => {
                    assert_eq!(u16::from(frame.unwrap().code), 1000);
                    return events;
                }
                Some(Ok(_)) => {}
                other => panic!("the socket ended without a close frame: {other:?}"),
            }
        }
    };
    let tail = read_all(ws_url(Some(last))).await;
    assert!(tail.last().unwrap().get("goalCompleted").is_some(), "{tail:?}");
    let all = read_all(ws_url(None)).await;
    let numbered = |events: &[Value]| events.iter().filter(|e| seq(e).is_some()).cloned().collect::<Vec<_>>();
    let all = numbered(&all);
    let mut got = numbered(&head);
    got.extend(numbered(&tail));
    assert_eq!(got, all, "head + tail is the whole stream, nothing missing or repeated");

    // The same events as the SSE stream.
    let (sse, _) =
        read_sse(client().get(format!("{base}/v1/goals/{id}/events")).send().await.unwrap(), usize::MAX)
            .await;
    let sse: Vec<Value> = sse.into_iter().filter(|e| e.id.is_some()).map(|e| e.data).collect();
    assert_eq!(sse, all);

    // No such goal: a problem before any upgrade; a plain GET: 426.
    let response = client().get(format!("{base}/v1/goals/g-nope/ws")).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    let response = client().get(format!("{base}/v1/goals/{id}/ws")).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::UPGRADE_REQUIRED);
    t.stop().await;
}

/// One client cannot hold more event streams than its cap, over gRPC and HTTP together; the
/// one over the cap is told why, and closing a stream frees its place.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_over_its_watch_cap_is_refused_with_the_reason_and_a_closed_watch_frees_a_place() {
    let mut t = Sandbox::builder().max_watches_per_client(3).start().await;
    let base = t.http_url();
    let (_, goal) = post(&format!("{base}/v1/goals"), &json!({"plan": sleep_plan(30_000)})).await;
    let id = goal["goalId"].as_str().unwrap().to_owned();
    let watch = hermes_proto::WatchGoalRequest { goal_id: id.clone(), after_seq: 0 };
    let first = t.client.watch_goal(watch.clone()).await.unwrap().into_inner();
    let _second = t.client.watch_goal(watch.clone()).await.unwrap().into_inner();
    let sse = client().get(format!("{base}/v1/goals/{id}/events")).send().await.unwrap();
    assert_eq!(sse.status(), StatusCode::OK);

    let refused = t.client.watch_goal(watch.clone()).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted, "{refused:?}");
    assert!(refused.message().contains("LIMIT_EXCEEDED"), "{}", refused.message());
    let response = client().get(format!("{base}/v1/goals/{id}/events")).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    let problem: Value = response.json().await.unwrap();
    assert_eq!(problem["code"], "LIMIT_EXCEEDED");
    assert!(problem["detail"].as_str().unwrap().contains("dispatcher.max_watches_per_client"), "{problem}");

    // Closing one frees its place (once the server has seen the stream go).
    drop(first);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match t.client.watch_goal(watch.clone()).await {
            Ok(_) => break,
            Err(status) if status.code() == tonic::Code::ResourceExhausted => {
                assert!(std::time::Instant::now() < deadline, "the closed watch's place was never freed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(status) => panic!("{status:?}"),
        }
    }
    drop(sse);
    t.stop().await;
}

/// Watchers share the dispatcher's one reader of goal events: 1,200 SSE streams and 100 gRPC
/// watches over 12 goals (more than the events stream's 1,000 consumers could hold, were each
/// its own) hold one consumer between them, and every one gets its goal's whole stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_watchers_of_many_goals_share_one_consumer_and_each_gets_every_event() {
    const GOALS: usize = 12;
    const SSE_PER_GOAL: usize = 100;
    const GRPC: usize = 100;
    let t = Sandbox::builder().max_watches_per_client(10_000).start().await;
    let base = t.http_url();
    let mut goals = Vec::new();
    for _ in 0..GOALS {
        let (code, goal) = post(&format!("{base}/v1/goals"), &json!({"plan": sleep_plan(3_000)})).await;
        assert_eq!(code, StatusCode::CREATED, "{goal}");
        goals.push(goal["goalId"].as_str().unwrap().to_owned());
    }
    let http = reqwest::Client::builder().timeout(Duration::from_secs(60)).build().unwrap();
    let mut sse = tokio::task::JoinSet::new();
    for i in 0..GOALS * SSE_PER_GOAL {
        let (http, url, goal) =
            (http.clone(), format!("{base}/v1/goals/{}/events", goals[i % GOALS]), i % GOALS);
        sse.spawn(async move {
            let response = http.get(url).send().await.unwrap();
            let (events, _) = read_sse(response, usize::MAX).await;
            (goal, events.into_iter().map(|e| e.id.unwrap_or(0)).collect::<Vec<_>>())
        });
    }
    let mut grpc = tokio::task::JoinSet::new();
    for i in 0..GRPC {
        let mut client = t.client.clone();
        let goal_id = goals[i % GOALS].clone();
        grpc.spawn(async move {
            let request = hermes_proto::WatchGoalRequest { goal_id, after_seq: 0 };
            let stream = client.watch_goal(request).await.unwrap().into_inner();
            let events: Vec<_> = stream.map(|e| e.unwrap().seq).collect().await;
            (i % GOALS, events)
        });
    }

    // While they are open, the events stream has one consumer: this dispatcher's reader.
    let sampler = {
        let bus = t.bus.clone();
        tokio::spawn(async move {
            let mut stream = bus.jetstream().get_stream(bus.topology().events_stream()).await.unwrap();
            let mut most = 0;
            for _ in 0..40 {
                most = most.max(stream.info().await.unwrap().state.consumer_count);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            most
        })
    };
    let mut by_goal: Vec<Option<Vec<u64>>> = vec![None; GOALS];
    let mut check = |goal: usize, seqs: Vec<u64>| {
        assert!(seqs.len() >= 4, "goal {goal}: {seqs:?}");
        assert!(seqs.windows(2).all(|w| w[0] == 0 || w[1] == 0 || w[0] < w[1]), "goal {goal}: {seqs:?}");
        match &by_goal[goal] {
            Some(first) => assert_eq!(first, &seqs, "goal {goal}: two watchers saw different streams"),
            None => by_goal[goal] = Some(seqs),
        }
    };
    while let Some(done) = sse.join_next().await {
        let (goal, seqs) = done.unwrap();
        check(goal, seqs);
    }
    while let Some(done) = grpc.join_next().await {
        let (goal, seqs) = done.unwrap();
        check(goal, seqs);
    }
    let most = sampler.await.unwrap();
    assert_eq!(most, 1, "{most} consumers on the events stream while the watches were open");
    t.stop().await;
}

/// An output kept by reference is fetched over HTTP from its goal (and only from its goal), and
/// the A2A task names it by that URL.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_output_kept_by_reference_is_served_from_its_goal_and_named_by_the_a2a_task() {
    let workspace = tempfile::tempdir().unwrap();
    let text = "a line of a large file\n".repeat(10_000);
    std::fs::write(workspace.path().join("big.txt"), &text).unwrap();
    let t = Sandbox::builder().workspace(workspace.path()).start().await;
    let base = t.http_url();
    let read = json!({"nodes": [{"id": "read", "task_type": "fs.read", "inputs": {"path": "big.txt"}}]});
    let (_, goal) = post(&format!("{base}/v1/goals"), &json!({"plan": read})).await;
    let id = goal["goalId"].as_str().unwrap().to_owned();
    let goal = wait_status(&base, &id, "GOAL_STATUS_COMPLETED").await;
    let stub: Value = serde_json::from_str(goal["outputJson"].as_str().unwrap()).unwrap();
    let reference = stub["$artifact"].as_str().expect("the output is a stub").to_owned();

    let response = client().get(format!("{base}/v1/goals/{id}/artifacts/{reference}")).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["content-type"], "application/json");
    let output: Value = response.json().await.unwrap();
    assert_eq!(output["text"], text.as_str());

    // Another goal does not reach it.
    let (_, other) = post(&format!("{base}/v1/goals"), &json!({"plan": sleep_plan(10)})).await;
    let other = other["goalId"].as_str().unwrap();
    let (code, problem) = get(&format!("{base}/v1/goals/{other}/artifacts/{reference}")).await;
    assert_eq!(code, StatusCode::NOT_FOUND, "{problem}");

    let rpc = json!({"jsonrpc": "2.0", "id": 7, "method": "GetTask", "params": {"id": id}});
    let (code, answer) = post(&format!("{base}/a2a"), &rpc).await;
    assert_eq!(code, StatusCode::OK);
    assert_eq!(answer["id"], 7);
    let task = &answer["result"];
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{answer}");
    let part = &task["artifacts"][0]["parts"][0];
    assert_eq!(part["url"], format!("{base}/v1/goals/{id}/artifacts/{reference}"));
    assert_eq!(part["mediaType"], "application/json");
    t.stop().await;
}

/// JSON-RPC errors of the A2A endpoint: malformed JSON, an unknown method, an unknown task, a
/// version not served, each with its A2A code.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a2a_requests_that_cannot_be_served_get_json_rpc_errors_with_their_codes() {
    let t = Sandbox::start().await;
    let url = format!("{}/a2a", t.http_url());
    let response = client()
        .post(&url)
        .header("content-type", "application/json")
        .body("{\"jsonrpc\": ")
        .send()
        .await
        .unwrap();
    let error: Value = response.json().await.unwrap();
    assert_eq!(error["error"]["code"], -32700, "{error}");
    assert!(error["error"]["message"].as_str().unwrap().contains("line 1 column"), "{error}");

    let (_, error) = post(&url, &json!({"jsonrpc": "2.0", "id": "a", "method": "Frobnicate"})).await;
    assert_eq!(error["error"]["code"], -32601, "{error}");
    assert_eq!(error["id"], "a");

    let get_task = json!({"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "g-nothing"}});
    let (_, error) = post(&url, &get_task).await;
    assert_eq!(error["error"]["code"], -32001, "{error}");

    let response = client().post(&url).header("a2a-version", "0.3").json(&get_task).send().await.unwrap();
    let error: Value = response.json().await.unwrap();
    assert_eq!(error["error"]["code"], -32009, "{error}");

    let no_id = json!({"jsonrpc": "2.0", "id": 2, "method": "SendMessage",
        "params": {"message": {"role": "ROLE_USER", "parts": [{"text": "hi"}]}}});
    let (_, error) = post(&url, &no_id).await;
    assert_eq!(error["error"]["code"], -32602, "{error}");
    assert!(error["error"]["message"].as_str().unwrap().contains("messageId"), "{error}");
    t.stop().await;
}

/// Agents (the registry's view) and memory sessions, read over HTTP.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn agents_and_memory_sessions_are_read_over_http() {
    use hermes_proto::{AppendTurnRequest, SessionTurn};
    let t = Sandbox::builder().memory(Default::default()).start().await;
    let base = t.http_url();
    let grpc = t.stack.as_ref().unwrap().grpc_url();
    let mut memory = hermes_proto::memory_client::MemoryClient::connect(grpc).await.unwrap();
    for (role, content) in [("user", "What were April's sales?"), ("assistant", "1,240 units.")] {
        let turn = SessionTurn {
            session_id: "sales.chat".into(),
            role: role.into(),
            content: content.into(),
            ..Default::default()
        };
        memory.append_turn(AppendTurnRequest { turn: Some(turn), ..Default::default() }).await.unwrap();
    }

    let (code, page) = get(&format!("{base}/v1/sessions")).await;
    assert_eq!(code, StatusCode::OK, "{page}");
    let ids: Vec<&str> =
        page["sessions"].as_array().unwrap().iter().map(|s| s["sessionId"].as_str().unwrap()).collect();
    assert_eq!(ids, ["sales.chat"]);
    let (code, session) = get(&format!("{base}/v1/sessions/sales.chat")).await;
    assert_eq!(code, StatusCode::OK);
    assert_eq!(session["totalTurns"], "2");
    assert_eq!(session["turns"][1]["content"], "1,240 units.");
    let (code, problem) = get(&format!("{base}/v1/sessions/bad%20id")).await;
    assert_eq!(code, StatusCode::BAD_REQUEST, "{problem}");

    let (code, agents) = get(&format!("{base}/v1/agents")).await;
    assert_eq!(code, StatusCode::OK, "{agents}");
    let agents = agents["agents"].as_array().unwrap();
    assert!(!agents.is_empty());
    for agent in agents {
        assert_eq!(agent["online"], true, "{agent}");
        assert!(
            agent["heartbeat"]["taskTypes"].as_array().unwrap().iter().any(|t| t == "math.evaluate"),
            "{agent}"
        );
    }
    t.stop().await;
}

/// `GET /v1/changes`: a goal's creation and status changes and its approvals as they happen,
/// which the console follows instead of polling.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_changes_stream_reports_goals_and_approvals_as_they_change() {
    let workspace = tempfile::tempdir().unwrap();
    let t = writes_need_approval(workspace.path()).await;
    let base = t.http_url();
    let changes = client().get(format!("{base}/v1/changes")).send().await.unwrap();
    let node = json!({"id": "w", "task_type": "fs.write", "inputs": {"path": "c.txt", "content": "x"}});
    let (code, goal) = post(&format!("{base}/v1/goals"), &json!({"plan": {"nodes": [node]}})).await;
    assert_eq!(code, StatusCode::CREATED, "{goal}");
    let goal = goal["goalId"].as_str().unwrap().to_owned();
    let reader = tokio::spawn(read_sse(changes, 3));
    // The approval is asked for; approve it.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let call = loop {
        let (_, inbox) = get(&format!("{base}/v1/approvals")).await;
        if let Some(call) = inbox["approvals"].as_array().and_then(|l| l.first()) {
            break call["callId"].as_str().unwrap().to_owned();
        }
        assert!(std::time::Instant::now() < deadline, "no approval asked for");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let (code, _) = post(&format!("{base}/v1/approvals/{goal}/{call}:approve"), &json!({})).await;
    assert_eq!(code, StatusCode::OK);
    let (events, _) = reader.await.unwrap();
    // The goal's creation, the approval asked for, the approval decided (the completion may
    // come before the decision's change is read, so it is looked for below).
    assert_eq!(events[0].data["goalId"], goal.as_str(), "{events:?}");
    assert_eq!(events[0].data["status"], "GOAL_STATUS_RUNNING", "{events:?}");
    let approvals: Vec<&Sse> = events.iter().filter(|e| e.data.get("callId").is_some()).collect();
    assert!(!approvals.is_empty(), "no approval change: {events:?}");
    assert!(approvals.iter().all(|a| a.data["callId"] == call.as_str()), "{events:?}");
    wait_status(&base, &goal, "GOAL_STATUS_COMPLETED").await;
    t.stop().await;
}
