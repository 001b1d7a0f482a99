//! Helpers of the gateway integration tests: mock workers over the real
//! ZeroMQ protocol, the gateway on port 0, a hyper client, and bounded waits
//! (bounded only so that a bug fails instead of hanging).

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full};
use hyper::{HeaderMap, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tiertp_gateway::config::{GatewayConfig, TokenizerSource, WorkerSpec};
use tiertp_gateway::server::{run_gateway, GatewayHandle};
use tiertp_gateway::worker::mock::{self, MockConfig, MockWorker};
use tiertp_scheduler::tiers::TierSet;

pub const TIERS: &str = include_str!("../tiers.toml");

pub const BOUND: Duration = Duration::from_secs(20);

/// Held by every test of a binary whose tests kill a mock agent and start it
/// again on the same port: while it is down, a mock that another test of
/// the binary starts on port 0 can be given that port, and the gateway then
/// finds an agent where none should be (seen under CI load).
static PORT_REUSE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// One such test at a time (`PORT_REUSE`).
pub async fn one_at_a_time() -> tokio::sync::MutexGuard<'static, ()> {
    PORT_REUSE.lock().await
}

pub async fn start(mocks: &[MockConfig]) -> (GatewayHandle, Vec<MockWorker>) {
    start_with(mocks, |_| {}).await
}

/// The test tiers with `limits` (TOML lines) added to the chat tier.
pub fn limited_tiers(limits: &str) -> TierSet {
    let text = TIERS.replace("api_keys = [\"sk-chat\"]", &format!("api_keys = [\"sk-chat\"]\n{limits}"));
    TierSet::from_toml(&text, "tiers").unwrap()
}

pub async fn start_with(mocks: &[MockConfig], adjust: impl FnOnce(&mut GatewayConfig)) -> (GatewayHandle, Vec<MockWorker>) {
    let mut workers = Vec::new();
    for m in mocks {
        workers.push(MockWorker::start(*m).await.unwrap());
    }
    let gw = gateway_for(&workers, adjust).await;
    (gw, workers)
}

/// The gateway over these mocks (running or not), on port 0.
pub async fn gateway_for(workers: &[MockWorker], adjust: impl FnOnce(&mut GatewayConfig)) -> GatewayHandle {
    let specs = workers
        .iter()
        .map(|w| WorkerSpec {
            endpoint: w.endpoint().to_string(),
            gpus: w.devices(),
        })
        .collect();
    let mut config = GatewayConfig::new("tiny", TokenizerSource::Tiny, TierSet::from_toml(TIERS, "tiers").unwrap(), specs);
    config.bind = SocketAddr::from(([127, 0, 0, 1], 0));
    config.worker_timeout = Duration::from_secs(10);
    config.control_key = Some(mock::key().clone());
    adjust(&mut config);
    run_gateway(config).await.unwrap()
}

pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: String,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
}

pub async fn call(addr: SocketAddr, path: &str, key: Option<&str>, body: Option<String>, extra: &[(&str, &str)]) -> Reply {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut tx, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.unwrap();
    tokio::spawn(conn);
    let mut b = Request::builder().uri(path).header("host", "localhost");
    if let Some(k) = key {
        b = b.header("authorization", format!("Bearer {k}"));
    }
    for (h, v) in extra {
        b = b.header(*h, *v);
    }
    let resp = match body {
        Some(body) => tx.send_request(
            b.method("POST")
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from(body)).boxed())
                .unwrap(),
        ),
        None => tx.send_request(b.method("GET").body(Empty::<Bytes>::new().boxed()).unwrap()),
    };
    let resp = tokio::time::timeout(BOUND, resp).await.expect("no answer").unwrap();
    let (status, headers) = (resp.status(), resp.headers().clone());
    let body = tokio::time::timeout(BOUND, resp.into_body().collect())
        .await
        .expect("body never ended")
        .unwrap()
        .to_bytes();
    Reply {
        status,
        headers,
        body: String::from_utf8(body.to_vec()).unwrap(),
    }
}

pub async fn post(addr: SocketAddr, path: &str, body: Value) -> Reply {
    call(addr, path, Some("sk-chat"), Some(body.to_string()), &[]).await
}

/// A `/v1/completions` body: `max_tokens` tokens after the prompt "hello".
pub fn completion(max_tokens: u32) -> Value {
    json!({"model": "tiny", "prompt": "hello", "max_tokens": max_tokens})
}

/// The `data:` payloads of an SSE body.
pub fn sse_data(body: &str) -> Vec<String> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(|d| d.trim().to_string())
        .collect()
}

/// Polls `f` until it returns `Some`, failing after `BOUND` with `what`.
pub async fn wait_for<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + BOUND;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until the gateway has cancelled at least one request on `w`.
pub async fn wait_for_cancel(w: &MockWorker) {
    wait_for("a cancel at the worker", || async {
        (w.counters().cancels.load(Ordering::Relaxed) > 0).then_some(())
    })
    .await;
}

/// The plan (`/v1/plan`).
pub async fn plan(addr: SocketAddr) -> Value {
    call(addr, "/v1/plan", None, None, &[]).await.json()
}

/// The GPUs the plan's groups cover, sorted.
pub fn planned_gpus(plan: &Value) -> Vec<u64> {
    let mut out: Vec<u64> = plan["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| {
            let (first, tp) = (g["first_gpu"].as_u64().unwrap(), g["tp"].as_u64().unwrap());
            first..first + tp
        })
        .collect();
    out.sort_unstable();
    out
}

/// Whether the gateway's current plan has reached a mock: the mock applied
/// the plan id `/v1/plan` shows.
pub fn reached(plan: &Value, w: &MockWorker) -> bool {
    w.last_plan().map(|(id, _)| id) == plan["plan_id"].as_u64()
}

/// Waits until every GPU of two one-GPU nodes is planned and `w` (an agent
/// back or late) runs the plan, then checks requests reach it.
pub async fn planned_and_served(addr: SocketAddr, w: &MockWorker, what: &str) {
    wait_for(&format!("{what} in the plan with the current plan"), || async {
        let p = plan(addr).await;
        (p["gpus_down"] == json!([]) && planned_gpus(&p) == vec![0, 1] && reached(&p, w)).then_some(())
    })
    .await;
    let before = w.counters().submits.load(Ordering::Relaxed);
    let rs = futures_util::future::join_all((0..8).map(|_| post(addr, "/v1/completions", completion(2)))).await;
    assert!(rs.iter().all(|r| r.status == StatusCode::OK));
    assert!(w.counters().submits.load(Ordering::Relaxed) > before, "no request reached {what}");
}
