//! The gateway end to end: mock workers over the real ZeroMQ protocol, the
//! gateway on port 0, a hyper client. Assertions are on behaviour, never on
//! timing (waits are bounded only so a bug fails instead of hanging).

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full};
use hyper::{HeaderMap, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tiertp_gateway::config::{GatewayConfig, TierLimits, TokenizerSource, WorkerSpec};
use tiertp_gateway::server::{run_gateway, GatewayHandle};
use tiertp_gateway::worker::mock::{MockConfig, MockWorker};
use tiertp_scheduler::tiers::TierSet;

const TIERS: &str = r#"
[[tier]]
name = "chat"
ttft_ms = 500
tpot_ms = 50
api_keys = ["sk-chat"]

[[tier]]
name = "slow"
ttft_ms = 5000
tpot_ms = 200
api_keys = ["sk-slow"]
"#;

const BOUND: Duration = Duration::from_secs(20);

async fn start(mocks: &[MockConfig], limits: &[(&str, TierLimits)]) -> (GatewayHandle, Vec<MockWorker>) {
    let limits: Vec<(String, TierLimits)> = limits.iter().map(|(n, l)| (n.to_string(), *l)).collect();
    start_with(mocks, move |c| c.limits = limits.into_iter().collect()).await
}

async fn start_with(mocks: &[MockConfig], adjust: impl FnOnce(&mut GatewayConfig)) -> (GatewayHandle, Vec<MockWorker>) {
    let mut workers = Vec::new();
    for m in mocks {
        workers.push(MockWorker::start(*m).await.unwrap());
    }
    let specs = workers
        .iter()
        .map(|w| WorkerSpec {
            endpoint: w.endpoint().to_string(),
            gpus: 1,
        })
        .collect();
    let mut config = GatewayConfig::new("tiny", TokenizerSource::Tiny, TierSet::from_toml(TIERS, "tiers").unwrap(), specs);
    config.bind = SocketAddr::from(([127, 0, 0, 1], 0));
    config.worker_timeout = Duration::from_secs(10);
    adjust(&mut config);
    let gw = run_gateway(config).await.unwrap();
    (gw, workers)
}

struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    body: String,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
}

async fn call(addr: SocketAddr, path: &str, key: Option<&str>, body: Option<String>, extra: &[(&str, &str)]) -> Reply {
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

async fn post(addr: SocketAddr, path: &str, body: Value) -> Reply {
    call(addr, path, Some("sk-chat"), Some(body.to_string()), &[]).await
}

/// The `data:` payloads of an SSE body.
fn sse_data(body: &str) -> Vec<String> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(|d| d.trim().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completion_and_usage() {
    let (gw, _w) = start(&[MockConfig::default()], &[]).await;
    let r = post(
        gw.addr,
        "/v1/completions",
        json!({"model": "tiny", "prompt": "hello world", "max_tokens": 5, "temperature": 0, "top_p": 0.9, "seed": 3}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let v = r.json();
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["choices"][0]["text"], "hello world hello world hello");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"], json!({"prompt_tokens": 2, "completion_tokens": 5, "total_tokens": 7}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_completion_with_template() {
    let (gw, _w) = start(&[MockConfig::default()], &[]).await;
    let r = post(
        gw.addr,
        "/v1/chat/completions",
        json!({"model": "tiny", "messages": [{"role": "user", "content": "say hi"}], "max_tokens": 3}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    // The mock echoes the templated prompt: <|im_start|> user say ...; the
    // special token is not decoded.
    assert_eq!(v["choices"][0]["message"], json!({"role": "assistant", "content": "user say"}));
    assert_eq!(v["usage"]["prompt_tokens"], 7);
    assert_eq!(v["usage"]["completion_tokens"], 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_strings_cut_the_text() {
    let (gw, w) = start(
        &[MockConfig {
            token_delay: Duration::from_millis(1),
            ..MockConfig::default()
        }],
        &[],
    )
    .await;
    let r = post(
        gw.addr,
        "/v1/completions",
        json!({"model": "tiny", "prompt": "one two three end", "max_tokens": 50, "stop": ["three"]}),
    )
    .await;
    let v = r.json();
    assert_eq!(v["choices"][0]["text"], "one two ");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    // The worker was still generating: the gateway cancelled it.
    let deadline = tokio::time::Instant::now() + BOUND;
    while w[0].counters().cancels.load(Ordering::Relaxed) == 0 {
        assert!(tokio::time::Instant::now() < deadline, "the worker never got a cancel");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_matches_non_streaming() {
    let (gw, _w) = start(
        &[MockConfig {
            token_delay: Duration::from_millis(1),
            ..MockConfig::default()
        }],
        &[],
    )
    .await;
    for (path, body) in [
        (
            "/v1/completions",
            json!({"model": "tiny", "prompt": "the quick brown fox", "max_tokens": 6}),
        ),
        (
            "/v1/chat/completions",
            json!({"model": "tiny", "messages": [{"role": "user", "content": "the quick fox"}], "max_tokens": 6}),
        ),
    ] {
        let plain = post(gw.addr, path, body.clone()).await.json();
        let mut sb = body.clone();
        sb["stream"] = json!(true);
        sb["stream_options"] = json!({"include_usage": true});
        let r = post(gw.addr, path, sb).await;
        assert_eq!(r.status, StatusCode::OK);
        assert!(r.headers["content-type"].to_str().unwrap().starts_with("text/event-stream"));
        let data = sse_data(&r.body);
        assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{}", r.body);
        let chunks: Vec<Value> = data[..data.len() - 1].iter().map(|d| serde_json::from_str(d).unwrap()).collect();
        let usage = chunks.last().unwrap();
        assert_eq!(usage["usage"], plain["usage"]);
        let mut text = String::new();
        let mut finish = Value::Null;
        for c in &chunks[..chunks.len() - 1] {
            let ch = &c["choices"][0];
            text.push_str(ch["text"].as_str().or(ch["delta"]["content"].as_str()).unwrap_or(""));
            if !ch["finish_reason"].is_null() {
                finish = ch["finish_reason"].clone();
            }
        }
        let expected = plain["choices"][0]["text"]
            .as_str()
            .or(plain["choices"][0]["message"]["content"].as_str())
            .unwrap();
        assert_eq!(text, expected, "{path}");
        assert_eq!(finish, "length");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_errors() {
    let (gw, _w) = start(&[MockConfig::default()], &[]).await;
    let ok = json!({"model": "tiny", "prompt": "hello"}).to_string();
    let r = call(gw.addr, "/v1/completions", Some("sk-wrong"), Some(ok.clone()), &[]).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert_eq!(r.json()["error"]["code"], "invalid_api_key");
    let r = call(gw.addr, "/v1/completions", None, Some(ok.clone()), &[]).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    let r = post(
        gw.addr,
        "/v1/completions",
        json!({"model": "tiny", "prompt": "hello", "max_tokens": "many"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    let e = r.json()["error"].clone();
    assert_eq!(
        (e["type"].as_str(), e["param"].as_str()),
        (Some("invalid_request_error"), Some("max_tokens"))
    );
    assert!(e["message"].as_str().unwrap().contains("max_tokens"));
    let r = call(gw.addr, "/v1/chat/completions", Some("sk-chat"), Some("{\"model\": ".into()), &[]).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    let r = post(gw.addr, "/v1/chat/completions", json!({"model": "tiny", "messages": "hi"})).await;
    assert_eq!(r.json()["error"]["param"], "messages");
    let r = post(gw.addr, "/v1/completions", json!({"model": "gpt-9", "prompt": "hello"})).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(r.json()["error"]["code"], "model_not_found");
    // A key may ask for a lower tier, never a higher one.
    let r = call(
        gw.addr,
        "/v1/completions",
        Some("sk-chat"),
        Some(ok.clone()),
        &[("x-tiertp-tier", "slow")],
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let r = call(gw.addr, "/v1/completions", Some("sk-slow"), Some(ok), &[("x-tiertp-tier", "chat")]).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn info_endpoints() {
    let (gw, w) = start(&[MockConfig::default(), MockConfig::default()], &[]).await;
    let _ = post(gw.addr, "/v1/completions", json!({"model": "tiny", "prompt": "hello"})).await;
    let models = call(gw.addr, "/v1/models", None, None, &[]).await.json();
    assert_eq!(models["data"][0]["id"], "tiny");
    let health = call(gw.addr, "/health", None, None, &[]).await;
    assert_eq!(health.status, StatusCode::OK);
    let plan = call(gw.addr, "/v1/plan", None, None, &[]).await.json();
    assert_eq!(plan["num_gpus"], 2);
    assert!(!plan["groups"].as_array().unwrap().is_empty());
    let m = call(gw.addr, "/metrics", None, None, &[]).await.body;
    for needle in [
        "tiertp_arrivals_total{tier=\"chat\"} 1",
        "tiertp_completions_total{tier=\"chat\"} 1",
        "tiertp_ttft_seconds_count{tier=\"chat\"} 1",
        "tiertp_queue_depth{tier=\"chat\"} 0",
        "tiertp_tp_level{gpu=\"1\"}",
        "tiertp_plan_changes_total",
    ] {
        assert!(m.contains(needle), "{needle} missing from:\n{m}");
    }
    // The initial plan went to both workers.
    assert!(w.iter().all(|w| w.counters().plans.load(Ordering::Relaxed) >= 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redispatch_when_a_worker_fails() {
    let failing = MockConfig {
        failure_rate: 1.0,
        ..MockConfig::default()
    };
    let (gw, w) = start(&[failing, MockConfig::default()], &[]).await;
    let reqs = (0..16).map(|_| {
        post(
            gw.addr,
            "/v1/completions",
            json!({"model": "tiny", "prompt": "hello world", "max_tokens": 4}),
        )
    });
    for r in futures_util::future::join_all(reqs).await {
        assert_eq!(r.status, StatusCode::OK, "{}", r.body);
        assert_eq!(r.json()["choices"][0]["text"], "hello world hello world");
    }
    let failed = w[0].counters().failures.load(Ordering::Relaxed);
    assert!(failed > 0, "the failing worker got no request");
    let m = call(gw.addr, "/metrics", None, None, &[]).await.body;
    assert!(m.contains(&format!("tiertp_redispatches_total {failed}")), "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_worker_leaves_no_request_hanging() {
    let slow = MockConfig {
        token_delay: Duration::from_millis(20),
        ..MockConfig::default()
    };
    let (gw, mut w) = start(&[slow, slow], &[]).await;
    let addr = gw.addr;
    let reqs: Vec<_> = (0..6)
        .map(|_| {
            tokio::spawn(async move {
                post(
                    addr,
                    "/v1/completions",
                    json!({"model": "tiny", "prompt": "hello", "max_tokens": 50}),
                )
                .await
            })
        })
        .collect();
    // Once requests are running, the first worker dies.
    let deadline = tokio::time::Instant::now() + BOUND;
    while w[0].counters().submits.load(Ordering::Relaxed) == 0 {
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    w[0].kill();
    let mut failed = 0;
    for r in reqs {
        let r = r.await.unwrap();
        match r.status {
            StatusCode::OK => assert_eq!(r.json()["usage"]["completion_tokens"], 50),
            s => {
                assert!(s.is_server_error(), "{s}: {}", r.body);
                assert!(r.json()["error"]["message"].is_string());
                failed += 1;
            }
        }
    }
    // Each request of the dead worker failed (tokens already sent) or was
    // re-dispatched (none sent yet).
    let m = call(gw.addr, "/metrics", None, None, &[]).await.body;
    let redispatched: u64 = m
        .lines()
        .find_map(|l| l.strip_prefix("tiertp_redispatches_total "))
        .unwrap()
        .parse()
        .unwrap();
    assert!(failed + redispatched > 0, "no request was on the dead worker");
    // New requests go to the live worker.
    let r = post(
        gw.addr,
        "/v1/completions",
        json!({"model": "tiny", "prompt": "hello", "max_tokens": 2}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_disconnect_cancels_on_the_worker() {
    let slow = MockConfig {
        token_delay: Duration::from_millis(20),
        ..MockConfig::default()
    };
    let limit = TierLimits {
        max_concurrent: Some(1),
        max_rps: None,
    };
    let (gw, w) = start(&[slow], &[("chat", limit)]).await;
    let stream = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    let (mut tx, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.unwrap();
    let conn = tokio::spawn(conn);
    let body = json!({"model": "tiny", "prompt": "hello", "max_tokens": 10000, "stream": true}).to_string();
    let req = Request::post("/v1/completions")
        .header("host", "localhost")
        .header("authorization", "Bearer sk-chat")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let resp = tokio::time::timeout(BOUND, tx.send_request(req)).await.unwrap().unwrap();
    let mut body = resp.into_body();
    let first = tokio::time::timeout(BOUND, body.frame()).await.unwrap().unwrap().unwrap();
    assert!(first.data_ref().is_some());
    // While it streams, the tier's one slot is taken: 429 with Retry-After.
    let r = post(gw.addr, "/v1/completions", json!({"model": "tiny", "prompt": "hello"})).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(r.headers.contains_key("retry-after"));
    // The client goes away mid-stream.
    drop(body);
    drop(tx);
    conn.abort();
    let deadline = tokio::time::Instant::now() + BOUND;
    while w[0].counters().cancels.load(Ordering::Relaxed) == 0 {
        assert!(tokio::time::Instant::now() < deadline, "the worker never got a cancel");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Its slot and bandwidth came back.
    let r = post(
        gw.addr,
        "/v1/completions",
        json!({"model": "tiny", "prompt": "hello", "max_tokens": 2}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_worker_gives_504() {
    let stuck = MockConfig {
        token_delay: Duration::from_secs(3600),
        ..MockConfig::default()
    };
    let (gw, w) = start_with(&[stuck], |c| c.worker_timeout = Duration::from_millis(200)).await;
    let r = post(gw.addr, "/v1/completions", json!({"model": "tiny", "prompt": "hello"})).await;
    assert_eq!(r.status, StatusCode::GATEWAY_TIMEOUT, "{}", r.body);
    assert_eq!(r.json()["error"]["code"], "timeout");
    // The timed-out request was cancelled on its worker.
    let deadline = tokio::time::Instant::now() + BOUND;
    while w[0].counters().cancels.load(Ordering::Relaxed) == 0 {
        assert!(tokio::time::Instant::now() < deadline, "the worker never got a cancel");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_live_worker_gives_503() {
    let (gw, mut w) = start(&[MockConfig::default()], &[]).await;
    w[0].kill();
    let deadline = tokio::time::Instant::now() + BOUND;
    while call(gw.addr, "/health", None, None, &[]).await.status == StatusCode::OK {
        assert!(tokio::time::Instant::now() < deadline, "the gateway never noticed the dead worker");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let r = post(gw.addr, "/v1/completions", json!({"model": "tiny", "prompt": "hello"})).await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{}", r.body);
    assert_eq!(r.json()["error"]["code"], "no_capacity");
}
