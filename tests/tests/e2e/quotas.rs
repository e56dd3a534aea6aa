//! Per-tenant quotas, over gRPC and HTTP: a burst over the submit rate, a full running-goals
//! quota and a spent daily token budget are each `LIMIT_EXCEEDED` (`RESOURCE_EXHAUSTED` with
//! `retry-after`, HTTP 429 with `Retry-After`), store nothing, and leave other tenants alone.

use std::time::Duration;

use hermes_proto::{CancelGoalRequest, GoalSpec, ListGoalsRequest, SubmitGoalRequest};
use hermes_test_util::scripted::{ScriptedLlm, ScriptedResponse};
use hermes_tests::{Sandbox, node, with_token};
use reqwest::StatusCode;
use serde_json::{Value, json};

const RATED: &str = "token-rated";
const BUSY: &str = "token-busy";
const THRIFTY: &str = "token-thrifty";
const FREE: &str = "token-free";
const GOLD: &str = "token-gold";
const TIN: &str = "token-tin";

fn tokens() -> String {
    let entry = |name: &str, token: &str, tenant: &str| {
        hermes_test_util::api_token(name, token, tenant, &["submitter", "viewer"])
    };
    [
        entry("rated", RATED, "team-rated"),
        entry("busy", BUSY, "team-busy"),
        entry("thrifty", THRIFTY, "team-thrifty"),
        entry("free", FREE, "team-free"),
        entry("gold", GOLD, "team-gold"),
        entry("tin", TIN, "team-tin"),
        "[[tenant]]\nname = \"team-gold\"\nweight = 3\n\n".into(),
        "[[tenant]]\nname = \"team-rated\"\nsubmits_per_second = 0.2\nsubmit_burst = 2\n\n".into(),
        "[[tenant]]\nname = \"team-busy\"\nmax_running_goals = 2\n\n".into(),
        "[[tenant]]\nname = \"team-thrifty\"\ndaily_tokens = 100\n\n".into(),
    ]
    .concat()
}

fn nap(ms: u64) -> GoalSpec {
    GoalSpec {
        plan: Some(hermes_proto::TaskPlan {
            nodes: vec![node("nap", "time.sleep", json!({"ms": ms}), &[])],
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Submits over gRPC; the goal id, or the refusal's status.
async fn submit(t: &Sandbox, token: &str, spec: GoalSpec) -> Result<String, tonic::Status> {
    let request = with_token(SubmitGoalRequest { spec: Some(spec) }, token);
    Ok(t.client.clone().submit_goal(request).await?.into_inner().goal_id)
}

fn retry_after(status: &tonic::Status) -> u64 {
    status.metadata().get("retry-after").expect("retry-after metadata").to_str().unwrap().parse().unwrap()
}

async fn goals_of(t: &Sandbox, token: &str) -> usize {
    let request = with_token(ListGoalsRequest::default(), token);
    t.client.clone().list_goals(request).await.unwrap().into_inner().goals.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_burst_over_the_submit_rate_and_a_full_running_quota_are_refused_with_retry_after() {
    let t = Sandbox::builder().api_tokens(&tokens()).start().await;
    let http = reqwest::Client::builder().timeout(Duration::from_secs(30)).build().unwrap();
    let base = t.http_url();

    // The rate: a burst of 2, then one every 5 s.
    submit(&t, RATED, nap(1)).await.unwrap();
    submit(&t, RATED, nap(1)).await.unwrap();
    let refused = submit(&t, RATED, nap(1)).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted, "{refused:?}");
    assert!(
        refused.message().contains("LIMIT_EXCEEDED") && refused.message().contains("team-rated"),
        "{refused:?}"
    );
    assert!((1..=5).contains(&retry_after(&refused)), "{refused:?}");
    let response = http
        .post(format!("{base}/v1/goals"))
        .bearer_auth(RATED)
        .json(&json!({"plan": {"nodes": [{"id": "nap", "task_type": "time.sleep", "inputs": {"ms": 1}}]}}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    let wait: u64 = response.headers()["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=5).contains(&wait), "{wait}");
    let problem: Value = response.json().await.unwrap();
    assert_eq!(problem["code"], "LIMIT_EXCEEDED");
    assert_eq!(goals_of(&t, RATED).await, 2, "a refused submit stores nothing");
    // Another tenant is not slowed by it.
    for _ in 0..5 {
        submit(&t, FREE, nap(1)).await.unwrap();
    }

    // Running goals: two may run; the third waits for one to end.
    let first = submit(&t, BUSY, nap(30_000)).await.unwrap();
    let second = submit(&t, BUSY, nap(30_000)).await.unwrap();
    let refused = submit(&t, BUSY, nap(1)).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted, "{refused:?}");
    assert!(refused.message().contains("2 goals running"), "{refused:?}");
    assert!(retry_after(&refused) >= 1);
    let response = http
        .post(format!("{base}/v1/goals"))
        .bearer_auth(BUSY)
        .json(&json!({"plan": {"nodes": [{"id": "nap", "task_type": "time.sleep", "inputs": {"ms": 1}}]}}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(response.headers().contains_key("retry-after"));
    // A retried submit of an admitted goal is not a new goal, and is not refused.
    let keyed = GoalSpec { idempotency_key: "k1".into(), ..nap(1) };
    let cancel = CancelGoalRequest { goal_id: first.clone(), reason: "make room".into() };
    t.client.clone().cancel_goal(with_token(cancel, BUSY)).await.unwrap();
    let admitted = submit(&t, BUSY, keyed.clone()).await.unwrap();
    assert_eq!(submit(&t, BUSY, keyed).await.unwrap(), admitted);
    let cancel = CancelGoalRequest { goal_id: second, reason: "done".into() };
    t.client.clone().cancel_goal(with_token(cancel, BUSY)).await.unwrap();
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_spent_daily_token_budget_stops_new_goals_until_midnight() {
    let llm = ScriptedLlm::start().await;
    llm.push("agent-model", ScriptedResponse::content("Done.").with_usage(90, 30));
    let t = Sandbox::builder().api_tokens(&tokens()).llm(llm.base_url()).start().await;
    let think = GoalSpec {
        plan: Some(hermes_proto::TaskPlan {
            nodes: vec![node("think", "agent.run", json!({"instruction": "Say done"}), &[])],
            ..Default::default()
        }),
        ..Default::default()
    };
    let goal_id = submit(&t, THRIFTY, think).await.unwrap();
    t.events_as(&goal_id, THRIFTY).await;
    // 120 tokens of a 100-token day: the next goal is refused, until the next UTC day.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let refused = loop {
        match submit(&t, THRIFTY, nap(1)).await {
            Err(status) => break status,
            Ok(_) if std::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Ok(id) => panic!("goal {id} was accepted over the daily budget"),
        }
    };
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted, "{refused:?}");
    assert!(refused.message().contains("used 120 of its 100 LLM tokens today"), "{refused:?}");
    let wait = retry_after(&refused);
    let now_s = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    assert!(wait.abs_diff(86_400 - now_s % 86_400) <= 2, "{wait} s is not the time to the next UTC day");
    // Over HTTP too: 429 with the same Retry-After.
    let response = reqwest::Client::new()
        .post(format!("{}/v1/goals", t.http_url()))
        .bearer_auth(THRIFTY)
        .json(&json!({"plan": {"nodes": [{"id": "nap", "task_type": "time.sleep", "inputs": {"ms": 1}}]}}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    let http_wait: u64 = response.headers()["retry-after"].to_str().unwrap().parse().unwrap();
    assert!(http_wait.abs_diff(wait) <= 2, "{http_wait} against {wait}");
    // Another tenant still submits.
    submit(&t, FREE, nap(1)).await.unwrap();
    t.stop().await;
}

/// Fair dispatch: a flood of one tenant's goals waits in its lane of the pool, and another
/// tenant's goal, submitted after the flood, is served in turn instead of after all of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn another_tenants_goal_is_served_in_turn_not_after_a_flood() {
    let t = Sandbox::builder().api_tokens(&tokens()).agents(1).max_concurrency(2).start().await;
    // team-busy may run 2 goals at once; team-free has no quota: flood from team-free.
    // 60 naps of 200 ms on 2 slots take 6 s: far longer than submitting them, even on a loaded
    // machine, so the flood is still queued when the other tenant's goal comes.
    let mut flood = Vec::new();
    for _ in 0..60 {
        flood.push(submit(&t, FREE, nap(200)).await.unwrap());
    }
    let calm = submit(&t, THRIFTY, nap(1)).await.unwrap();
    t.events_as(&calm, THRIFTY).await;
    let request = with_token(ListGoalsRequest { limit: 100 }, FREE);
    let goals = t.client.clone().list_goals(request).await.unwrap().into_inner().goals;
    let done = goals.iter().filter(|g| g.status == hermes_proto::GoalStatus::Completed as i32).count();
    // Without lanes the calm goal would wait behind all 60.
    assert!(done < 20, "{done} of the flood's 60 goals ended before the other tenant's one goal");
    for goal_id in flood {
        t.events_as(&goal_id, FREE).await;
    }
    t.stop().await;
}

/// Weighted fair dispatch: two tenants flood one agent, team-gold of weight 3 and team-tin of
/// the default weight 1. While both have tasks waiting in their lanes, the lanes' tasks complete
/// 3:1, within 10%.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn flooding_tenants_share_the_slots_by_their_weights() {
    use futures::StreamExt as _;
    use hermes_proto::event::Kind;
    const GOALS: usize = 100;
    let t = Sandbox::builder().api_tokens(&tokens()).agents(1).max_concurrency(2).start().await;
    // Interleaved, 16 at a time, so both floods arrive together. 200 naps of 80 ms on 2 slots
    // take 8 s; submitting them takes far less, so both lanes are still full when it ends.
    let submits = (0..2 * GOALS).map(|i| {
        let token = if i % 2 == 0 { GOLD } else { TIN };
        let t = &t;
        async move { (token, submit(t, token, nap(80)).await.unwrap()) }
    });
    let goals: Vec<(&str, String)> = futures::stream::iter(submits).buffer_unordered(16).collect().await;
    let submitted_at = hermes_core::now_unix_ms();
    // Each goal's one task: whether it waited in its tenant's lane (no agent chosen), and when
    // it completed.
    let mut pooled = Vec::new();
    for (token, goal_id) in &goals {
        let events = t.events_as(goal_id, token).await;
        let dispatched = events.iter().find_map(|e| match &e.kind {
            Some(Kind::TaskDispatched(d)) => Some(d.clone()),
            _ => None,
        });
        let dispatched = dispatched.expect("the task was dispatched");
        let completed = events.iter().find(|e| matches!(e.kind, Some(Kind::TaskSucceeded(_))));
        let completed = completed.expect("the task succeeded").at_unix_ms;
        if dispatched.agent_id.is_empty() {
            let tenant = if *token == GOLD { "team-gold" } else { "team-tin" };
            assert_eq!(dispatched.subject, format!("hermes.task.lane.{tenant}.time.sleep"));
            pooled.push((completed, *token));
        }
    }
    pooled.sort();
    // From the end of the submits (no task arrives after it) until team-gold's lane runs dry,
    // both lanes held work. Its last few tasks are already pulled by the agent (a pull batch
    // and the one it holds for the next free slot) while its lane on the server is empty, so the
    // window ends 5 tasks before team-gold's last.
    let gold_times: Vec<u64> = pooled.iter().filter(|(_, token)| *token == GOLD).map(|(at, _)| *at).collect();
    let gold_end = gold_times[gold_times.len().saturating_sub(5)];
    let window: Vec<&str> = pooled
        .iter()
        .filter(|(at, _)| *at > submitted_at && *at <= gold_end)
        .map(|(_, token)| *token)
        .collect();
    let gold = window.iter().filter(|token| **token == GOLD).count();
    let tin = window.len() - gold;
    assert!(gold >= 40, "too few tasks completed after the submits to measure ({gold} of team-gold's)");
    let ratio = gold as f64 / tin.max(1) as f64;
    eprintln!("while both flooded, team-gold:team-tin completed {gold}:{tin} ({ratio:.2}:1)");
    assert!(
        (2.7..=3.3).contains(&ratio),
        "team-gold's and team-tin's tasks completed {gold}:{tin} ({ratio:.2}:1) while both flooded, not 3:1"
    );
    t.stop().await;
}

/// A place left held by a dispatcher that died before it released it (its goal ended, or was
/// never stored) is given back by the next scan of the goals, here a restarted dispatcher's.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn running_goal_places_of_goals_that_are_gone_are_given_back() {
    let t = Sandbox::builder().api_tokens(&tokens()).start().await;
    let tenants = t.bus.jetstream().get_key_value("hermes_tenants").await.unwrap();
    // Two places held for goals that do not run. Taken just now, they are within the scans'
    // grace, so the start-up scan of this dispatcher (in the background, maybe still to come)
    // keeps them and they hold the tenant's quota.
    let ghosts = |at: u64| json!({"g-ghost-1": at, "g-ghost-2": at}).to_string();
    tenants.put("running.team-busy", ghosts(hermes_core::now_unix_ms()).into()).await.unwrap();
    let refused = submit(&t, BUSY, nap(1)).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted, "{refused:?}");
    // Now taken long ago: the restarted dispatcher's scan gives them back.
    tenants.put("running.team-busy", ghosts(1_000).into()).await.unwrap();
    let t = t.restart_services().await;
    // The restarted dispatcher scans the goals in the background, right after it starts.
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let goal_id = loop {
        match submit(&t, BUSY, nap(1)).await {
            Ok(goal_id) => break goal_id,
            Err(status) if std::time::Instant::now() < deadline => {
                assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(status) => panic!("the ghosts' places were not given back within 15 s: {status:?}"),
        }
    };
    t.events_as(&goal_id, BUSY).await;
    t.stop().await;
}
