//! Errors as an OpenAI or vLLM client meets them: every 4xx body is the JSON
//! error object, limits are named, and no error names a worker's internal
//! endpoint.

mod common;

use std::sync::atomic::Ordering;

use common::*;
use hyper::StatusCode;
use serde_json::json;
use tiertp_gateway::worker::mock::MockConfig;

/// The `error` object of a JSON error reply, after checking its status.
fn error_of(r: &Reply, status: StatusCode) -> serde_json::Value {
    assert_eq!(r.status, status, "{}", r.body);
    assert!(
        r.headers["content-type"].to_str().unwrap().starts_with("application/json"),
        "{:?}",
        r.headers
    );
    assert!(!r.body.contains("tcp://"), "an internal endpoint in: {}", r.body);
    r.json()["error"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_body_gets_a_json_413_naming_the_limit() {
    let (gw, _w) = start_with(&[MockConfig::default()], |c| c.max_body_bytes = 1024).await;
    let big = json!({"model": "tiny", "prompt": "hello ".repeat(1000), "max_tokens": 2});
    let r = post(gw.addr, "/v1/completions", big).await;
    let e = error_of(&r, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(e["type"], "invalid_request_error");
    assert!(e["message"].as_str().unwrap().contains("1024 bytes"), "{e}");
    // Under the limit, served as before.
    let r = post(gw.addr, "/v1/completions", completion(2)).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_tokens_over_the_context_is_refused_at_the_gateway() {
    let small = MockConfig {
        max_model_len: Some(16),
        ..MockConfig::default()
    };
    let (gw, w) = start(&[small]).await;
    let r = post(gw.addr, "/v1/completions", completion(20)).await;
    let e = error_of(&r, StatusCode::BAD_REQUEST);
    assert_eq!(
        e["message"],
        "This model's maximum context length is 16 tokens. However, you requested 21 tokens \
         (1 in the messages, 20 in the completion). Please reduce the length of the messages or completion."
    );
    assert_eq!(
        (e["type"].as_str(), e["param"].as_str()),
        (Some("invalid_request_error"), Some("max_tokens"))
    );
    let chat = json!({"model": "tiny", "messages": [{"role": "user", "content": "say hi"}], "max_tokens": 100});
    let e = error_of(&post(gw.addr, "/v1/chat/completions", chat).await, StatusCode::BAD_REQUEST);
    assert!(
        e["message"].as_str().unwrap().contains("in the messages, 100 in the completion"),
        "{e}"
    );
    // Neither reached the worker; what fits is served, and without
    // `max_tokens` the default is cut to what fits.
    assert_eq!(w[0].counters().submits.load(Ordering::Relaxed), 0);
    assert_eq!(post(gw.addr, "/v1/completions", completion(15)).await.status, StatusCode::OK);
    let long = json!({"model": "tiny", "prompt": "a b c d e a b c d e a b c d"});
    let r = post(gw.addr, "/v1/completions", long).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(r.json()["usage"]["total_tokens"], 16);
    let full = json!({"model": "tiny", "prompt": "a b c d e a b c d e a b c d e a"});
    let e = error_of(&post(gw.addr, "/v1/completions", full).await, StatusCode::BAD_REQUEST);
    assert_eq!(e["param"], "prompt");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_failures_do_not_name_the_worker() {
    let failing = MockConfig {
        failure_rate: 1.0,
        ..MockConfig::default()
    };
    let (gw, _w) = start_with(&[failing], |c| c.max_attempts = 1).await;
    let e = error_of(&post(gw.addr, "/v1/completions", completion(2)).await, StatusCode::BAD_GATEWAY);
    assert_eq!(e["code"], "worker_error");
    assert!(e["message"].as_str().unwrap().contains("worker_died"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logprobs_are_refused() {
    let (gw, w) = start(&[MockConfig::default()]).await;
    for (path, body) in [
        (
            "/v1/completions",
            json!({"model": "tiny", "prompt": "hello", "max_tokens": 2, "logprobs": 1}),
        ),
        (
            "/v1/chat/completions",
            json!({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "logprobs": true}),
        ),
    ] {
        let e = error_of(&post(gw.addr, path, body).await, StatusCode::BAD_REQUEST);
        assert_eq!(e["param"], "logprobs");
        assert!(e["message"].as_str().unwrap().contains("not supported"), "{e}");
    }
    assert_eq!(w[0].counters().submits.load(Ordering::Relaxed), 0);
    let off = json!({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "logprobs": false});
    let r = post(gw.addr, "/v1/chat/completions", off).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
}
