//! Dead workers and devices, end to end with mock workers: requests on them
//! are re-dispatched or fail (none hang), the control loop drops their GPUs
//! from the cluster it plans over, and plans them again once they are back.
//! Assertions are on behaviour, never on timing.

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::*;
use hyper::StatusCode;
use serde_json::json;
use tiertp_gateway::worker::mock::MockConfig;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redispatch_when_a_worker_fails() {
    let _serial = one_at_a_time().await;
    let failing = MockConfig {
        failure_rate: 1.0,
        ..MockConfig::default()
    };
    let (gw, w) = start(&[failing, MockConfig::default()]).await;
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
    let _serial = one_at_a_time().await;
    let slow = MockConfig {
        token_delay: Duration::from_millis(20),
        ..MockConfig::default()
    };
    let (gw, mut w) = start(&[slow, slow]).await;
    let addr = gw.addr;
    let reqs: Vec<_> = (0..6)
        .map(|_| tokio::spawn(async move { post(addr, "/v1/completions", completion(50)).await }))
        .collect();
    // Once requests are running, the first worker dies.
    wait_for("a request on the first worker", || async {
        (w[0].counters().submits.load(Ordering::Relaxed) > 0).then_some(())
    })
    .await;
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
    let r = post(gw.addr, "/v1/completions", completion(2)).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_live_worker_gives_503() {
    let _serial = one_at_a_time().await;
    let (gw, mut w) = start(&[MockConfig::default()]).await;
    w[0].kill();
    wait_for("the gateway to notice the dead worker", || async {
        (call(gw.addr, "/health", None, None, &[]).await.status != StatusCode::OK).then_some(())
    })
    .await;
    let r = post(gw.addr, "/v1/completions", json!({"model": "tiny", "prompt": "hello"})).await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{}", r.body);
    assert_eq!(r.json()["error"]["code"], "no_capacity");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_device_leaves_the_plan_and_comes_back() {
    let _serial = one_at_a_time().await;
    let two_devices = MockConfig {
        token_delay: Duration::from_millis(20),
        devices: 2,
        ..MockConfig::default()
    };
    let (gw, w) = start_with(&[two_devices], |c| c.window = Duration::from_millis(250)).await;
    let addr = gw.addr;
    let p = plan(addr).await;
    assert_eq!(planned_gpus(&p), vec![0, 1]);
    assert!(reached(&p, &w[0]), "the initial plan reached the worker");
    // Requests of both tiers (each has a device); then device 1's
    // execution process dies.
    let reqs: Vec<_> = (0..8)
        .map(|i| {
            let key = if i % 2 == 0 { "sk-chat" } else { "sk-slow" };
            tokio::spawn(async move { call(addr, "/v1/completions", Some(key), Some(completion(40).to_string()), &[]).await })
        })
        .collect();
    wait_for("a request on device 1", || async {
        (w[0].submits_per_device()[1] > 0).then_some(())
    })
    .await;
    w[0].kill_device(1);
    // Each request finishes: completed (re-dispatched to device 0 if it had
    // no token yet) or failed with an error; none hangs.
    for r in reqs {
        let r = r.await.unwrap();
        match r.status {
            StatusCode::OK => assert_eq!(r.json()["usage"]["completion_tokens"], 40),
            s => {
                assert!(s.is_server_error(), "{s}: {}", r.body);
                assert!(r.json()["error"]["message"].as_str().unwrap().contains("device 1"), "{}", r.body);
            }
        }
    }
    // The control loop plans over device 0 only, and the worker got that plan.
    let p = wait_for("a plan without GPU 1 at the worker", || async {
        let p = plan(addr).await;
        (p["gpus_down"] == json!([1]) && planned_gpus(&p) == vec![0] && reached(&p, &w[0])).then_some(p)
    })
    .await;
    let (_, devices) = w[0].last_plan().unwrap();
    assert!(devices.iter().all(|d| d.device == 0), "{devices:?}");
    assert_eq!(p["workers"][0]["applied_plan_id"], p["plan_id"]);
    let m = call(addr, "/metrics", None, None, &[]).await.body;
    assert!(
        m.contains("tiertp_gpu_up{gpu=\"1\"} 0") && m.contains("tiertp_tp_level{gpu=\"1\"} 0"),
        "{m}"
    );
    // New requests of both tiers all go to device 0 and complete.
    let on_one = w[0].submits_per_device()[1];
    for key in ["sk-chat", "sk-slow", "sk-chat", "sk-slow"] {
        let r = call(addr, "/v1/completions", Some(key), Some(completion(2).to_string()), &[]).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    }
    assert_eq!(w[0].submits_per_device()[1], on_one, "a request went to the dead device");
    // The device is ready again: it is planned again, and the worker knows.
    w[0].revive_device(1);
    wait_for("GPU 1 back in the plan at the worker", || async {
        let p = plan(addr).await;
        (p["gpus_down"] == json!([]) && planned_gpus(&p) == vec![0, 1] && reached(&p, &w[0])).then_some(())
    })
    .await;
    let (_, devices) = w[0].last_plan().unwrap();
    assert!(devices.iter().any(|d| d.device == 1), "{devices:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_agent_is_reconnected_and_planned_again() {
    let _serial = one_at_a_time().await;
    let (gw, mut w) = start_with(&[MockConfig::default(), MockConfig::default()], |c| {
        c.window = Duration::from_millis(250)
    })
    .await;
    let addr = gw.addr;
    w[0].kill();
    wait_for("a plan without the lost worker's GPU", || async {
        let p = plan(addr).await;
        (p["gpus_down"] == json!([0]) && planned_gpus(&p) == vec![1] && p["workers"][0]["connected"] == false).then_some(())
    })
    .await;
    for _ in 0..4 {
        let r = post(addr, "/v1/completions", completion(2)).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    }
    // The agent comes back on the same endpoint: reconnected, planned again,
    // and sent the current plan (it has none after its restart).
    w[0].restart().await.unwrap();
    planned_and_served(addr, &w[0], "the restarted agent").await;
}
