//! A real headless Chromium, driven through ChromeDriver's W3C WebDriver HTTP protocol: the
//! console's browser tests and the bench's console row. [`Browser::start`] starts
//! `chromedriver` on a free port with a fresh profile; every call is one WebDriver command
//! (navigate, find, click, type, run a script, take a screenshot). Dropping it kills the driver
//! and the browser it started.
//!
//! Debian's `chromium` and `chromium-driver` packages provide both (`make tools` installs them);
//! `HERMES_CHROMIUM` and `HERMES_CHROMEDRIVER` point elsewhere.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{Value, json};

/// The key of a web element reference in WebDriver's JSON.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// Chromium or ChromeDriver is missing.
#[derive(Debug, Clone)]
pub struct NoBrowser(pub String);

impl std::fmt::Display for NoBrowser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: run `make tools` (as root it installs Debian's chromium and chromium-driver), or set HERMES_CHROMIUM and HERMES_CHROMEDRIVER",
            self.0
        )
    }
}

impl std::error::Error for NoBrowser {}

fn binary(env: &str, candidates: &[&str]) -> Result<PathBuf, NoBrowser> {
    if let Some(path) = std::env::var_os(env) {
        return Ok(PathBuf::from(path));
    }
    candidates
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .ok_or_else(|| NoBrowser(format!("{} not found", candidates[0])))
}

/// One browser session.
pub struct Browser {
    http: reqwest::Client,
    /// `http://127.0.0.1:<port>/session/<id>`.
    session: String,
    driver: Child,
    _profile: tempfile::TempDir,
}

/// An element of the page.
#[derive(Clone)]
pub struct Element<'a> {
    browser: &'a Browser,
    id: String,
}

impl Browser {
    /// Starts ChromeDriver and a headless Chromium at 1280×900.
    pub async fn start() -> Result<Browser, NoBrowser> {
        let chromium = binary("HERMES_CHROMIUM", &["/usr/bin/chromium", "/usr/bin/chromium-browser"])?;
        let chromedriver = binary("HERMES_CHROMEDRIVER", &["/usr/bin/chromedriver"])?;
        let port = crate::free_port();
        // In a process group of its own, which the browser it starts joins: dropping the
        // `Browser` kills the group, even when a panicking test never ended the session.
        use std::os::unix::process::CommandExt as _;
        let driver = Command::new(&chromedriver)
            .process_group(0)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| NoBrowser(format!("cannot start {}: {e}", chromedriver.display())))?;
        let profile = tempfile::tempdir().map_err(|e| NoBrowser(format!("profile dir: {e}")))?;
        let http = reqwest::Client::builder().timeout(Duration::from_secs(60)).build().expect("http client");
        let base = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let ready = http.get(format!("{base}/status")).send().await.ok();
            if let Some(r) = ready
                && let Ok(v) = r.json::<Value>().await
                && v["value"]["ready"] == true
            {
                break;
            }
            if Instant::now() > deadline {
                return Err(NoBrowser(format!("{} did not start on port {port}", chromedriver.display())));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Without the background-networking flags Chromium keeps trying to reach its vendor's
        // hosts, which this machine's closed network refuses.
        let args = [
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--window-size=1280,900",
            &format!("--user-data-dir={}", profile.path().display()),
        ];
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": chromium, "args": args},
        }}});
        let created: Value = http
            .post(format!("{base}/session"))
            .json(&capabilities)
            .send()
            .await
            .map_err(|e| NoBrowser(format!("new session: {e}")))?
            .json()
            .await
            .map_err(|e| NoBrowser(format!("new session: {e}")))?;
        let Some(id) = created["value"]["sessionId"].as_str() else {
            return Err(NoBrowser(format!("Chromium did not start: {}", created["value"])));
        };
        Ok(Browser { http, session: format!("{base}/session/{id}"), driver, _profile: profile })
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Result<Value, String> {
        let mut request = self.http.request(method, format!("{}{path}", self.session));
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.map_err(|e| format!("webdriver {path}: {e}"))?;
        let status = response.status();
        let value: Value = response.json().await.map_err(|e| format!("webdriver {path}: {e}"))?;
        if !status.is_success() {
            return Err(format!(
                "webdriver {path}: {} {}",
                value["value"]["error"], value["value"]["message"]
            ));
        }
        Ok(value["value"].clone())
    }

    async fn post(&self, path: &str, body: Value) -> Result<Value, String> {
        self.call(reqwest::Method::POST, path, Some(body)).await
    }

    /// Opens `url` and waits for its load event.
    pub async fn goto(&self, url: &str) {
        self.post("/url", json!({"url": url})).await.expect("navigate");
    }

    /// Runs `script` (a function body; `arguments` holds `args`) and returns what it returns.
    pub async fn script(&self, script: &str, args: Value) -> Value {
        self.post("/execute/sync", json!({"script": script, "args": args}))
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// The first element matching `css`, if any.
    pub async fn find(&self, css: &str) -> Option<Element<'_>> {
        let found = self.post("/element", json!({"using": "css selector", "value": css})).await.ok()?;
        Some(Element { browser: self, id: found[ELEMENT].as_str()?.to_owned() })
    }

    /// Every element matching `css`.
    pub async fn find_all(&self, css: &str) -> Vec<Element<'_>> {
        let found =
            self.post("/elements", json!({"using": "css selector", "value": css})).await.unwrap_or_default();
        found
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|e| e[ELEMENT].as_str())
            .map(|id| Element { browser: self, id: id.to_owned() })
            .collect()
    }

    /// Waits up to `timeout` for an element matching `css`; panics naming it after that.
    pub async fn wait_for(&self, css: &str, timeout: Duration) -> Element<'_> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(found) = self.find(css).await {
                return found;
            }
            assert!(
                Instant::now() < deadline,
                "no `{css}` on the page after {timeout:?}: {}",
                self.body_text().await
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits up to `timeout` until `condition` (a script's body) returns true; panics with `what`
    /// and the page's text after that.
    pub async fn wait_until(&self, condition: &str, timeout: Duration, what: &str) {
        let deadline = Instant::now() + timeout;
        while self.script(condition, json!([])).await != Value::Bool(true) {
            assert!(
                Instant::now() < deadline,
                "timed out after {timeout:?} waiting for {what}: {}",
                self.body_text().await
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The text of the first element matching `css`, read in one script (so an element the page
    /// re-rendered meanwhile is never stale), or `None` when there is none.
    pub async fn text_of(&self, css: &str) -> Option<String> {
        let text = self
            .script(
                "const e = document.querySelector(arguments[0]); return e ? e.textContent : null",
                json!([css]),
            )
            .await;
        text.as_str().map(str::to_owned)
    }

    /// An attribute of the first element matching `css`, read as [`Browser::text_of`] does.
    pub async fn attr_of(&self, css: &str, name: &str) -> Option<String> {
        let value = self
            .script("const e = document.querySelector(arguments[0]); return e ? e.getAttribute(arguments[1]) : null", json!([css, name]))
            .await;
        value.as_str().map(str::to_owned)
    }

    /// Waits up to `timeout` for an element matching `css` whose text contains `needle`, and
    /// returns its text; panics with the page's text after that.
    pub async fn wait_text(&self, css: &str, needle: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(text) = self.text_of(css).await
                && text.contains(needle)
            {
                return text;
            }
            assert!(
                Instant::now() < deadline,
                "no `{css}` containing {needle:?} after {timeout:?}: {}",
                self.body_text().await
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The page's visible text, for failure messages.
    pub async fn body_text(&self) -> String {
        let text = self.script("return document.body ? document.body.innerText : ''", json!([])).await;
        text.as_str().unwrap_or_default().chars().take(3000).collect()
    }

    /// Resizes the window (a phone's width: 390).
    pub async fn resize(&self, width: u32, height: u32) {
        self.post("/window/rect", json!({"width": width, "height": height})).await.expect("resize");
    }

    /// A PNG of the viewport, written to `path`.
    pub async fn screenshot(&self, path: &Path) {
        let data = self.call(reqwest::Method::GET, "/screenshot", None).await.expect("screenshot");
        let png =
            base64::engine::general_purpose::STANDARD.decode(data.as_str().unwrap_or_default()).expect("png");
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).expect("screenshot dir");
        }
        std::fs::write(path, png).expect("write screenshot");
    }

    /// Ends the session and the driver.
    pub async fn close(self) {
        let _ = self.call(reqwest::Method::DELETE, "", None).await;
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // The driver leads its process group, and the browser's processes are in it.
        let group = format!("-{}", self.driver.id());
        let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
        let _ = self.driver.wait();
    }
}

impl Element<'_> {
    async fn post(&self, what: &str, body: Value) -> Result<Value, String> {
        self.browser.post(&format!("/element/{}/{what}", self.id), body).await
    }

    async fn get(&self, what: &str) -> Result<Value, String> {
        self.browser.call(reqwest::Method::GET, &format!("/element/{}/{what}", self.id), None).await
    }

    pub async fn click(&self) {
        self.post("click", json!({})).await.unwrap_or_else(|e| panic!("{e}"));
    }

    /// Types `text` into it.
    pub async fn send_keys(&self, text: &str) {
        self.post("value", json!({"text": text})).await.unwrap_or_else(|e| panic!("{e}"));
    }

    pub async fn clear(&self) {
        self.post("clear", json!({})).await.unwrap_or_else(|e| panic!("{e}"));
    }

    /// Its rendered text.
    pub async fn text(&self) -> String {
        self.get("text").await.ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default()
    }

    /// An attribute's value.
    pub async fn attr(&self, name: &str) -> Option<String> {
        self.get(&format!("attribute/{name}")).await.ok().and_then(|v| v.as_str().map(str::to_owned))
    }
}
