//! Each tenant's memory is its own, with auth on: sessions, semantic memories recalled into the
//! planner's prompt, collections, artifacts stored through the Memory API, and dead letters. A
//! tenant using the same session name as another gets its own session; another tenant's
//! artifact or dead letter is `NOT_FOUND`.

use std::time::{Duration, Instant};

use hermes_proto::event::Kind;
use hermes_proto::memory_client::MemoryClient;
use hermes_proto::{
    ArtifactRequest, DeadLetterRequest, GoalArtifactRequest, GoalSpec, ListArtifactsRequest,
    ListDeadLettersRequest, PutArtifactChunk, PutArtifactHeader, SearchRequest, SubmitGoalRequest,
    put_artifact_chunk::Part,
};
use hermes_test_util::scripted::{ScriptedLlm, ScriptedResponse};
use hermes_tests::{Sandbox, local_memory, with_token};
use serde_json::{Value, json};

const PLANNER: &str = "planner-model";
const SUMMARIZER: &str = "summarizer-model";
const SUBMITTER_A: &str = "tenancy-submitter-a";
const OPERATOR_A: &str = "tenancy-operator-a";
const SUBMITTER_B: &str = "tenancy-submitter-b";
const OPERATOR_B: &str = "tenancy-operator-b";
const AUDITOR_A: &str = "tenancy-auditor-a";

fn tokens() -> String {
    use hermes_test_util::api_token as entry;
    [
        entry("ci-a", SUBMITTER_A, "team-a", &["submitter"]),
        entry("ops-a", OPERATOR_A, "team-a", &["operator"]),
        entry("ci-b", SUBMITTER_B, "team-b", &["submitter"]),
        entry("ops-b", OPERATOR_B, "team-b", &["operator"]),
        entry("audit-a", AUDITOR_A, "team-a", &["operator", "secrets"]),
    ]
    .concat()
}

/// Submits a text goal in session `chat` as `token` and waits for it to complete.
async fn text_goal(t: &Sandbox, llm: &ScriptedLlm, token: &str, text: &str, answer: &str) -> String {
    let plan =
        json!({"nodes": [{"id": "sum", "task_type": "math.evaluate", "inputs": {"expression": "17 + 5"}}]});
    llm.push(PLANNER, ScriptedResponse::content(plan.to_string()));
    llm.push(
        SUMMARIZER,
        ScriptedResponse::content(
            json!({"answer": answer, "cited_nodes": ["sum"], "conflicts": []}).to_string(),
        ),
    );
    let spec = GoalSpec { text: text.into(), session_id: "chat".into(), ..Default::default() };
    let goal_id = t
        .client
        .clone()
        .submit_goal(with_token(SubmitGoalRequest { spec: Some(spec) }, token))
        .await
        .unwrap()
        .into_inner()
        .goal_id;
    let events = t.events_as(&goal_id, token).await;
    assert!(matches!(events.last().unwrap().kind, Some(Kind::GoalCompleted(_))), "{events:?}");
    goal_id
}

/// Waits until the memory service has remembered `goal_id` in `tenant`'s default collection.
async fn remembered(t: &Sandbox, tenant: &str, goal_id: &str) {
    let client = hermes_memory::MemoryClient::new(&t.bus);
    // Read over NATS as a task of the tenant would, with its token.
    let key = hermes_core::task_token::TaskKey::open(&t.bus).await.unwrap();
    let request = hermes_proto::GetDocRequest {
        id: goal_id.into(),
        tenant: tenant.into(),
        task_token: key.sign(goal_id, tenant, u64::MAX),
        ..Default::default()
    };
    let deadline = Instant::now() + Duration::from_secs(15);
    while client.get_doc(&request).await.is_err() {
        assert!(Instant::now() < deadline, "goal {goal_id} was not remembered for {tenant}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn http_json(url: String, token: &str) -> Value {
    let reply = reqwest::Client::new().get(url).bearer_auth(token).send().await.unwrap();
    assert!(reply.status().is_success(), "{}", reply.status());
    reply.json().await.unwrap()
}

/// The references of the artifacts `token`'s tenant lists through the Memory API.
async fn listed(grpc: &MemoryClient<tonic::transport::Channel>, token: &str) -> Vec<String> {
    let reply =
        grpc.clone().list_artifacts(with_token(ListArtifactsRequest::default(), token)).await.unwrap();
    reply.into_inner().artifacts.into_iter().map(|a| a.r#ref).collect()
}

fn session_goals(session: &Value) -> Vec<String> {
    let turns = session["turns"].as_array().cloned().unwrap_or_default();
    turns.iter().filter_map(|t| t["goalId"].as_str().map(str::to_owned)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sessions_memories_artifacts_and_dead_letters_are_each_tenants_own() {
    let llm = ScriptedLlm::start().await;
    let mut t =
        Sandbox::builder().api_tokens(&tokens()).llm(llm.base_url()).memory(local_memory()).start().await;

    // Tenant A's goal is remembered in A's memory only.
    let a1 = text_goal(
        &t,
        &llm,
        SUBMITTER_A,
        "Compute the total April revenue per product category",
        "April revenue: toys 17, books 5, total 22.",
    )
    .await;
    remembered(&t, "team-a", &a1).await;
    let memory = hermes_memory::MemoryClient::new(&t.bus);
    let key = hermes_core::task_token::TaskKey::open(&t.bus).await.unwrap();
    for tenant in ["team-b", ""] {
        // A task of that tenant, with its token, does not see A's memory.
        let request = hermes_proto::GetDocRequest {
            id: a1.clone(),
            tenant: tenant.into(),
            task_token: key.sign("g-other", tenant, u64::MAX),
            ..Default::default()
        };
        let missing = memory.get_doc(&request).await.unwrap_err();
        assert_eq!(missing.code(), hermes_core::ErrorCode::NotFound, "{tenant:?}: {missing}");
    }

    // Tenant B asks the same in its session of the same name: its planner sees neither A's
    // session turns nor A's memory.
    let b1 = text_goal(
        &t,
        &llm,
        SUBMITTER_B,
        "How much money did we make in April for each kind of product?",
        "Total: 22.",
    )
    .await;
    let b_prompt = llm.requests_for(PLANNER)[1]["messages"][1]["content"].as_str().unwrap().to_owned();
    assert!(!b_prompt.contains("April revenue: toys 17"), "{b_prompt}");
    assert!(!b_prompt.contains("# Memory"), "{b_prompt}");
    assert!(!b_prompt.contains("Compute the total April revenue"), "{b_prompt}");

    // Tenant A asks again: its own session and memory are in the prompt (the control).
    let a2 = text_goal(
        &t,
        &llm,
        SUBMITTER_A,
        "How much money did we make in April for each kind of product?",
        "Total: 22.",
    )
    .await;
    let a_prompt = llm.requests_for(PLANNER)[2]["messages"][1]["content"].as_str().unwrap().to_owned();
    assert!(a_prompt.contains("# Memory\nRecalled from earlier goals"), "{a_prompt}");
    assert!(a_prompt.contains("Answer: April revenue: toys 17"), "{a_prompt}");

    // Over HTTP, each tenant's `chat` session holds its own goals' turns only. Memory records a
    // goal's turns from its events, after the goal ends and before it remembers the goal.
    remembered(&t, "team-a", &a2).await;
    remembered(&t, "team-b", &b1).await;
    let base = t.http_url();
    let a_session = http_json(format!("{base}/v1/sessions/chat"), SUBMITTER_A).await;
    let b_session = http_json(format!("{base}/v1/sessions/chat"), SUBMITTER_B).await;
    assert_eq!(a_session["sessionId"], "chat", "{a_session}");
    let a_goals = session_goals(&a_session);
    assert!(a_goals.contains(&a1) && a_goals.contains(&a2) && !a_goals.contains(&b1), "{a_session}");
    assert_eq!(session_goals(&b_session).iter().filter(|g| **g != b1).count(), 0, "{b_session}");
    let b_list = http_json(format!("{base}/v1/sessions"), SUBMITTER_B).await;
    let names: Vec<&str> =
        b_list["sessions"].as_array().unwrap().iter().filter_map(|s| s["sessionId"].as_str()).collect();
    assert_eq!(names, ["chat"], "{b_list}");
    assert_eq!(session_goals(&b_list["sessions"][0]), session_goals(&b_session));

    // The Memory API on the dispatcher's port: B's operator searches B's memory, whatever
    // tenant it names.
    let channel =
        tonic::transport::Channel::from_shared(t.stack().grpc_url()).unwrap().connect().await.unwrap();
    let mut grpc = MemoryClient::new(channel.clone());
    let search = SearchRequest {
        query: "April revenue per category".into(),
        top_k: 10,
        tenant: "team-a".into(),
        ..Default::default()
    };
    let hits = grpc.search(with_token(search.clone(), OPERATOR_B)).await.unwrap().into_inner().hits;
    let ids: Vec<&str> = hits.iter().filter_map(|h| h.doc.as_ref()).map(|d| d.id.as_str()).collect();
    assert!(!ids.contains(&a1.as_str()) && !ids.contains(&a2.as_str()), "{ids:?}");
    let hits = grpc.search(with_token(search, OPERATOR_A)).await.unwrap().into_inner().hits;
    assert!(hits.iter().filter_map(|h| h.doc.as_ref()).any(|d| d.id == a1), "{hits:?}");
    let collections = grpc
        .list_collections(with_token(hermes_proto::ListCollectionsRequest::default(), OPERATOR_A))
        .await
        .unwrap()
        .into_inner()
        .collections;
    assert_eq!(
        collections.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(),
        ["memory"],
        "{collections:?}"
    );

    // An artifact A's operator stores is A's: B gets NOT_FOUND and does not list it.
    let chunks = vec![
        PutArtifactChunk {
            part: Some(Part::Header(PutArtifactHeader {
                content_type: "text/plain".into(),
                tenant: "team-b".into(),
                ..Default::default()
            })),
        },
        PutArtifactChunk { part: Some(Part::Data(b"team a's notes".to_vec())) },
    ];
    let stored =
        grpc.put_artifact(with_token(futures::stream::iter(chunks), OPERATOR_A)).await.unwrap().into_inner();
    assert_eq!(stored.tenant, "team-a", "the guard's tenant, not the one sent");
    let request = ArtifactRequest { r#ref: stored.r#ref.clone(), ..Default::default() };
    let missing = grpc.stat_artifact(with_token(request.clone(), OPERATOR_B)).await.unwrap_err();
    assert_eq!(missing.code(), tonic::Code::NotFound, "{missing:?}");
    let missing = grpc.get_artifact(with_token(request.clone(), OPERATOR_B)).await.unwrap_err();
    assert_eq!(missing.code(), tonic::Code::NotFound, "{missing:?}");
    let missing = grpc.delete_artifact(with_token(request.clone(), OPERATOR_B)).await.unwrap_err();
    assert_eq!(missing.code(), tonic::Code::NotFound, "{missing:?}");
    assert!(!listed(&grpc, OPERATOR_B).await.contains(&stored.r#ref));
    assert!(listed(&grpc, OPERATOR_A).await.contains(&stored.r#ref));
    grpc.stat_artifact(with_token(request, OPERATOR_A)).await.expect("A reads its own");

    // A dead letter of A's goal is A's; one that names no goal is listed to both without its
    // payload, and neither may replay it.
    let task = hermes_proto::TaskMessage {
        goal_id: a1.clone(),
        task_id: format!("{a1}.sum.9"),
        ..Default::default()
    };
    let payload = prost::Message::encode_to_vec(&task);
    t.bus
        .publish_dead_letter(
            "task",
            "hermes.task.pool.math.evaluate",
            "HERMES_TASKS:990",
            "poison",
            payload.into(),
        )
        .await
        .unwrap();
    t.bus
        .publish_dead_letter(
            "result",
            &format!("hermes.result.{a1}"),
            "HERMES_RESULTS:991",
            "garbage",
            "{}".into(),
        )
        .await
        .unwrap();
    let mut client = t.client.clone();
    let list = |token| {
        let mut client = client.clone();
        async move {
            let reply =
                client.list_dead_letters(with_token(ListDeadLettersRequest::default(), token)).await.unwrap();
            reply.into_inner().dead_letters
        }
    };
    let a_letters = list(OPERATOR_A).await;
    let b_letters = list(OPERATOR_B).await;
    let owned = a_letters.iter().find(|d| d.goal_id == a1).expect("A lists its goal's dead letter");
    let unowned = a_letters.iter().find(|d| d.goal_id.is_empty()).expect("A lists the one naming no goal");
    assert!(b_letters.iter().all(|d| d.goal_id.is_empty()), "{b_letters:?}");
    assert!(b_letters.iter().any(|d| d.sequence == unowned.sequence), "{b_letters:?}");
    let missing = client
        .get_dead_letter(with_token(DeadLetterRequest { sequence: owned.sequence }, OPERATOR_B))
        .await
        .unwrap_err();
    assert_eq!(missing.code(), tonic::Code::NotFound, "{missing:?}");
    let missing = client
        .replay_dead_letter(with_token(DeadLetterRequest { sequence: owned.sequence }, OPERATOR_B))
        .await
        .unwrap_err();
    assert_eq!(missing.code(), tonic::Code::NotFound, "{missing:?}");
    let read = client
        .get_dead_letter(with_token(DeadLetterRequest { sequence: owned.sequence }, OPERATOR_A))
        .await
        .unwrap()
        .into_inner();
    assert!(read.decoded.contains(&a1), "{read:?}");
    let withheld = client
        .get_dead_letter(with_token(DeadLetterRequest { sequence: unowned.sequence }, OPERATOR_B))
        .await
        .unwrap()
        .into_inner();
    assert!(withheld.decoded.starts_with("(withheld"), "{withheld:?}");
    let refused = client
        .replay_dead_letter(with_token(DeadLetterRequest { sequence: unowned.sequence }, OPERATOR_A))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition, "{refused:?}");
    // Over HTTP too.
    let b_http = http_json(format!("{base}/v1/dead-letters"), OPERATOR_B).await;
    assert!(
        b_http["deadLetters"].as_array().unwrap().iter().all(|d| d.get("goalId").is_none_or(|g| g == "")),
        "{b_http}"
    );
    let reply = reqwest::Client::new()
        .get(format!("{base}/v1/dead-letters/{}", owned.sequence))
        .bearer_auth(OPERATOR_B)
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status(), reqwest::StatusCode::NOT_FOUND);
    t.stop().await;
}

/// A goal's large output is an artifact owned by the goal's tenant: that tenant reads and lists
/// it through the Memory API (as `hermes memory artifact` does), another tenant gets
/// `NOT_FOUND`, and over HTTP an artifact another tenant stored naming the goal is not the
/// goal's.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_goals_large_output_is_its_tenants_artifact() {
    let workspace = tempfile::tempdir().unwrap();
    // Over a MiB: the gRPC reads below come in more than one chunk. Its first line holds a
    // secret, which only the secrets role reads.
    let text = format!("password: hunter2-in-a-file\n{}", "a line of a large file\n".repeat(60_000));
    std::fs::write(workspace.path().join("big.txt"), &text).unwrap();
    let mut t = Sandbox::builder()
        .api_tokens(&tokens())
        .workspace(workspace.path())
        .memory(local_memory())
        .start()
        .await;
    let base = t.http_url();
    let http = reqwest::Client::new();
    let read =
        json!({"plan": {"nodes": [{"id": "read", "task_type": "fs.read", "inputs": {"path": "big.txt"}}]}});
    let reply =
        http.post(format!("{base}/v1/goals")).bearer_auth(SUBMITTER_A).json(&read).send().await.unwrap();
    assert!(reply.status().is_success(), "{}", reply.status());
    let goal: Value = reply.json().await.unwrap();
    let id = goal["goalId"].as_str().unwrap().to_owned();
    let events = t.events_as(&id, SUBMITTER_A).await;
    assert!(matches!(events.last().unwrap().kind, Some(Kind::GoalCompleted(_))), "{events:?}");
    let goal = http_json(format!("{base}/v1/goals/{id}"), SUBMITTER_A).await;
    let stub: Value = serde_json::from_str(goal["outputJson"].as_str().unwrap()).unwrap();
    let reference = stub["$artifact"].as_str().expect("the output is a stub").to_owned();

    let channel =
        tonic::transport::Channel::from_shared(t.stack().grpc_url()).unwrap().connect().await.unwrap();
    let mut grpc = MemoryClient::new(channel.clone());
    let request = ArtifactRequest { r#ref: reference.clone(), ..Default::default() };
    let stat = grpc
        .stat_artifact(with_token(request.clone(), OPERATOR_A))
        .await
        .expect("the goal's tenant reads its artifact")
        .into_inner();
    assert_eq!((stat.tenant.as_str(), stat.goal_id.as_str()), ("team-a", id.as_str()), "{stat:?}");
    assert!(!stat.preview.contains("hunter2"), "the preview is redacted: {}", stat.preview);
    let read = |token: &'static str| {
        let (mut grpc, request) = (grpc.clone(), request.clone());
        async move {
            let mut chunks = grpc.get_artifact(with_token(request, token)).await.unwrap().into_inner();
            let mut bytes = Vec::new();
            while let Some(chunk) = chunks.message().await.unwrap() {
                bytes.extend(chunk.data);
            }
            bytes
        }
    };
    // An operator without the secrets role reads it redacted, as the goal's doors serve it.
    let bytes = read(OPERATOR_A).await;
    let output: Value = serde_json::from_slice(&bytes).unwrap();
    let redacted = output["text"].as_str().unwrap();
    assert!(redacted.starts_with("password: [REDACTED]\n"), "{}", &redacted[..60]);
    assert_eq!(redacted.len(), text.len() - "hunter2-in-a-file".len() + "[REDACTED]".len());
    let whole: Value = serde_json::from_slice(&read(AUDITOR_A).await).unwrap();
    assert_eq!(whole["text"], text.as_str());
    assert!(listed(&grpc, OPERATOR_A).await.contains(&reference));
    assert!(!listed(&grpc, OPERATOR_B).await.contains(&reference));
    let missing = grpc.get_artifact(with_token(request, OPERATOR_B)).await.unwrap_err();
    assert_eq!(missing.code(), tonic::Code::NotFound, "{missing:?}");

    // Over HTTP the goal serves its own artifact, and not one B stored naming A's goal.
    let chunks = vec![
        PutArtifactChunk {
            part: Some(Part::Header(PutArtifactHeader {
                content_type: "text/plain".into(),
                goal_id: id.clone(),
                ..Default::default()
            })),
        },
        PutArtifactChunk { part: Some(Part::Data(b"planted by team b".to_vec())) },
    ];
    let planted =
        grpc.put_artifact(with_token(futures::stream::iter(chunks), OPERATOR_B)).await.unwrap().into_inner();
    let get = |reference: String| {
        let request =
            http.get(format!("{base}/v1/goals/{id}/artifacts/{reference}")).bearer_auth(SUBMITTER_A);
        async move { request.send().await.unwrap().status() }
    };
    assert_eq!(get(planted.r#ref.clone()).await, reqwest::StatusCode::NOT_FOUND);
    assert_eq!(get(reference.clone()).await, reqwest::StatusCode::OK);

    // Over gRPC (`GetGoalArtifact`) the same, to any role that may read the goal: a submitter,
    // where the Memory API needs an operator.
    let mut dispatcher = hermes_proto::dispatcher_client::DispatcherClient::new(channel);
    let request = |reference: &str, token: &str| {
        with_token(GoalArtifactRequest { goal_id: id.clone(), r#ref: reference.to_owned() }, token)
    };
    let mut chunks =
        dispatcher.get_goal_artifact(request(&reference, SUBMITTER_A)).await.unwrap().into_inner();
    let (mut through_goal, mut count) = (Vec::new(), 0);
    while let Some(chunk) = chunks.message().await.unwrap() {
        through_goal.extend(chunk.data);
        count += 1;
    }
    assert!(through_goal == bytes && count > 1, "{count} chunks, {} bytes", through_goal.len());
    for (reference, token) in [(&planted.r#ref, SUBMITTER_A), (&reference, SUBMITTER_B)] {
        let refused = dispatcher.get_goal_artifact(request(reference, token)).await.unwrap_err();
        assert_eq!(refused.code(), tonic::Code::NotFound, "{refused:?}");
    }
    t.stop().await;
}
