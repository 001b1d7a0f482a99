//! `tiertp bench gateway`: requests/s and latency through the gateway with
//! mock workers (zero token delay, so the latency is what the gateway and
//! the protocol add) and the load generator in the same process, on loopback.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::TokioIo;
use serde_json::json;

use crate::mock_gateway::{self, API_KEY, MODEL};
use crate::worker::mock::MockConfig;

#[derive(Debug, Clone)]
pub struct BenchSettings {
    /// Timed requests (after `warmup`), bounded further by `max_seconds`.
    pub requests: u64,
    pub warmup: u64,
    /// Client connections, each with one request at a time.
    pub concurrency: usize,
    pub workers: usize,
    pub max_tokens: u32,
    pub max_seconds: f64,
    /// Runtime threads (the machine has 2 cores).
    pub threads: usize,
}

impl Default for BenchSettings {
    fn default() -> Self {
        Self {
            requests: 100_000,
            warmup: 2_000,
            concurrency: 64,
            workers: 2,
            max_tokens: 8,
            max_seconds: 20.0,
            threads: 2,
        }
    }
}

/// Runs the bench; the JSON has `req_per_s`, `p50_ms`, `p99_ms` and more.
pub fn run(settings: &BenchSettings) -> Result<serde_json::Value, String> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(settings.threads.max(1))
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(run_async(settings))
}

async fn run_async(s: &BenchSettings) -> Result<serde_json::Value, String> {
    let gw = mock_gateway::start(s.workers, MockConfig::default()).await?;
    let body = Bytes::from(
        json!({"model": MODEL, "prompt": "the quick brown fox jumps over the lazy dog", "max_tokens": s.max_tokens}).to_string(),
    );
    let warm = load(gw.addr, body.clone(), s.warmup, s.concurrency, s.max_seconds).await?;
    let t0 = Instant::now();
    let res = load(gw.addr, body, s.requests, s.concurrency, s.max_seconds).await?;
    let elapsed = t0.elapsed().as_secs_f64();
    gw.shutdown().await;
    let mut lat = res.latencies_us;
    lat.sort_unstable();
    let pct = |p: f64| {
        lat.get(((lat.len() as f64 - 1.0) * p).round() as usize)
            .map_or(0.0, |&us| us as f64 / 1e3)
    };
    Ok(json!({
        "req_per_s": lat.len() as f64 / elapsed,
        "p50_ms": pct(0.5),
        "p99_ms": pct(0.99),
        "max_ms": lat.last().map_or(0.0, |&us| us as f64 / 1e3),
        "requests": lat.len(),
        "errors": res.errors + warm.errors,
        "seconds": elapsed,
        "concurrency": s.concurrency,
        "workers": s.workers,
        "max_tokens": s.max_tokens,
        "threads": s.threads,
        "stream": false,
    }))
}

struct LoadResult {
    latencies_us: Vec<u64>,
    errors: u64,
}

/// `total` requests over `concurrency` keep-alive connections, stopping
/// early after `max_seconds`.
async fn load(addr: SocketAddr, body: Bytes, total: u64, concurrency: usize, max_seconds: f64) -> Result<LoadResult, String> {
    let concurrency = concurrency.max(1) as u64;
    let deadline = Instant::now() + Duration::from_secs_f64(max_seconds);
    let mut tasks = Vec::new();
    for c in 0..concurrency {
        let n = total / concurrency + u64::from(c < total % concurrency);
        let body = body.clone();
        tasks.push(tokio::spawn(async move {
            let stream = tokio::net::TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
            let _ = stream.set_nodelay(true);
            let (mut tx, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .map_err(|e| e.to_string())?;
            tokio::spawn(conn);
            let mut out = LoadResult {
                latencies_us: Vec::with_capacity(n as usize),
                errors: 0,
            };
            for _ in 0..n {
                if Instant::now() > deadline {
                    break;
                }
                let req = Request::post("/v1/completions")
                    .header("host", "127.0.0.1")
                    .header("content-type", "application/json")
                    .header("authorization", format!("Bearer {API_KEY}"))
                    .body(Full::new(body.clone()))
                    .map_err(|e| e.to_string())?;
                let t = Instant::now();
                let resp = tx.send_request(req).await.map_err(|e| e.to_string())?;
                let ok = resp.status().is_success();
                let _ = resp.into_body().collect().await.map_err(|e| e.to_string())?;
                if ok {
                    out.latencies_us.push(t.elapsed().as_micros() as u64);
                } else {
                    out.errors += 1;
                }
            }
            Ok::<_, String>(out)
        }));
    }
    let mut all = LoadResult {
        latencies_us: Vec::new(),
        errors: 0,
    };
    for t in tasks {
        let r = t.await.map_err(|e| e.to_string())??;
        all.latencies_us.extend(r.latencies_us);
        all.errors += r.errors;
    }
    Ok(all)
}
