//! A web page the user visits must not drive a local `hermes up` (docs/http.md, "Browsers and
//! other origins"): the requests a browser sends cross-site without asking first (a
//! `text/plain` or form POST, a foreign `Origin`, a WebSocket from another page) and the ones
//! DNS rebinding makes (a foreign `Host`) are refused on every route, before anything runs, while
//! the server's own pages, an allowed origin and clients that are no browser go on. The raw
//! requests here are what a browser sends; the last test has a real headless Chromium try it.

use std::time::Duration;

use hermes_tests::Sandbox;
use reqwest::StatusCode;
use serde_json::{Value, json};

fn client() -> reqwest::Client {
    reqwest::Client::builder().timeout(Duration::from_secs(30)).build().unwrap()
}

/// A plan whose one node writes `name` into the agents' workspace: what an attacking page wants.
fn write_plan(name: &str) -> Value {
    json!({"nodes": [{"id": "w", "task_type": "fs.write", "inputs": {"path": name, "content": "pwned"}}]})
}

fn a2a_send(name: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": {
        "messageId": format!("m-{name}"), "role": "ROLE_USER", "parts": [{"data": write_plan(name)}]}}})
}

/// Every state-changing route, with a body a page would send to it.
fn state_changing(base: &str) -> Vec<(String, Value)> {
    vec![
        (format!("{base}/v1/goals"), json!({"plan": write_plan("goals.txt")})),
        (format!("{base}/a2a"), a2a_send("a2a.txt")),
        (format!("{base}/v1/goals/g-1:cancel"), json!({"reason": "x"})),
        (format!("{base}/v1/approvals/g-1/c-1:approve"), json!({"reason": "x"})),
        (format!("{base}/v1/dead-letters/1:replay"), json!({})),
    ]
}

async fn goal_count(base: &str) -> usize {
    let page: Value = client().get(format!("{base}/v1/goals")).send().await.unwrap().json().await.unwrap();
    page["goals"].as_array().unwrap().len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cross_site_requests_and_foreign_hosts_are_refused_on_every_route() {
    let workspace = tempfile::tempdir().unwrap();
    let t = Sandbox::builder().workspace(workspace.path()).start().await;
    let base = t.http_url();
    let port = base.rsplit(':').next().unwrap().to_owned();
    for (url, body) in state_changing(&base) {
        let text = body.to_string();
        // A `text/plain` POST from another page, as `fetch(url, {mode: "no-cors", body})` sends it.
        let response = client()
            .post(&url)
            .header("origin", "https://evil.example")
            .header("sec-fetch-site", "cross-site")
            .header("content-type", "text/plain;charset=UTF-8")
            .body(text.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::FORBIDDEN, "{url}");
        let problem: Value = response.json().await.unwrap();
        assert!(problem["detail"].as_str().unwrap().contains("cors_allow_origins"), "{problem}");
        // The same without an Origin (a client hiding it) is still no API call: 415.
        let response =
            client().post(&url).header("content-type", "text/plain").body(text.clone()).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE, "{url}");
        // A form POST, with and without its Origin.
        let form = [("json", text.as_str())];
        let response = client().post(&url).header("origin", "null").form(&form).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::FORBIDDEN, "{url}");
        let response = client().post(&url).form(&form).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE, "{url}");
        // Well-typed JSON from a foreign origin (a preflight would have failed; a page may try).
        let response =
            client().post(&url).header("origin", "http://localhost:3000").json(&body).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::FORBIDDEN, "{url}");
        // DNS rebinding: the page's own name in Host, even with its own origin.
        let response = client()
            .post(&url)
            .header("host", format!("rebind.evil.example:{port}"))
            .header("origin", format!("http://rebind.evil.example:{port}"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::MISDIRECTED_REQUEST, "{url}");
    }
    // Reads under a foreign Host too, the console and the agent card included.
    for path in ["/", "/v1/goals", "/v1/approvals", "/.well-known/agent-card.json", "/v1/goals/g-1/events"] {
        let response =
            client().get(format!("{base}{path}")).header("host", "rebind.evil.example").send().await.unwrap();
        assert_eq!(response.status(), StatusCode::MISDIRECTED_REQUEST, "{path}");
        let problem: Value = response.json().await.unwrap();
        assert!(problem["detail"].as_str().unwrap().contains("allowed_hosts"), "{problem}");
    }
    // A WebSocket opened by another page.
    let response = client()
        .get(format!("{base}/v1/goals/g-1/ws"))
        .header("connection", "upgrade")
        .header("upgrade", "websocket")
        .header("sec-websocket-version", "13")
        .header("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==")
        .header("origin", "https://evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::FORBIDDEN);
    // Nothing ran.
    assert_eq!(goal_count(&base).await, 0);
    assert_eq!(std::fs::read_dir(workspace.path()).unwrap().count(), 0, "a refused request wrote a file");

    // The server's own origin (the console), `localhost`, and a client that is no browser go on.
    let plan = json!({"plan": {"nodes": [{"id": "x", "task_type": "math.evaluate", "inputs": {"expression": "1"}}]}});
    let own =
        client().post(format!("{base}/v1/goals")).header("origin", &base).json(&plan).send().await.unwrap();
    assert_eq!(own.status(), StatusCode::CREATED);
    let by_name = client()
        .post(format!("{base}/v1/goals"))
        .header("host", format!("localhost:{port}"))
        .header("origin", format!("http://localhost:{port}"))
        .json(&plan)
        .send()
        .await
        .unwrap();
    assert_eq!(by_name.status(), StatusCode::CREATED);
    let curl = client().post(format!("{base}/a2a")).json(&a2a_send("ok.txt")).send().await.unwrap();
    let answer: Value = curl.json().await.unwrap();
    assert!(answer["result"]["task"]["id"].is_string(), "{answer}");
    assert_eq!(goal_count(&base).await, 3);
    t.stop().await;
}

/// An origin in `dispatcher.http.cors_allow_origins` (a dev tool on another port) may change state.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_allowed_origin_may_change_state_and_others_still_may_not() {
    let t = Sandbox::builder().cors_allow_origins(&["http://localhost:5173"]).start().await;
    let base = t.http_url();
    let plan = json!({"plan": {"nodes": [{"id": "x", "task_type": "math.evaluate", "inputs": {"expression": "1"}}]}});
    let allowed = client()
        .post(format!("{base}/v1/goals"))
        .header("origin", "http://localhost:5173")
        .json(&plan)
        .send()
        .await
        .unwrap();
    assert_eq!(allowed.status(), StatusCode::CREATED);
    assert_eq!(allowed.headers()["access-control-allow-origin"], "http://localhost:5173");
    let other = client()
        .post(format!("{base}/v1/goals"))
        .header("origin", "http://localhost:5174")
        .json(&plan)
        .send()
        .await;
    assert_eq!(other.unwrap().status(), StatusCode::FORBIDDEN);
    // Even an allowed origin cannot send a simple body type.
    let simple = client()
        .post(format!("{base}/v1/goals"))
        .header("origin", "http://localhost:5173")
        .header("content-type", "text/plain")
        .body(plan.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(simple.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    t.stop().await;
}

/// A real browser on another origin tries the attacks a page can make without the user
/// noticing: a `no-cors` text POST to `/a2a`, a JSON fetch, a form posted to `/v1/goals`, a
/// WebSocket. None starts a goal or writes a file.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_page_on_another_origin_in_a_real_browser_cannot_start_a_goal() {
    let workspace = tempfile::tempdir().unwrap();
    let t = Sandbox::builder().workspace(workspace.path()).start().await;
    let base = t.http_url();
    // The attacking page, served from another origin (another port of this machine).
    let page = format!(
        r#"<!doctype html><html><body>
        <form id="f" method="POST" action="{base}/v1/goals" enctype="text/plain" target="sink">
          <input name='{{"plan": {plan}, "x": "' value='"}}'>
        </form>
        <iframe name="sink"></iframe>
        <script>
          window.__done = [];
          fetch("{base}/a2a", {{method: "POST", mode: "no-cors", headers: {{"Content-Type": "text/plain"}},
                body: JSON.stringify({a2a})}}).then(() => __done.push("no-cors"), () => __done.push("no-cors"));
          fetch("{base}/v1/goals", {{method: "POST", headers: {{"Content-Type": "application/json"}},
                body: JSON.stringify({{plan: {plan}}})}}).then(() => __done.push("json"), () => __done.push("json"));
          const ws = new WebSocket("{ws}/v1/goals/g-1/ws");
          ws.onerror = ws.onclose = () => __done.push("ws");
          document.getElementById("f").submit();
          setTimeout(() => __done.push("form"), 1500);
        </script></body></html>"#,
        plan = write_plan("form.txt"),
        a2a = a2a_send("browser.txt"),
        ws = base.replacen("http", "ws", 1),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let evil = format!("http://{}", listener.local_addr().unwrap());
    let app =
        axum::Router::new().route("/", axum::routing::get(move || async move { axum::response::Html(page) }));
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let browser = hermes_test_util::browser::Browser::start().await.unwrap_or_else(|e| panic!("{e}"));
    browser.goto(&format!("{evil}/")).await;
    browser
        .wait_until(
            "return window.__done && window.__done.length >= 4",
            Duration::from_secs(20),
            "the page's attempts",
        )
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    browser.close().await;
    assert_eq!(goal_count(&base).await, 0, "a page on another origin started a goal");
    assert_eq!(std::fs::read_dir(workspace.path()).unwrap().count(), 0);
    t.stop().await;
}
