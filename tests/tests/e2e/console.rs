//! The web console in a real headless Chromium (Debian's `chromium` through `chromedriver`),
//! against the stack `hermes up` runs: goals appear live, a goal's DAG follows its nodes to the
//! answer, errors show their code, approvals are decided on the page or vanish when decided
//! elsewhere, agents show their load, a dead letter is replayed, a webhook delivery is resent,
//! a bad plan is refused with the reason, and a node waiting for a model slot or served from the
//! tool cache says so. Screenshots go to `target/test-output/console/`.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use hermes_test_util::browser::Browser;
use hermes_tests::{Sandbox, hermes_bin, repo_root};
use prost::Message as _;
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(30);

fn client() -> reqwest::Client {
    reqwest::Client::builder().timeout(Duration::from_secs(30)).build().unwrap()
}

async fn submit(base: &str, plan: Value) -> String {
    let response =
        client().post(format!("{base}/v1/goals")).json(&json!({"plan": plan})).send().await.unwrap();
    assert!(response.status().is_success(), "{}", response.text().await.unwrap());
    let goal: Value = response.json().await.unwrap();
    goal["goalId"].as_str().unwrap().to_owned()
}

async fn goal(base: &str, id: &str) -> Value {
    client().get(format!("{base}/v1/goals/{id}")).send().await.unwrap().json().await.unwrap()
}

async fn wait_status(base: &str, id: &str, status: &str) -> Value {
    let deadline = Instant::now() + WAIT;
    loop {
        let g = goal(base, id).await;
        if g["status"] == status {
            return g;
        }
        assert!(
            Instant::now() < deadline,
            "{id} never reached {status}: it is {} ({})",
            g["status"],
            g["error"]
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn browser() -> Browser {
    Browser::start().await.unwrap_or_else(|e| panic!("{e}"))
}

fn screenshot_path(name: &str) -> PathBuf {
    repo_root().join("target/test-output/console").join(name)
}

/// Waits for the page the console is on to have rendered (`body[data-ready]`).
async fn ready(browser: &Browser, page: &str) {
    browser
        .wait_until(
            &format!("return document.body.dataset.ready === '{page}'"),
            WAIT,
            &format!("the {page} page"),
        )
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_submitted_goal_appears_without_reload_and_its_dag_follows_it_live_to_the_answer() {
    let t = Sandbox::start().await;
    let base = t.http_url();
    let b = browser().await;
    b.goto(&format!("{base}/#/goals")).await;
    ready(&b, "goals").await;
    // Anything set on this page survives only if the page is never reloaded. From here on,
    // record every state node `second` shows, as the page changes it.
    b.script(
        "window.__sameDocument = true;
         window.__states = [];
         setInterval(() => {
           const n = document.querySelector('g[data-node=\"second\"]');
           const s = n && n.dataset.state;
           if (s && window.__states[window.__states.length - 1] !== s) window.__states.push(s);
         }, 10);",
        json!([]),
    )
    .await;

    let id = submit(
        &base,
        json!({"nodes": [
            {"id": "first", "task_type": "time.sleep", "inputs": {"ms": 3000}},
            {"id": "second", "task_type": "time.sleep", "inputs": {"ms": 1200}, "depends_on": ["first"]},
            {"id": "sum", "task_type": "math.evaluate",
             "inputs": {"expression": "x + 1", "variables": {"x": 41}}, "depends_on": ["second"]}
        ], "output_node": "sum"}),
    )
    .await;
    let row = b.wait_for(&format!("tr[data-goal-id='{id}'] a"), WAIT).await;
    assert_eq!(b.script("return window.__sameDocument === true", json!([])).await, true, "the page reloaded");

    row.click().await;
    ready(&b, "goal").await;
    b.wait_text("#goal-output", "42", WAIT).await;
    let states = b.script("return window.__states", json!([])).await;
    assert_eq!(
        states,
        json!(["pending", "running", "succeeded"]),
        "the node's states as the page showed them"
    );
    assert_eq!(b.script("return window.__sameDocument === true", json!([])).await, true, "the page reloaded");

    // A node's details: its routing and its inputs with `$ref`s resolved.
    b.find("g[data-node='second']").await.unwrap().click().await;
    let routing = b.wait_text("#node-routing", "attempt 1", WAIT).await;
    assert!(routing.contains("agent") || routing.contains("pool"), "{routing}");
    let status = b.text_of("#goal-status").await.unwrap_or_default();
    assert!(status.contains("completed"), "{status}");

    // A phone's width: nothing overflows sideways.
    b.resize(390, 844).await;
    b.goto(&format!("{base}/#/goals")).await;
    ready(&b, "goals").await;
    let fits =
        b.script("return document.documentElement.scrollWidth <= window.innerWidth + 1", json!([])).await;
    assert_eq!(fits, true, "the Goals page is wider than a phone");
    b.close().await;
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_wide_fan_out_is_drawn_live_and_a_failed_node_shows_its_error() {
    let t = Sandbox::builder().max_concurrency(100).start().await;
    let base = t.http_url();
    let b = browser().await;

    // 200 nodes side by side, after one root.
    let mut nodes = vec![json!({"id": "root", "task_type": "time.sleep", "inputs": {"ms": 300}})];
    for i in 0..200 {
        nodes.push(json!({"id": format!("n{i:03}"), "task_type": "time.sleep", "inputs": {"ms": 2500},
                          "depends_on": ["root"]}));
    }
    let id = submit(&base, json!({"nodes": nodes})).await;
    b.goto(&format!("{base}/#/goal/{id}")).await;
    ready(&b, "goal").await;
    b.wait_until(
        "return document.querySelectorAll('g.node[data-state=\"running\"]').length >= 50",
        WAIT,
        "the fan-out running",
    )
    .await;
    assert_eq!(b.find_all("svg.dag g.node").await.len(), 201);
    // A running node names the agent it went to.
    b.wait_until(
        "return /test-agent/.test(document.querySelector('g.node[data-state=\"running\"] text.sub').textContent)",
        WAIT,
        "a running node's agent",
    )
    .await;
    b.find("g[data-node='n001']").await.unwrap().click().await;
    b.wait_for("#node-routing", WAIT).await;
    b.screenshot(&screenshot_path("goal-fan-out.png")).await;
    b.wait_until(
        "return document.querySelectorAll('g.node[data-state=\"succeeded\"]').length === 201",
        WAIT,
        "every node succeeded on the page",
    )
    .await;

    // A node that fails: its code and message, on the node and on the goal.
    let failed = submit(
        &base,
        json!({"nodes": [{"id": "broken", "task_type": "math.evaluate", "inputs": {"expression": "1 +"}}]}),
    )
    .await;
    let state = wait_status(&base, &failed, "GOAL_STATUS_FAILED").await;
    let error = &state["nodes"][0]["error"];
    let (code, message) = (error["code"].as_str().unwrap(), error["message"].as_str().unwrap());
    b.goto(&format!("{base}/#/goal/{failed}")).await;
    ready(&b, "goal").await;
    b.wait_for("g[data-node='broken']", WAIT).await.click().await;
    assert_eq!(b.attr_of("g[data-node='broken']", "data-state").await.as_deref(), Some("failed"));
    b.wait_text("#node-error", message, WAIT).await;
    assert_eq!(b.text_of("#node-error .error-code").await.as_deref(), Some(code));
    b.wait_text("#goal-error", code, WAIT).await;
    b.close().await;
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn approvals_are_decided_on_the_page_and_vanish_when_decided_from_the_cli() {
    let workspace = tempfile::tempdir().unwrap();
    let t = Sandbox::builder()
        .workspace(workspace.path())
        .confirm(&["fs.write"], Duration::from_secs(120))
        .start()
        .await;
    let base = t.http_url();
    let write = |path: &str| json!({"nodes": [{"id": "w", "task_type": "fs.write", "inputs": {"path": path, "content": "yes"}}]});
    let on_page = submit(&base, write("page.txt")).await;
    let from_cli = submit(&base, write("cli.txt")).await;

    let b = browser().await;
    b.goto(&format!("{base}/#/approvals")).await;
    b.wait_until("return document.querySelectorAll('article.approval').length === 2", WAIT, "two approvals")
        .await;
    let countdown = b.find(&format!("article[data-goal-id='{on_page}'] .countdown")).await.unwrap();
    b.wait_until(
        &format!("return /expires in/.test(document.querySelector(\"article[data-goal-id='{on_page}'] .countdown\").textContent)"),
        WAIT,
        "a countdown",
    )
    .await;
    assert!(countdown.text().await.starts_with("expires in"));
    b.screenshot(&screenshot_path("approvals.png")).await;

    // Approve with a reason on the page: the goal goes on and writes its file.
    b.find(&format!("article[data-goal-id='{on_page}'] input[name=reason]"))
        .await
        .unwrap()
        .send_keys("checked")
        .await;
    b.find(&format!("article[data-goal-id='{on_page}'] button.approve")).await.unwrap().click().await;
    wait_status(&base, &on_page, "GOAL_STATUS_COMPLETED").await;
    assert_eq!(std::fs::read_to_string(workspace.path().join("page.txt")).unwrap(), "yes");
    b.wait_until(
        &format!("return !document.querySelector(\"article[data-goal-id='{on_page}']\")"),
        WAIT,
        "the approved card gone",
    )
    .await;

    // Deny the other from the CLI: its card leaves the open page by itself.
    let call: Value =
        client().get(format!("{base}/v1/approvals")).send().await.unwrap().json().await.unwrap();
    let call_id = call["approvals"][0]["callId"].as_str().unwrap().to_owned();
    let grpc = t.stack.as_ref().unwrap().grpc_url();
    let out = std::process::Command::new(hermes_bin())
        .args(["deny", &from_cli, &call_id, "--note", "not today", "--server", &grpc])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    b.wait_until(
        "return document.querySelectorAll('article.approval').length === 0",
        WAIT,
        "the inbox empty",
    )
    .await;
    wait_status(&base, &from_cli, "GOAL_STATUS_FAILED").await;
    assert!(!workspace.path().join("cli.txt").exists());
    b.close().await;
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_agents_page_lists_the_stacks_agents_with_their_load() {
    let t = Sandbox::builder().agents(2).max_concurrency(4).start().await;
    let base = t.http_url();
    let agents: Value = client().get(format!("{base}/v1/agents")).send().await.unwrap().json().await.unwrap();
    let ids: Vec<String> = agents["agents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["heartbeat"]["agentId"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids.len(), 2, "{agents}");

    let b = browser().await;
    b.goto(&format!("{base}/#/agents")).await;
    ready(&b, "agents").await;
    for id in &ids {
        let row = format!("tr[data-agent-id='{id}']");
        b.wait_text(&row, "time.sleep", WAIT).await;
        assert_eq!(b.attr_of(&row, "data-state").await.as_deref(), Some("online"));
        // Routing's view of it: in rotation (docs/routing.md, "Latency and health").
        assert_eq!(b.attr_of(&row, "data-health").await.as_deref(), Some("ok"));
        b.wait_text(&format!("{row} td.health"), "in rotation", WAIT).await;
    }
    // Busy agents show it: some load out of 4.
    let nodes: Vec<Value> = (0..6)
        .map(|i| json!({"id": format!("s{i}"), "task_type": "time.sleep", "inputs": {"ms": 4000}}))
        .collect();
    submit(&base, json!({"nodes": nodes})).await;
    b.wait_until(
        "return [...document.querySelectorAll('#agent-rows td.load')].some(td => /^[1-9]\\d*\\/4$/.test(td.textContent))",
        WAIT,
        "an agent with load",
    )
    .await;
    b.close().await;
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_webhook_delivery_shows_its_attempts_and_is_resent_from_the_deliveries_page() {
    let receiver = crate::webhooks::Receiver::start().await;
    receiver.answer(&[(500, None), (503, None)]);
    let t = Sandbox::builder().webhooks(crate::webhooks::config(&[0, 100])).start().await;
    let base = t.http_url();
    let plan =
        json!({"nodes": [{"id": "sum", "task_type": "math.evaluate", "inputs": {"expression": "1+2"}}]});
    let response = client()
        .post(format!("{base}/v1/goals"))
        .json(&json!({"plan": plan, "callbacks": [{"url": receiver.url}]}))
        .send()
        .await
        .unwrap();
    let goal: Value = response.json().await.unwrap();
    assert!(goal["callbackSecrets"][0].as_str().unwrap().starts_with("whsec_"), "{goal}");
    receiver.requests(2, WAIT).await;

    let b = browser().await;
    b.goto(&format!("{base}/#/deliveries")).await;
    ready(&b, "deliveries").await;
    // Both attempts failed: dead-lettered, with each attempt listed.
    b.wait_until(
        "return document.querySelector('#delivery-rows tr[data-state=dead_lettered]') !== null",
        WAIT,
        "the dead-lettered delivery",
    )
    .await;
    b.wait_text("#delivery-rows", "goal.completed", WAIT).await;
    b.wait_text("#delivery-rows", "HTTP 503", WAIT).await;
    b.screenshot(&screenshot_path("deliveries.png")).await;
    b.find("#delivery-rows button.resend").await.expect("a resend button").click().await;
    b.wait_text("#resend-result", "again", WAIT).await;
    // The receiver answers 200 now: delivered, the page says so.
    receiver.requests(3, WAIT).await;
    b.wait_until(
        "return document.querySelector('#delivery-rows tr[data-state=delivered]') !== null",
        WAIT,
        "the delivery delivered after its resend",
    )
    .await;
    b.close().await;
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dead_letter_is_replayed_from_its_page() {
    let t = Sandbox::start().await;
    let base = t.http_url();
    // A task for an agent that is gone, dead-lettered with its reason.
    let topology = t.bus.topology().clone();
    let subject = topology.direct_task("ghost", "math.evaluate");
    let task = hermes_proto::TaskMessage {
        goal_id: "goal-dead".into(),
        node_id: "calc".into(),
        task_id: "goal-dead.calc.1".into(),
        attempt: 1,
        task_type: "math.evaluate".into(),
        inputs_json: r#"{"expression": "1 + 1"}"#.into(),
        ..Default::default()
    };
    t.bus
        .publish_dead_letter(
            "task",
            &subject,
            "HERMES_TASKS:7",
            "delivered 5 times (MaxDeliver)",
            task.encode_to_vec().into(),
        )
        .await
        .unwrap();

    let b = browser().await;
    b.goto(&format!("{base}/#/dead-letters")).await;
    ready(&b, "dead-letters").await;
    let link = b.wait_for("#dead-letter-rows tr a", WAIT).await;
    b.wait_text("#dead-letter-rows", "MaxDeliver", WAIT).await;
    link.click().await;
    ready(&b, "dead-letter").await;
    b.wait_text("#dead-letter-reason", "MaxDeliver", WAIT).await;
    b.find("#replay").await.unwrap().click().await;
    b.wait_until(
        "return /Replayed/.test(document.getElementById('replay-result').textContent)",
        WAIT,
        "the replay's answer",
    )
    .await;
    b.wait_text("#replay-result", &subject, WAIT).await;
    // Back on its subject, and off the dead-letter list.
    let mut stream = t.bus.jetstream().get_stream(topology.tasks_stream()).await.unwrap();
    assert_eq!(stream.info().await.unwrap().state.messages, 1);
    let list: Value =
        client().get(format!("{base}/v1/dead-letters")).send().await.unwrap().json().await.unwrap();
    assert!(list["deadLetters"].as_array().is_none_or(|l| l.is_empty()), "{list}");
    b.close().await;
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn submit_shows_why_a_plan_is_invalid_and_opens_a_valid_one() {
    let t = Sandbox::start().await;
    let base = t.http_url();
    let b = browser().await;
    b.goto(&format!("{base}/#/submit")).await;
    ready(&b, "submit").await;
    b.find("input[name=kind][value=plan]").await.unwrap().click().await;
    let body = b.find("#goal-body").await.unwrap();
    body.send_keys(
        "nodes:\n  - id: a\n    task_type: math.evaluate\n    inputs: {expression: \"1\"}\n    depends_on: [b]\n  - id: b\n    task_type: math.evaluate\n    inputs: {expression: \"2\"}\n    depends_on: [a]\n",
    )
    .await;
    b.find("#submit-goal").await.unwrap().click().await;
    b.wait_for("#body-error .problem-detail", WAIT).await;
    let shown = b.text_of("#body-error").await.unwrap_or_default();
    assert!(shown.to_lowercase().contains("cycle"), "{shown}");
    assert_eq!(body.attr("aria-invalid").await.as_deref(), Some("true"));

    // A valid one (JSON this time) opens its goal page.
    body.clear().await;
    body.send_keys(
        r#"{"nodes": [{"id": "x", "task_type": "math.evaluate", "inputs": {"expression": "6 * 7"}}]}"#,
    )
    .await;
    b.find("#submit-goal").await.unwrap().click().await;
    b.wait_text("#goal-output", "42", WAIT).await;
    b.close().await;
    t.stop().await;
}

/// The Goal page with 2,000 nodes: interactive (drawn, and a node opens its details) well within
/// a generous bound; the figure is printed, and `make bench` reports it too.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_two_thousand_node_goal_page_is_interactive_quickly() {
    let t = Sandbox::builder().max_concurrency(200).start().await;
    let base = t.http_url();
    let mut nodes = vec![json!({"id": "root", "task_type": "math.evaluate", "inputs": {"expression": "1"}})];
    for i in 1..2000 {
        nodes.push(json!({"id": format!("n{i:04}"), "task_type": "math.evaluate",
                          "inputs": {"expression": "x + 1", "variables": {"x": {"$ref": "root.value"}}}}));
    }
    let id = submit(&base, json!({"nodes": nodes})).await;
    wait_status(&base, &id, "GOAL_STATUS_COMPLETED").await;

    let b = browser().await;
    b.goto(&format!("{base}/#/goals")).await;
    ready(&b, "goals").await;
    let start = Instant::now();
    b.script(&format!("location.hash = '#/goal/{id}'"), json!([])).await;
    ready(&b, "goal").await;
    let cell = b.wait_for("g.cell[data-node='n1999']", WAIT).await;
    cell.click().await;
    b.wait_for("#node-inputs", WAIT).await;
    let interactive = start.elapsed();
    let render_ms = b.script("return Number(document.body.dataset.renderMs)", json!([])).await;
    println!(
        "2,000-node goal page: interactive in {} ms (rendered in {render_ms} ms)",
        interactive.as_millis()
    );
    assert_eq!(b.find_all("svg.dag g.cell").await.len(), 2000);
    // `$ref`s resolved from the root's output.
    b.wait_text("#node-inputs", "\"x\": 1", WAIT).await;
    assert!(interactive < Duration::from_secs(10), "{interactive:?}");
    b.close().await;
    t.stop().await;
}

/// With auth on, the console asks for a token, and then shows what that token may see: its
/// tenant's goals, not another's.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_auth_on_the_console_signs_in_and_shows_only_the_tenants_goals() {
    use hermes_test_util::api_token;
    let tokens = [
        api_token("dash-a", "token-of-team-a", "team-a", &["submitter"]),
        api_token("ci-b", "token-of-team-b", "team-b", &["submitter"]),
    ]
    .concat();
    let t = Sandbox::builder().api_tokens(&tokens).start().await;
    let base = t.http_url();
    let post_as = |token: &'static str| {
        let base = base.clone();
        async move {
            let plan = json!({"plan": {"nodes": [{"id": "x", "task_type": "math.evaluate", "inputs": {"expression": "1"}}]}});
            let response = client()
                .post(format!("{base}/v1/goals"))
                .bearer_auth(token)
                .json(&plan)
                .send()
                .await
                .unwrap();
            assert!(response.status().is_success());
            response.json::<Value>().await.unwrap()["goalId"].as_str().unwrap().to_owned()
        }
    };
    let mine = post_as("token-of-team-a").await;
    let theirs = post_as("token-of-team-b").await;

    let b = browser().await;
    b.goto(&format!("{base}/#/goals")).await;
    b.wait_until("return !document.getElementById('signin').hidden", WAIT, "the sign-in form").await;
    b.find("#token").await.unwrap().send_keys("token-of-team-a").await;
    b.find("#signin button").await.unwrap().click().await;
    b.wait_for(&format!("tr[data-goal-id='{mine}']"), WAIT).await;
    assert!(
        b.find(&format!("tr[data-goal-id='{theirs}']")).await.is_none(),
        "another tenant's goal is shown"
    );
    assert_eq!(b.script("return document.getElementById('signin').hidden", json!([])).await, true);
    b.close().await;
    t.stop().await;
}

/// The node of the first `ModelWaiting{waiting: true}` event on `goal_id`'s watch.
async fn first_waiting_node(t: &mut Sandbox, goal_id: &str) -> String {
    use futures::StreamExt;
    let mut events = t
        .client
        .watch_goal(hermes_proto::WatchGoalRequest { goal_id: goal_id.into(), after_seq: 0 })
        .await
        .unwrap()
        .into_inner();
    tokio::time::timeout(WAIT, async {
        while let Some(event) = events.next().await {
            if let Some(hermes_proto::event::Kind::ModelWaiting(w)) = event.unwrap().kind
                && w.waiting
            {
                return w.node_id;
            }
        }
        panic!("the watch ended without a node waiting for a model slot");
    })
    .await
    .expect("a ModelWaiting event")
}

/// A node whose model call waits for a fleet-wide slot says so on its page while it waits, and
/// a node whose tool result came from the cache says `cached, age N s`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_waiting_for_a_model_slot_and_a_cached_result_are_marked_on_the_goal_page() {
    use hermes_llm::governor::{self, Governor, LimitSettings, ModelLimits};
    // Each model call takes 4 s, and the fleet allows one at once: of two agent.run nodes, one
    // waits for the other's slot.
    let provider = hermes_test_util::provider::LimitedProvider::start(8, Duration::from_secs(4)).await;
    let mut t = Sandbox::builder().llm(provider.base_url()).cache(&[("math.evaluate", 0)]).start().await;
    let settings = LimitSettings {
        models: [("agent-model".to_owned(), ModelLimits { max_concurrent: Some(1), ..Default::default() })]
            .into(),
        ..Default::default()
    };
    governor::install(Governor::start(&t.bus, &settings).await.unwrap());
    let base = t.http_url();
    let ask = |id: &str| json!({"id": id, "task_type": "agent.run", "inputs": {"instruction": "Say done."}});
    let id = submit(&base, json!({"nodes": [ask("one"), ask("two")]})).await;
    let waiting = first_waiting_node(&mut t, &id).await;

    let b = browser().await;
    b.goto(&format!("{base}/#/goal/{id}")).await;
    ready(&b, "goal").await;
    b.wait_for(&format!("g[data-node='{waiting}']"), WAIT).await.click().await;
    b.wait_text("#node-model-wait", "waiting for model slot", WAIT).await;
    b.screenshot(&screenshot_path("model-wait.png")).await;
    wait_status(&base, &id, "GOAL_STATUS_COMPLETED").await;
    assert_eq!(provider.max_in_flight(), 1, "the fleet's limit of one call at once held");

    // The same call twice: the second goal's node is served from the cache.
    let sum =
        json!({"nodes": [{"id": "sum", "task_type": "math.evaluate", "inputs": {"expression": "40 + 2"}}]});
    let first = submit(&base, sum.clone()).await;
    wait_status(&base, &first, "GOAL_STATUS_COMPLETED").await;
    let second = submit(&base, sum).await;
    wait_status(&base, &second, "GOAL_STATUS_COMPLETED").await;
    b.goto(&format!("{base}/#/goal/{second}")).await;
    ready(&b, "goal").await;
    b.wait_for("g[data-node='sum']", WAIT).await.click().await;
    let cached = b.wait_text("#node-cached", "cached, age", WAIT).await;
    assert!(cached.trim_end().ends_with(" s"), "{cached}");
    b.goto(&format!("{base}/#/goal/{first}")).await;
    ready(&b, "goal").await;
    b.wait_for("g[data-node='sum']", WAIT).await.click().await;
    b.wait_text("#node-state", "succeeded", WAIT).await;
    assert!(b.find("#node-cached").await.is_none(), "the first run computed it, not the cache");
    b.close().await;
    t.stop().await;
}
