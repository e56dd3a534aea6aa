//! Outbound webhooks against a real local HTTP receiver: the Standard Webhooks signature checked
//! by a verifier written from the specification in Python's standard library
//! (`scripts/webhook_verify.py`, the lines docs/webhooks.md shows), retries with back-off,
//! `Retry-After`, the DLQ and its replay, `410 Gone`, the address filter, and one goal's
//! deliveries in order across a restart of every service.

use std::time::{Duration, Instant};

use hermes_dispatcher::WebhookConfig;
use hermes_proto::{
    Callback, CreateWebhookRequest, GoalSpec, ListDeadLettersRequest, ListWebhookDeliveriesRequest,
    ListWebhooksRequest, SubmitGoalRequest, TaskPlan,
};
pub(crate) use hermes_test_util::receiver::{Received, Receiver};
use hermes_tests::{Sandbox, node, repo_root};
use serde_json::json;

/// A schedule of `waits` (ms), sent to loopback.
pub(crate) fn config(waits: &[u64]) -> WebhookConfig {
    WebhookConfig {
        schedule: waits.iter().map(|ms| Duration::from_millis(*ms)).collect(),
        timeout: Duration::from_secs(5),
        allow: vec!["127.0.0.1".into()],
    }
}

fn goal(callbacks: Vec<Callback>) -> GoalSpec {
    let plan = TaskPlan {
        nodes: vec![node("sum", "math.evaluate", json!({"expression": "2+3"}), &[])],
        ..Default::default()
    };
    GoalSpec { plan: Some(plan), callbacks, ..Default::default() }
}

fn callback(url: &str) -> Callback {
    Callback { url: url.to_owned(), ..Default::default() }
}

/// Runs the specification's verifier (`scripts/webhook_verify.py`) on a request.
fn verifies(request: &Received, secret: &str, body: &[u8]) -> bool {
    use std::io::Write as _;
    let mut child = std::process::Command::new("python3")
        .arg(repo_root().join("scripts/webhook_verify.py"))
        .env("WEBHOOK_SECRET", secret)
        .env("WEBHOOK_ID", request.header("webhook-id"))
        .env("WEBHOOK_TIMESTAMP", request.header("webhook-timestamp"))
        .env("WEBHOOK_SIGNATURE", request.header("webhook-signature"))
        .stdin(std::process::Stdio::piped())
        .spawn()
        .expect("python3 runs");
    child.stdin.take().unwrap().write_all(body).unwrap();
    child.wait().unwrap().success()
}

async fn deliveries(sandbox: &mut Sandbox, goal_id: &str) -> Vec<hermes_proto::WebhookDelivery> {
    let request = ListWebhookDeliveriesRequest { goal_id: goal_id.into(), ..Default::default() };
    sandbox.client.list_webhook_deliveries(request).await.unwrap().into_inner().deliveries
}

/// Waits until every delivery of the goal is in `state`.
async fn settled(sandbox: &mut Sandbox, goal_id: &str, state: &str) -> Vec<hermes_proto::WebhookDelivery> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let found = deliveries(sandbox, goal_id).await;
        if !found.is_empty() && found.iter().all(|d| d.state == state) {
            return found;
        }
        assert!(Instant::now() < deadline, "deliveries never all {state}: {found:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_goals_callback_is_signed_as_the_specification_says_and_private_addresses_are_refused() {
    let receiver = Receiver::start().await;
    let mut sandbox = Sandbox::builder().webhooks(config(&[0, 200, 200])).start().await;
    let request = SubmitGoalRequest { spec: Some(goal(vec![callback(&receiver.url)])) };
    let reply = sandbox.client.submit_goal(request).await.unwrap().into_inner();
    let secret = reply.callback_secrets.first().expect("the callback's secret is returned").clone();
    assert!(secret.starts_with("whsec_"), "{secret}");

    let request = receiver.requests(1, Duration::from_secs(20)).await.remove(0);
    let events = sandbox.events(&reply.goal_id).await;
    let completed = events
        .iter()
        .find(|e| matches!(e.kind, Some(hermes_proto::event::Kind::GoalCompleted(_))))
        .expect("the goal completed");
    assert_eq!(request.header("webhook-id"), format!("msg_{}_{}", reply.goal_id, completed.seq));
    assert_eq!(request.header("content-type"), "application/json");
    let body = request.json();
    assert_eq!(body["type"], "goal.completed");
    assert_eq!(body["data"]["goal_id"], reply.goal_id.as_str());
    assert_eq!(body["data"]["status"], "completed");
    let timestamp: u64 = request.header("webhook-timestamp").parse().expect("seconds");
    assert!(timestamp.abs_diff(hermes_core::now_unix_ms() / 1000) < 60);

    // The specification's verifier accepts it, and refuses a changed body or another secret.
    assert!(verifies(&request, &secret, &request.body), "the verifier refused {request:?}");
    let mut changed = request.body.to_vec();
    changed[10] ^= 1;
    assert!(!verifies(&request, &secret, &changed));
    assert!(!verifies(&request, &hermes_dispatcher::webhooks::new_secret(), &request.body));

    let recorded = settled(&mut sandbox, &reply.goal_id, "delivered").await;
    assert_eq!(recorded.len(), 1);
    assert_eq!(recorded[0].attempts.len(), 1);
    assert_eq!(recorded[0].attempts[0].status, 200);

    // Cloud metadata is refused by the address filter: no attempt reaches it, and the delivery
    // is dead-lettered at once with the reason.
    let request = SubmitGoalRequest { spec: Some(goal(vec![callback("http://169.254.169.254/latest")])) };
    let refused = sandbox.client.submit_goal(request).await.unwrap().into_inner().goal_id;
    let recorded = settled(&mut sandbox, &refused, "dead_lettered").await;
    assert!(recorded[0].attempts[0].error.contains("refused address"), "{recorded:?}");

    // A malformed callback is refused at submit, naming it.
    let request = SubmitGoalRequest { spec: Some(goal(vec![callback("ftp://example.com/x")])) };
    let err = sandbox.client.submit_goal(request).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("only http and https"), "{}", err.message());
    sandbox.stop().await;
}

#[tokio::test]
async fn failures_back_off_honour_retry_after_and_end_in_the_dlq_whose_replay_delivers() {
    let receiver = Receiver::start().await;
    receiver.answer(&[(503, Some("2")), (500, None), (500, None)]);
    let mut sandbox = Sandbox::builder().webhooks(config(&[0, 300, 300])).start().await;
    let request = SubmitGoalRequest { spec: Some(goal(vec![callback(&receiver.url)])) };
    let goal_id = sandbox.client.submit_goal(request).await.unwrap().into_inner().goal_id;

    let tries = receiver.requests(3, Duration::from_secs(20)).await;
    assert!(tries.iter().all(|t| t.header("webhook-id") == tries[0].header("webhook-id")));
    let gaps: Vec<Duration> = tries.windows(2).map(|w| w[1].at - w[0].at).collect();
    assert!(gaps[0] >= Duration::from_millis(1900), "Retry-After: 2 was not honoured: {gaps:?}");
    assert!(gaps[1] >= Duration::from_millis(250), "the schedule's 300 ms was not waited: {gaps:?}");

    let recorded = settled(&mut sandbox, &goal_id, "dead_lettered").await;
    let statuses: Vec<u32> = recorded[0].attempts.iter().map(|a| a.status).collect();
    assert_eq!(statuses, [503, 500, 500]);
    let letters = sandbox
        .client
        .list_dead_letters(ListDeadLettersRequest { limit: 100 })
        .await
        .unwrap()
        .into_inner()
        .dead_letters;
    let letter = letters.iter().find(|d| d.subject.ends_with(".webhook")).expect("a webhook dead letter");
    assert!(letter.reason.contains("3 attempts"), "{}", letter.reason);

    // `hermes dlq replay`: a new round, delivered (the receiver answers 200 now), same id.
    let replay = hermes_proto::DeadLetterRequest { sequence: letter.sequence };
    sandbox.client.replay_dead_letter(replay).await.unwrap();
    let tries = receiver.requests(4, Duration::from_secs(20)).await;
    assert_eq!(tries[3].header("webhook-id"), tries[0].header("webhook-id"));
    let recorded = settled(&mut sandbox, &goal_id, "delivered").await;
    assert_eq!((recorded[0].round, recorded[0].attempts.len()), (1, 4));
    sandbox.stop().await;
}

#[tokio::test]
async fn gone_disables_a_standing_endpoint() {
    let receiver = Receiver::start().await;
    receiver.answer(&[(410, None)]);
    let mut sandbox = Sandbox::builder().webhooks(config(&[0, 200])).start().await;
    let created = sandbox
        .client
        .create_webhook(CreateWebhookRequest { url: receiver.url.clone(), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert!(created.secret.starts_with("whsec_"));
    let endpoint = created.endpoint.unwrap();
    assert!(endpoint.secrets.is_empty(), "an answer never shows secrets");
    // The standing endpoint is seen by the dispatcher's mirror within a moment.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let first = sandbox.submit(goal(vec![]).plan.unwrap()).await.unwrap();
    receiver.requests(1, Duration::from_secs(20)).await;
    settled(&mut sandbox, &first, "endpoint_gone").await;
    let listed = sandbox.client.list_webhooks(ListWebhooksRequest {}).await.unwrap().into_inner().endpoints;
    assert!(listed[0].disabled && listed[0].disabled_reason.contains("410"), "{listed:?}");

    // Nothing more is sent to it.
    let second = sandbox.submit(goal(vec![]).plan.unwrap()).await.unwrap();
    sandbox.events(&second).await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(receiver.got.lock().unwrap().len(), 1);
    sandbox.stop().await;
}

#[tokio::test]
async fn one_goals_deliveries_arrive_in_order_across_a_restart_of_every_service() {
    let receiver = Receiver::start().await;
    // Down for the first four tries: the goal's later events must wait behind its first.
    receiver.answer(&[(503, None), (503, None), (503, None), (503, None)]);
    let workspace = tempfile::tempdir().unwrap();
    let mut sandbox = Sandbox::builder()
        .workspace(workspace.path())
        .confirm(&["fs.write"], Duration::from_millis(300))
        .webhooks(config(&[0, 400, 400, 400, 400, 400, 400]))
        .start()
        .await;
    // The write waits for approval (goal.needs_input), the approval expires (approval.expired),
    // and the goal fails (goal.failed).
    let plan = TaskPlan {
        nodes: vec![node("w", "fs.write", json!({"path": "x.txt", "content": "x"}), &[])],
        ..Default::default()
    };
    let spec = GoalSpec { plan: Some(plan), callbacks: vec![callback(&receiver.url)], ..Default::default() };
    let goal_id = sandbox
        .client
        .submit_goal(SubmitGoalRequest { spec: Some(spec) })
        .await
        .unwrap()
        .into_inner()
        .goal_id;
    receiver.requests(2, Duration::from_secs(20)).await;
    let mut sandbox = sandbox.restart_services().await;

    let got = receiver.requests(7, Duration::from_secs(30)).await;
    let kinds: Vec<String> = got.iter().map(Received::event_type).collect();
    assert_eq!(kinds[..5], ["goal.needs_input"; 5], "a later event overtook the first: {kinds:?}");
    assert_eq!(kinds[5..7], ["approval.expired", "goal.failed"], "{kinds:?}");
    let recorded = settled(&mut sandbox, &goal_id, "delivered").await;
    assert_eq!(recorded.len(), 3);
    sandbox.stop().await;
}

#[tokio::test]
async fn an_a2a_send_with_a_push_config_has_its_task_pushed_with_its_token() {
    let receiver = Receiver::start().await;
    let sandbox = Sandbox::builder().webhooks(config(&[0, 200])).start().await;
    let plan =
        json!({"nodes": [{"id": "sum", "task_type": "math.evaluate", "inputs": {"expression": "6*7"}}]});
    let send = json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {
        "message": {"messageId": "push-1", "role": "ROLE_USER", "parts": [{"data": plan}]},
        "configuration": {"returnImmediately": true, "pushNotificationConfig": {
            "url": receiver.url, "token": "tok-123",
            "authentication": {"scheme": "Bearer", "credentials": "cred-9"}}}}});
    let answer: serde_json::Value = reqwest::Client::new()
        .post(format!("{}/a2a", sandbox.http_url()))
        .json(&send)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let task_id = answer["result"]["task"]["id"].as_str().unwrap_or_else(|| panic!("{answer}")).to_owned();

    let pushed = receiver.requests(1, Duration::from_secs(20)).await.remove(0);
    assert_eq!(pushed.header("x-a2a-notification-token"), "tok-123");
    assert_eq!(pushed.header("a2a-notification-token"), "tok-123");
    assert_eq!(pushed.header("authorization"), "Bearer cred-9");
    assert!(pushed.header("webhook-signature").starts_with("v1,"), "signed as every webhook is");
    let body = pushed.json();
    assert_eq!(body["task"]["id"], task_id.as_str(), "{body}");
    assert_eq!(body["task"]["status"]["state"], "TASK_STATE_COMPLETED", "{body}");
    assert_eq!(body["task"]["artifacts"][0]["parts"][0]["data"]["value"], 42.0, "{body}");

    // The token and the credentials are kept with the endpoint, not in the goal.
    use prost::Message as _;
    let stored = sandbox.bus.goals().get(task_id.as_str()).await.unwrap().expect("the goal is stored");
    let goal = hermes_proto::GoalState::decode(stored).unwrap();
    let callback = &goal.spec.unwrap().callbacks[0];
    assert_eq!(
        (callback.format.as_str(), callback.token.as_str(), callback.authorization.as_str()),
        ("a2a", "", "")
    );
    sandbox.stop().await;
}

#[tokio::test]
async fn a_tenants_endpoint_is_sent_only_its_own_goals_and_redirects_are_not_followed() {
    use hermes_test_util::api_token as entry;
    use hermes_tests::with_token;
    const A: &str = "webhooks-submitter-a";
    const B: &str = "webhooks-submitter-b";
    let tokens =
        [entry("ci-a", A, "team-a", &["submitter"]), entry("ci-b", B, "team-b", &["submitter"])].concat();
    let (receiver, elsewhere) = (Receiver::start().await, Receiver::start().await);
    let sandbox = Sandbox::builder().api_tokens(&tokens).webhooks(config(&[0])).start().await;
    let mut client = sandbox.client.clone();
    let create = CreateWebhookRequest { url: receiver.url.clone(), ..Default::default() };
    let created = client.create_webhook(with_token(create, B)).await.unwrap().into_inner();
    let id = created.endpoint.unwrap().id;
    // Another tenant neither sees it nor can remove it.
    let listed = client.list_webhooks(with_token(ListWebhooksRequest {}, A)).await.unwrap().into_inner();
    assert!(listed.endpoints.is_empty(), "{listed:?}");
    let request = hermes_proto::WebhookRequest { id: id.clone() };
    let refused = client.delete_webhook(with_token(request, A)).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::NotFound);
    tokio::time::sleep(Duration::from_millis(300)).await;

    // team-a's goal, with a callback that answers with a redirect to another receiver.
    let redirect = Receiver::start().await;
    redirect.answer(&[(302, Some(String::leak(elsewhere.url.clone())))]);
    let spec = GoalSpec { callbacks: vec![callback(&redirect.url)], ..goal(vec![]) };
    let a_goal = client.submit_goal(with_token(SubmitGoalRequest { spec: Some(spec) }, A)).await.unwrap();
    let a_goal = a_goal.into_inner().goal_id;
    sandbox.events_as(&a_goal, A).await;
    // team-b's goal: its endpoint gets it.
    let b_goal =
        client.submit_goal(with_token(SubmitGoalRequest { spec: Some(goal(vec![])) }, B)).await.unwrap();
    let b_goal = b_goal.into_inner().goal_id;
    let got = receiver.requests(1, Duration::from_secs(20)).await;
    assert_eq!(got[0].json()["data"]["goal_id"], b_goal.as_str());
    assert_eq!(got[0].json()["data"]["tenant"], "team-b");
    // The 302 is a failed attempt (the schedule has one): dead-lettered, and nothing followed it.
    redirect.requests(1, Duration::from_secs(20)).await;
    let deliveries = ListWebhookDeliveriesRequest { goal_id: a_goal.clone(), ..Default::default() };
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let found =
            client.list_webhook_deliveries(with_token(deliveries.clone(), A)).await.unwrap().into_inner();
        if found.deliveries.first().is_some_and(|d| d.state == "dead_lettered") {
            assert_eq!(found.deliveries[0].attempts[0].status, 302);
            break;
        }
        assert!(Instant::now() < deadline, "{found:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(receiver.got.lock().unwrap().len(), 1, "team-b's endpoint got team-a's goal");
    assert!(elsewhere.got.lock().unwrap().is_empty());
    // team-a cannot read team-b's deliveries.
    let theirs = ListWebhookDeliveriesRequest { goal_id: b_goal, ..Default::default() };
    let refused = client.list_webhook_deliveries(with_token(theirs, A)).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::NotFound);
    sandbox.stop().await;
}
