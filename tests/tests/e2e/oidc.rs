//! OIDC tokens on the doors: a JWT of a configured identity provider (served over HTTP by
//! `hermes_test_util::oidc::TestIdp`) is a caller on gRPC, HTTP and the services beside the
//! dispatcher, in the tenant and with the roles its claims map to, beside the static tokens;
//! bad tokens are refused and audited; a new signing key is taken without a restart.

use std::time::Duration;

use hermes_proto::{GetGoalRequest, GoalSpec, ListGoalsRequest, SubmitGoalRequest};
use hermes_test_util::oidc::{KeyKind, TestIdp};
use hermes_tests::{Sandbox, node, with_token};
use reqwest::StatusCode;
use serde_json::json;

const VIEWER_A: &str = "static-viewer-a";

fn tokens_file(idp: &TestIdp) -> String {
    format!(
        "{}[[oidc]]\nissuer = \"{}\"\naudience = \"hermes\"\ntenant_claim = \"org\"\ntenants = [\"team-a\", \"team-b\"]\nroles_claim = \"groups\"\nmin_refetch_s = 1\n[oidc.role_map]\n\"hermes-ci\" = [\"submitter\"]\n\"hermes-ops\" = [\"operator\"]\n",
        hermes_test_util::api_token("dash-a", VIEWER_A, "team-a", &["viewer"]),
        idp.issuer
    )
}

/// `token` with one character of its signature changed (one that still decodes).
fn tampered(token: &str) -> String {
    let at = token.len() - 10;
    let swap = if &token[at..at + 1] == "A" { "B" } else { "A" };
    format!("{}{swap}{}", &token[..at], &token[at + 1..])
}

fn spec() -> GoalSpec {
    GoalSpec {
        plan: Some(hermes_proto::TaskPlan {
            nodes: vec![node("nap", "time.sleep", json!({"ms": 10}), &[])],
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn oidc_tokens_are_callers_on_every_door_in_the_tenant_and_roles_their_claims_map_to() {
    let idp = TestIdp::start(KeyKind::Rsa).await;
    let mut t = Sandbox::builder()
        .api_tokens(&tokens_file(&idp))
        .memory(hermes_memory::MemoryConfig::default())
        .start()
        .await;
    let mut client = t.client.clone();
    let token = |claims: serde_json::Value| idp.token("k1", "hermes", claims);
    let ci_a = token(json!({"sub": "ci-a", "org": "team-a", "groups": ["hermes-ci", "unrelated"]}));
    let ci_b = token(json!({"sub": "ci-b", "org": "team-b", "groups": ["hermes-ci"]}));
    let ops_a = token(json!({"sub": "ops-a", "org": "team-a", "groups": ["hermes-ops"]}));

    // gRPC: the submit is the token's subject's, in its claimed tenant.
    let a = client
        .submit_goal(with_token(SubmitGoalRequest { spec: Some(spec()) }, &ci_a))
        .await
        .expect("an OIDC submitter submits")
        .into_inner()
        .goal_id;
    let goal = client.get_goal(with_token(GetGoalRequest { goal_id: a.clone() }, VIEWER_A)).await;
    assert_eq!(goal.expect("a static token of team-a sees it").into_inner().goal_id, a);
    let other = client.get_goal(with_token(GetGoalRequest { goal_id: a.clone() }, &ci_b)).await.unwrap_err();
    assert_eq!(other.code(), tonic::Code::NotFound, "another tenant's OIDC caller: {other:?}");

    // HTTP, the same token and rules.
    let http = reqwest::Client::builder().timeout(Duration::from_secs(30)).build().unwrap();
    let base = t.http_url();
    let got = http.get(format!("{base}/v1/goals/{a}")).bearer_auth(&ci_a).send().await.unwrap();
    assert_eq!(got.status(), StatusCode::OK);
    let got = http.get(format!("{base}/v1/goals/{a}")).bearer_auth(&ci_b).send().await.unwrap();
    assert_eq!(got.status(), StatusCode::NOT_FOUND);

    // Refused, each for its reason, on both doors.
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let refusals = [
        (token(json!({"sub": "x", "org": "team-a", "groups": ["hermes-ci"], "exp": now - 3600})), "expired"),
        (idp.token("k1", "another-app", json!({"sub": "x", "org": "team-a"})), "audience"),
        (token(json!({"sub": "x", "org": "team-c", "groups": ["hermes-ci"]})), "team-c"),
        (tampered(&ci_a), "signature"),
    ];
    for (bad, reason) in &refusals {
        let refused = client.list_goals(with_token(ListGoalsRequest::default(), bad)).await.unwrap_err();
        assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{reason}: {refused:?}");
        assert!(refused.message().contains(reason), "{reason}: {}", refused.message());
        let got = http.get(format!("{base}/v1/goals")).bearer_auth(bad).send().await.unwrap();
        assert_eq!(got.status(), StatusCode::UNAUTHORIZED, "{reason}");
    }
    // No mapped role: authenticated, allowed nothing.
    let nobody = token(json!({"sub": "nobody", "org": "team-a", "groups": ["unrelated"]}));
    let denied = client.list_goals(with_token(ListGoalsRequest::default(), &nobody)).await.unwrap_err();
    assert_eq!(denied.code(), tonic::Code::PermissionDenied, "{denied:?}");

    // The services beside the dispatcher take the same tokens.
    let channel =
        tonic::transport::Channel::from_shared(t.stack().grpc_url()).unwrap().connect().await.unwrap();
    let mut registry = hermes_proto::registry_client::RegistryClient::new(channel.clone());
    registry
        .list_agents(with_token(hermes_proto::ListAgentsRequest {}, &ci_a))
        .await
        .expect("any role reads agents");
    let mut memory = hermes_proto::memory_client::MemoryClient::new(channel);
    let denied = memory
        .list_sessions(with_token(hermes_proto::ListSessionsRequest::default(), &ci_a))
        .await
        .unwrap_err();
    assert_eq!(denied.code(), tonic::Code::PermissionDenied, "{denied:?}");
    memory
        .list_sessions(with_token(hermes_proto::ListSessionsRequest::default(), &ops_a))
        .await
        .expect("an OIDC operator uses memory");

    // The submit is audited under the token's subject, in its tenant; the failures as failures.
    let read = |filter: &'static str| {
        let js = t.bus.jetstream().clone();
        async move {
            hermes_core::bus::read_filtered::<hermes_proto::AuditRecord>(
                &js,
                "HERMES_AUDIT",
                filter.to_owned(),
                1,
                100,
                "audit",
            )
            .await
            .unwrap()
        }
    };
    let team_a = read("hermes.audit.team-a").await;
    assert!(
        team_a.iter().any(|(_, r)| r.principal == format!("{}#ci-a", idp.issuer)
            && r.action == "goal.submit"
            && r.target == a),
        "{team_a:?}"
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let failed = read("hermes.audit._").await;
        if failed.iter().any(|(_, r)| r.action == "auth.failed" && r.detail.contains("expired")) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no failed authentication audited: {failed:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Key rotation: the provider signs with a new key; its tokens are taken without a restart.
    idp.add_key("k2", KeyKind::P256);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let rotated = idp.token("k2", "hermes", json!({"sub": "ci-a", "org": "team-a", "groups": ["hermes-ci"]}));
    client
        .submit_goal(with_token(SubmitGoalRequest { spec: Some(spec()) }, &rotated))
        .await
        .expect("a token of the new key");
    t.stop().await;
}

/// A tenant that only an OIDC token's claim names (no `tenants` list, no `[[tenant]]` entry) gets
/// its lane of the pool at its first submit, so its pooled tasks are served, and its goal runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenant_named_only_by_a_claim_gets_its_lane_at_its_first_submit() {
    let idp = TestIdp::start(KeyKind::Ed25519).await;
    let file = format!(
        "[[oidc]]\nissuer = \"{}\"\naudience = \"hermes\"\ntenant_claim = \"org\"\nroles = [\"submitter\", \"viewer\"]\n",
        idp.issuer
    );
    let t = Sandbox::builder().api_tokens(&file).start().await;
    let lanes = hermes_core::lanes::bucket(&t.bus).await.unwrap();
    assert!(lanes.get("team-new").await.unwrap().is_none());
    let token = idp.token("k1", "hermes", json!({"sub": "ci", "org": "team-new"}));
    let mut client = t.client.clone();
    let goal_id = client
        .submit_goal(with_token(SubmitGoalRequest { spec: Some(spec()) }, &token))
        .await
        .expect("submitted")
        .into_inner()
        .goal_id;
    let lane = lanes.get("team-new").await.unwrap().expect("the tenant's lane is written");
    assert_eq!(serde_json::from_slice::<serde_json::Value>(&lane).unwrap(), json!({"weight": 1.0}));
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let goal = client
            .get_goal(with_token(GetGoalRequest { goal_id: goal_id.clone() }, &token))
            .await
            .unwrap()
            .into_inner();
        if goal.status == hermes_proto::GoalStatus::Completed as i32 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the goal did not complete: {goal:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    t.stop().await;
}
