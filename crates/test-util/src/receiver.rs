//! A local HTTP receiver of webhooks for the tests: it answers each request with the next
//! scripted status (200 once the script is spent, or 503 while it is told it is down) and keeps
//! every request.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, StatusCode};
use serde_json::Value;

/// One request the receiver got.
#[derive(Clone, Debug)]
pub struct Received {
    pub at: Instant,
    pub headers: HeaderMap,
    pub body: bytes::Bytes,
    /// The status it was answered.
    pub answered: u16,
}

impl Received {
    pub fn header(&self, name: &str) -> String {
        self.headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned()
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).expect("the body is JSON")
    }

    pub fn event_type(&self) -> String {
        self.json()["type"].as_str().unwrap_or_default().to_owned()
    }
}

/// A scripted answer: the status, and a `Retry-After` (a `Location` for a 3xx status).
pub type Reply = (u16, Option<&'static str>);

/// A local HTTP receiver: answers each request with the next scripted status (and
/// `Retry-After`), 200 once the script is spent, 503 while it is down, and keeps every request.
#[derive(Clone)]
pub struct Receiver {
    pub url: String,
    pub got: Arc<Mutex<Vec<Received>>>,
    script: Arc<Mutex<VecDeque<Reply>>>,
    down: Arc<AtomicBool>,
}

impl Receiver {
    pub async fn start() -> Receiver {
        let got: Arc<Mutex<Vec<Received>>> = Default::default();
        let script: Arc<Mutex<VecDeque<Reply>>> = Default::default();
        let down: Arc<AtomicBool> = Default::default();
        let (g, s, d) = (got.clone(), script.clone(), down.clone());
        let app = axum::Router::new().fallback(move |headers: HeaderMap, body: bytes::Bytes| {
            let (got, script, down) = (g.clone(), s.clone(), d.clone());
            async move {
                let (status, retry_after) = match down.load(Ordering::SeqCst) {
                    true => (503, None),
                    false => script.lock().unwrap().pop_front().unwrap_or((200, None)),
                };
                got.lock().unwrap().push(Received { at: Instant::now(), headers, body, answered: status });
                let mut reply = HeaderMap::new();
                if let Some(value) = retry_after {
                    let name = if (300..400).contains(&status) { "location" } else { "retry-after" };
                    reply.insert(name, value.parse().unwrap());
                }
                (StatusCode::from_u16(status).unwrap(), reply, "")
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Receiver { url, got, script, down }
    }

    /// While `down`, every request is answered 503.
    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }

    pub fn answer(&self, replies: &[Reply]) {
        self.script.lock().unwrap().extend(replies.iter().copied());
    }

    /// The first `n` requests, waiting up to `within` for them.
    pub async fn requests(&self, n: usize, within: Duration) -> Vec<Received> {
        let deadline = Instant::now() + within;
        loop {
            let got = self.got.lock().unwrap().clone();
            if got.len() >= n {
                return got;
            }
            assert!(
                Instant::now() < deadline,
                "{n} requests expected within {within:?}, got {}: {got:?}",
                got.len()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
