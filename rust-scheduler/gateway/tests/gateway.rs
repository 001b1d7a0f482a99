//! The gateway end to end: mock workers over the real ZeroMQ protocol, the
//! gateway on port 0, a hyper client. Assertions are on behaviour, never on
//! timing (waits are bounded only so a bug fails instead of hanging).

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use http_body_util::{BodyExt, Full};
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tiertp_gateway::worker::mock::MockConfig;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completion_and_usage() {
    let (gw, _w) = start(&[MockConfig::default()]).await;
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
    let (gw, _w) = start(&[MockConfig::default()]).await;
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
    let (gw, w) = start(&[MockConfig {
        token_delay: Duration::from_millis(1),
        ..MockConfig::default()
    }])
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
    wait_for_cancel(&w[0]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_matches_non_streaming() {
    let (gw, _w) = start(&[MockConfig {
        token_delay: Duration::from_millis(1),
        ..MockConfig::default()
    }])
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
    let (gw, _w) = start(&[MockConfig::default()]).await;
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
    let (gw, w) = start(&[MockConfig::default(), MockConfig::default()]).await;
    let _ = post(gw.addr, "/v1/completions", json!({"model": "tiny", "prompt": "hello"})).await;
    let models = call(gw.addr, "/v1/models", None, None, &[]).await.json();
    assert_eq!(models["data"][0]["id"], "tiny");
    let health = call(gw.addr, "/health", None, None, &[]).await;
    assert_eq!(health.status, StatusCode::OK);
    let p = plan(gw.addr).await;
    assert_eq!(p["num_gpus"], 2);
    assert!(!p["groups"].as_array().unwrap().is_empty());
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
async fn client_disconnect_cancels_on_the_worker() {
    let slow = MockConfig {
        token_delay: Duration::from_millis(20),
        ..MockConfig::default()
    };
    let (gw, w) = start_with(&[slow], |c| c.tiers = limited_tiers("max_concurrent_requests = 1")).await;
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
    wait_for_cancel(&w[0]).await;
    // Its slot and bandwidth came back.
    let r = post(gw.addr, "/v1/completions", completion(2)).await;
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
    assert!(!r.body.contains("tcp://"), "{}", r.body);
    // The timed-out request was cancelled on its worker.
    wait_for_cancel(&w[0]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tier_over_its_rate_gives_429_with_retry_after() {
    // One request per minute for chat: the second is refused, for seconds.
    let (gw, _w) = start_with(&[MockConfig::default()], |c| c.tiers = limited_tiers("max_requests_per_minute = 1")).await;
    let body = completion(2);
    assert_eq!(post(gw.addr, "/v1/completions", body.clone()).await.status, StatusCode::OK);
    let r = post(gw.addr, "/v1/completions", body.clone()).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{}", r.body);
    let retry: u64 = r.headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=60).contains(&retry), "Retry-After {retry}");
    let e = r.json()["error"].clone();
    assert_eq!(e["code"], "rate_limit_exceeded");
    assert!(e["message"].as_str().unwrap().contains("max_requests_per_minute"), "{e}");
    // The limit is the tier's: another tier's key is not affected.
    let r = call(gw.addr, "/v1/completions", Some("sk-slow"), Some(body.to_string()), &[]).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let m = call(gw.addr, "/metrics", None, None, &[]).await.body;
    assert!(m.contains("tiertp_queue_depth{tier=\"chat\"} 0"), "{m}");
}
