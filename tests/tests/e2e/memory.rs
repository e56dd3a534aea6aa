//! Session memory end to end: 25 turns keep 10 verbatim plus a summary of the rest, a follow-up
//! goal's planner prompt contains both (seen in the scripted LLM's received requests), and the
//! goal's own turns are recorded from its events.

use std::time::{Duration, Instant};

use hermes_proto::event::Kind;
use hermes_proto::memory_client::MemoryClient;
use hermes_proto::{AppendTurnRequest, GoalSpec, SessionRequest, SessionTurn};
use hermes_test_util::scripted::{ScriptedLlm, ScriptedResponse};
use hermes_tests::Sandbox;
use serde_json::json;

const PLANNER: &str = "planner-model";
const SUMMARIZER: &str = "summarizer-model";

fn turn_text(i: usize) -> String {
    match i {
        0 => "Report April sales by category. I prefer tables with totals.".into(),
        i if i % 2 == 0 => format!("Question number {i} about the April report"),
        i => format!("Answer number {i}: the April figure is {}.", i * 10),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_follow_up_goal_is_planned_with_the_session_window_and_summary() {
    let llm = ScriptedLlm::start().await;
    let mut t = Sandbox::builder().llm(llm.base_url()).memory(Default::default()).start().await;
    let grpc = t.stack.as_ref().unwrap().grpc_url();
    let mut memory = MemoryClient::connect(grpc).await.unwrap();
    for i in 0..25 {
        let turn = SessionTurn {
            session_id: "sales-chat".into(),
            role: if i % 2 == 0 { "user" } else { "assistant" }.into(),
            content: turn_text(i),
            ..Default::default()
        };
        memory.append_turn(AppendTurnRequest { turn: Some(turn), ..Default::default() }).await.unwrap();
    }
    let session = memory
        .get_session(SessionRequest { session_id: "sales-chat".into(), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(session.total_turns, 25);
    assert_eq!(session.turns.len(), 10);
    assert_eq!(session.turns[0].content, turn_text(15));
    let summary = session.summary.clone().unwrap();
    assert!(summary.preferences.iter().any(|p| p.contains("I prefer tables with totals")), "{summary:?}");
    assert!(summary.facts.iter().any(|f| f.contains("Answer number 1:")), "{summary:?}");

    let plan =
        json!({"nodes": [{"id": "may", "task_type": "math.evaluate", "inputs": {"expression": "120 + 80"}}]});
    llm.push(PLANNER, ScriptedResponse::content(plan.to_string()));
    llm.push(
        SUMMARIZER,
        ScriptedResponse::content(
            json!({"answer": "May total: 200.", "cited_nodes": ["may"], "conflicts": []}).to_string(),
        ),
    );
    let spec = GoalSpec {
        text: "Now do the same for May".into(),
        session_id: "sales-chat".into(),
        ..Default::default()
    };
    let (goal_id, _) = t.submit_spec(spec).await.unwrap();
    let events = t.events(&goal_id).await;
    assert!(matches!(events.last().unwrap().kind, Some(Kind::GoalCompleted(_))), "{:?}", events.last());

    let prompt = llm.requests_for(PLANNER)[0]["messages"][1]["content"].as_str().unwrap().to_owned();
    assert!(prompt.contains("# Session"), "{prompt}");
    assert!(prompt.contains("User preferences:\n- I prefer tables with totals"), "{prompt}");
    assert!(prompt.contains("Confirmed facts:\n- Answer number 1: the April figure is 10"), "{prompt}");
    // The recent turns verbatim (the new goal's own turn may already have pushed turn 15 out).
    assert!(prompt.contains(&turn_text(24)) && prompt.contains(&turn_text(16)), "{prompt}");
    assert!(!prompt.contains(&turn_text(14)), "a folded turn appears verbatim: {prompt}");
    assert!(
        !prompt.contains("user: Now do the same for May"),
        "the goal itself is not a past turn: {prompt}"
    );
    assert!(prompt.find("# Session").unwrap() < prompt.find("# Goal\nNow do the same for May").unwrap());

    // The goal's own turns arrive from its events: the question, then the answer.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let session = memory
            .get_session(SessionRequest { session_id: "sales-chat".into(), ..Default::default() })
            .await
            .unwrap()
            .into_inner();
        if session.total_turns == 27 {
            let last: Vec<(&str, &str)> =
                session.turns[8..].iter().map(|t| (t.role.as_str(), t.content.as_str())).collect();
            assert_eq!(last, [("user", "Now do the same for May"), ("assistant", "May total: 200.")]);
            assert_eq!(session.turns[9].goal_id, goal_id);
            break;
        }
        assert!(Instant::now() < deadline, "the goal's turns were not recorded: {session:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    t.stop().await;
}

/// A completed goal is remembered, and a later goal asking the same in other words gets it in
/// the planner's prompt, marked as memory. Needs the local MiniLM model (`make models`).
#[cfg(feature = "local")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_related_earlier_goal_is_recalled_into_the_planner_prompt() {
    let memory = hermes_tests::local_memory();
    let llm = ScriptedLlm::start().await;
    let mut t = Sandbox::builder().llm(llm.base_url()).memory(memory).start().await;
    let plan =
        json!({"nodes": [{"id": "sum", "task_type": "math.evaluate", "inputs": {"expression": "17 + 5"}}]});
    for answer in ["April revenue: toys 17, books 5, total 22.", "Total: 22."] {
        llm.push(PLANNER, ScriptedResponse::content(plan.to_string()));
        llm.push(
            SUMMARIZER,
            ScriptedResponse::content(
                json!({"answer": answer, "cited_nodes": ["sum"], "conflicts": []}).to_string(),
            ),
        );
    }
    let spec = GoalSpec {
        text: "Compute the total April revenue per product category".into(),
        ..Default::default()
    };
    let (first, _) = t.submit_spec(spec).await.unwrap();
    assert!(matches!(t.events(&first).await.last().unwrap().kind, Some(Kind::GoalCompleted(_))));
    // The memory service writes the goal's memory from its completion event. Read as an
    // agent's task would, with its token.
    let client = hermes_memory::MemoryClient::new(&t.bus);
    let key = hermes_core::task_token::TaskKey::open(&t.bus).await.unwrap();
    let task_token = key.sign(&first, "", u64::MAX);
    let deadline = Instant::now() + Duration::from_secs(10);
    while client
        .get_doc(&hermes_proto::GetDocRequest {
            collection: String::new(),
            id: first.clone(),
            task_token: task_token.clone(),
            ..Default::default()
        })
        .await
        .is_err()
    {
        assert!(Instant::now() < deadline, "the completed goal was not remembered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let spec = GoalSpec {
        text: "How much money did we make in April for each kind of product?".into(),
        ..Default::default()
    };
    let (second, _) = t.submit_spec(spec).await.unwrap();
    assert!(matches!(t.events(&second).await.last().unwrap().kind, Some(Kind::GoalCompleted(_))));
    let prompt = llm.requests_for(PLANNER)[1]["messages"][1]["content"].as_str().unwrap().to_owned();
    assert!(prompt.contains("# Memory\nRecalled from earlier goals"), "{prompt}");
    assert!(
        prompt.contains(
            "Goal: Compute the total April revenue per product category / Answer: April revenue: toys 17"
        ),
        "{prompt}"
    );
    // The first goal's prompt had no memory to recall.
    let first_prompt = llm.requests_for(PLANNER)[0]["messages"][1]["content"].as_str().unwrap().to_owned();
    assert!(!first_prompt.contains("# Memory"), "{first_prompt}");
    t.stop().await;
}

/// The agents' `memory.put`, `memory.search` and `memory.get` tools, as plan nodes.
#[cfg(feature = "local")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn memory_tools_put_search_and_get_through_the_memory_service() {
    use hermes_proto::TaskPlan;
    use hermes_tests::node;
    let mut t = Sandbox::builder().memory(hermes_tests::local_memory()).start().await;
    let plan = TaskPlan {
        nodes: vec![
            node(
                "put",
                "memory.put",
                json!({"id": "fact-1", "text": "The Oslo office moved to Bjørvika in 2025.", "metadata": {"kind": "fact"}}),
                &[],
            ),
            node(
                "other",
                "memory.put",
                json!({"id": "fact-2", "text": "Lunch is served at noon.", "metadata": {"kind": "fact"}}),
                &[],
            ),
            node(
                "find",
                "memory.search",
                json!({"query": "where is the Norwegian office now?", "top_k": 2, "filter": {"kind": "fact"}}),
                &["put", "other"],
            ),
            node("get", "memory.get", json!({"id": {"$ref": "find.hits.0.id"}}), &["find"]),
        ],
        output_node: "get".into(),
        ..Default::default()
    };
    let goal_id = t.submit(plan).await.unwrap();
    let events = t.events(&goal_id).await;
    let Some(Kind::GoalCompleted(done)) = &events.last().unwrap().kind else { panic!("{:?}", events.last()) };
    let output: serde_json::Value = serde_json::from_str(&done.output_json).unwrap();
    assert_eq!(output["id"], "fact-1");
    assert_eq!(output["metadata"]["kind"], "fact");
    assert!(output["text"].as_str().unwrap().contains("Bjørvika"));
    t.stop().await;
}

/// An agent's memory requests over NATS reach only the tenant of a task it holds: each must
/// carry the task's token, which the dispatcher signs for the goal's tenant. No token, another
/// tenant's request, a token of another key and an expired one are refused; a task's own goes
/// through (its document is just not there).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_agents_memory_request_needs_its_tasks_token_for_its_own_tenant() {
    let t = Sandbox::builder().memory(hermes_memory::MemoryConfig::default()).start().await;
    let client = hermes_memory::MemoryClient::new(&t.bus);
    let key = hermes_core::task_token::TaskKey::open(&t.bus).await.unwrap();
    let now = hermes_core::now_unix_ms();
    let get = |tenant: &str, task_token: String| hermes_proto::GetDocRequest {
        collection: String::new(),
        id: "doc-1".into(),
        tenant: tenant.into(),
        task_token,
    };
    let cases = [
        (get("team-b", String::new()), "missing"),
        (get("team-b", key.sign("g-1", "team-a", now + 60_000)), "for tenant `team-a`"),
        (
            get(
                "team-b",
                hermes_core::task_token::TaskKey::from_bytes(&[1; 32]).sign("g-1", "team-b", now + 60_000),
            ),
            "does not verify",
        ),
        (get("team-b", key.sign("g-1", "team-b", now - 1)), "expired"),
    ];
    for (request, reason) in cases {
        let refused = client.get_doc(&request).await.unwrap_err();
        assert_eq!(refused.code(), hermes_core::ErrorCode::Denied, "{reason}: {refused}");
        assert!(refused.to_string().contains(reason), "{reason}: {refused}");
    }
    let allowed = client.get_doc(&get("team-b", key.sign("g-1", "team-b", now + 60_000))).await.unwrap_err();
    assert_eq!(allowed.code(), hermes_core::ErrorCode::NotFound, "the token is taken: {allowed}");
    t.stop().await;
}
