//! Several nodes: one mock agent per node, each numbering its own devices.
//! TP groups stay inside one node, and an agent that is not up when the
//! gateway starts joins the plan when it comes up.

mod common;

use std::time::Duration;

use common::*;
use hyper::StatusCode;
use serde_json::{json, Value};
use tiertp_gateway::worker::mock::{MockConfig, MockWorker};

/// The plan's groups as (first GPU, TP).
fn plan_groups(p: &Value) -> Vec<(u64, u64)> {
    p["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| (g["first_gpu"].as_u64().unwrap(), g["tp"].as_u64().unwrap()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tp_groups_never_span_nodes() {
    let _serial = one_at_a_time().await;
    // Nodes of 1, 4 and 1 GPUs (global 0 | 1 2 3 4 | 5). Over one flat pool
    // the aligned TP2 groups would be {0,1}, {2,3} and {4,5}, the first and
    // the last across two nodes; per node they are {1,2} and {3,4}.
    let mocks = [1, 4, 1].map(|devices| MockConfig {
        devices,
        ..MockConfig::default()
    });
    let (gw, w) = start_with(&mocks, |c| {
        c.planner.tp_levels = vec![1, 2];
        // Only prefill and decode groups: TP2 prefill is planned even idle.
        c.planner.allow_colocated = false;
    })
    .await;
    let p = wait_for("the plan at every agent", || async {
        let p = plan(gw.addr).await;
        w.iter().all(|m| reached(&p, m)).then_some(p)
    })
    .await;
    let groups = plan_groups(&p);
    assert!(groups.contains(&(1, 2)), "no TP2 group: {p}");
    for (first, tp) in &groups {
        let inside = p["workers"].as_array().unwrap().iter().any(|n| {
            let (start, gpus) = (n["first_gpu"].as_u64().unwrap(), n["gpus"].as_u64().unwrap());
            start <= *first && first + tp <= start + gpus
        });
        assert!(inside, "group ({first}, {tp}) spans nodes: {p}");
    }
    // Each agent got its share in its own device numbering.
    let (_, middle) = w[1].last_plan().unwrap();
    let tp2: Vec<_> = middle.iter().filter(|d| d.tp_group.1 == 2).collect();
    assert!(!tp2.is_empty() && tp2.iter().all(|d| d.tp_group == (0, 2)), "{middle:?}");
    assert!(
        middle.iter().all(|d| d.device < 4 && d.tp_group.0 + d.tp_group.1 <= 4),
        "{middle:?}"
    );
    for m in [&w[0], &w[2]] {
        let (_, devices) = m.last_plan().unwrap();
        assert!(devices.iter().all(|d| d.device == 0 && d.tp_group.1 == 1), "{devices:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_down_at_start_joins_when_it_comes_up() {
    let _serial = one_at_a_time().await;
    let mut w = vec![
        MockWorker::start(MockConfig::default()).await.unwrap(),
        MockWorker::start(MockConfig::default()).await.unwrap(),
    ];
    // The second node's agent is not up yet: the gateway starts anyway.
    w[1].kill_and_wait().await;
    let gw = gateway_for(&w, |c| {
        c.window = Duration::from_millis(250);
        c.connect_timeout = Duration::from_millis(300);
    })
    .await;
    let addr = gw.addr;
    let p = plan(addr).await;
    assert_eq!(p["gpus_down"], json!([1]), "{p}");
    assert_eq!(planned_gpus(&p), vec![0]);
    assert_eq!(p["workers"][1]["connected"], false);
    let r = post(addr, "/v1/completions", completion(2)).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    // It comes up: connected, planned, sent the plan, and given requests.
    w[1].restart().await.unwrap();
    planned_and_served(addr, &w[1], "the late agent").await;
}
