//! The core's prefill -> decode decisions are the ones carried out: a move
//! becomes a `hand_off` to the agent holding the request, naming the core's
//! decode group in that agent's numbering; a wait is handed off once the
//! core grants a slot, and a wait the core sheds is cancelled at the agent
//! and ends the client's stream with 503 `overloaded` and Retry-After; a
//! prompt no group can prefill within its TTFT is shed at the door.
//!
//! The planner may not colocate here, so every request is prefilled on a
//! prefill group and needs a decode slot. The control loop runs on a
//! virtual clock (waits expire when the test says so); mock agents speak
//! the real protocol where the wire matters.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use tiertp_gateway::admission::Admission;
use tiertp_gateway::control::{Control, ControlConfig};
use tiertp_gateway::error::ApiError;
use tiertp_gateway::generate::{Running, Start};
use tiertp_gateway::metrics::Metrics;
use tiertp_gateway::protocol::Sampling;
use tiertp_gateway::tokenize::TextCodec;
use tiertp_gateway::worker::mock::{self, MockConfig, MockWorker};
use tiertp_gateway::worker::zmq::ZmqWorker;
use tiertp_gateway::worker::WorkerClient;
use tiertp_scheduler::control::Handoff;
use tiertp_scheduler::plan::GroupKey;
use tiertp_scheduler::planner::PlannerConfig;
use tiertp_scheduler::profile::synthetic;
use tiertp_scheduler::tiers::{Tier, TierSet};

mod recording;
use recording::Recorder;

/// Bounds waits on the mock agents, so a bug fails instead of hanging.
const BOUND: Duration = Duration::from_secs(20);

/// `chat` lends its groups to the looser `agent`, which the planner hosts
/// on them (no group of its own).
fn tiers() -> TierSet {
    TierSet::new(
        vec![Tier::slo_tier("chat", 400.0, 40.0, 1.0), Tier::slo_tier("agent", 800.0, 80.0, 1.0)],
        "t",
    )
    .unwrap()
}

const CHAT: usize = 0;
const AGENT: usize = 1;

/// A control loop over `workers` (each with its GPU count), on a virtual
/// clock the returned cell sets (seconds as f64 bits).
fn control(workers: Vec<Arc<dyn WorkerClient>>, gpus: &[u32]) -> (Arc<Control>, Arc<AtomicU64>) {
    let config = ControlConfig {
        planner: PlannerConfig {
            allow_colocated: false,
            ..PlannerConfig::default()
        },
        window: Duration::from_secs(1),
        stats_timeout: Duration::from_secs(5),
    };
    let metrics = Arc::new(Metrics::new(vec!["chat".into(), "agent".into()]));
    let clock = Arc::new(AtomicU64::new(0f64.to_bits()));
    let now = clock.clone();
    let control = Control::new(tiers(), Arc::new(synthetic::llama8b_like()), workers, gpus, config, metrics)
        .unwrap()
        .with_clock(Arc::new(move || f64::from_bits(now.load(Ordering::SeqCst))));
    (Arc::new(control), clock)
}

/// The plan's groups of `role`, as (first GPU, TP).
fn groups(control: &Control, role: &str) -> Vec<GroupKey> {
    control.plan_json()["groups"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|g| g["role"] == role)
        .map(|g| (g["first_gpu"].as_u64().unwrap() as u32, g["tp"].as_u64().unwrap() as u32))
        .collect()
}

#[tokio::test(flavor = "current_thread")]
async fn a_move_goes_to_the_agent_holding_the_request_naming_the_cores_group_in_its_numbering() {
    let agents = [Arc::new(Recorder::default()), Arc::new(Recorder::default())];
    let workers: Vec<Arc<dyn WorkerClient>> = agents.iter().map(|a| a.clone() as Arc<dyn WorkerClient>).collect();
    let (control, _clock) = control(workers, &[2, 2]);
    // Two nodes of two GPUs: a prefill and a decode group on each, one pair
    // per tier (a prefill group goes only beside a decode group of its
    // tier: a prefilled request's KV cannot leave its node).
    assert_eq!(groups(&control, "decode"), vec![(1, 1), (3, 1)]);
    assert_eq!(groups(&control, "prefill"), vec![(0, 1), (2, 1)]);

    // Prefilled on the second node: moved to its decode group, which is
    // that agent's device 1.
    let p = control.place(1, AGENT, 64, 8, &[], true).unwrap();
    assert_eq!((p.worker, p.key), (1, (2, 1)));
    let decided = control.first_token(1).unwrap().handoff;
    let Handoff::Move(d) = decided else {
        panic!("the core did not move it: {decided:?}")
    };
    assert_eq!(d.key(), (3, 1));
    assert_eq!(*agents[1].hand_offs.lock().unwrap(), vec![(1, (1, 1))]);

    // Prefilled on the first node: moved on that node, by its own agent.
    let p = control.place(2, CHAT, 64, 8, &[], true).unwrap();
    assert_eq!((p.worker, p.key), (0, (0, 1)));
    let Handoff::Move(d) = control.first_token(2).unwrap().handoff else {
        panic!("the core did not move it")
    };
    assert_eq!(d.key(), (1, 1));
    assert_eq!(*agents[0].hand_offs.lock().unwrap(), vec![(2, (1, 1))]);
    assert_eq!(agents[1].hand_offs.lock().unwrap().len(), 1);
    assert!(agents.iter().all(|a| a.cancels.lock().unwrap().is_empty()));
}

#[tokio::test(flavor = "current_thread")]
async fn a_prompt_no_group_can_prefill_within_the_ttft_is_shed_at_the_door() {
    let agents = [Arc::new(Recorder::default()), Arc::new(Recorder::default())];
    let workers: Vec<Arc<dyn WorkerClient>> = agents.iter().map(|a| a.clone() as Arc<dyn WorkerClient>).collect();
    let (control, _clock) = control(workers, &[2, 2]);
    // The longest prompt a tier's own prefill group takes in time.
    let cap_of = |tier: &str| -> u32 {
        control.plan_json()["groups"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|g| g["role"] == "prefill" && g["tier"] == tier)
            .map(|g| g["max_prompt_tokens"].as_u64().unwrap() as u32)
            .max()
            .unwrap()
    };
    let (chat_cap, agent_cap) = (cap_of("chat"), cap_of("agent"));
    assert!(chat_cap > 64 && agent_cap > chat_cap, "{chat_cap} {agent_cap}");
    // It is placed; one token more is shed with 503 `overloaded`: chat
    // cannot use the agent's groups (a looser tier lends to no one), and the
    // agent's prompt is longer than chat's groups take as well. Nothing
    // reaches an agent.
    let shed_before = [CHAT, AGENT].map(|t| control.metrics.tiers[t].shed.load(Ordering::Relaxed));
    for (id, tier, cap) in [(1, CHAT, chat_cap), (3, AGENT, agent_cap)] {
        let placed = control.place(id, tier, cap, 8, &[], true);
        assert!(placed.is_ok(), "{:?}", placed.err());
        let err = control.place(id + 1, tier, cap + 1, 8, &[], true).unwrap_err();
        assert!(matches!(err, ApiError::Overloaded { .. }), "{err:?}");
        assert!(err.to_string().contains("prompt_too_long"), "{err}");
    }
    let shed_after = [CHAT, AGENT].map(|t| control.metrics.tiers[t].shed.load(Ordering::Relaxed));
    assert_eq!(shed_after, [shed_before[0] + 1, shed_before[1] + 1]);
}

/// One mock agent with two devices (prefill on 0, decode on 1) behind the
/// real protocol client; the plan is applied there.
async fn one_node(token_delay: Duration) -> (Arc<Control>, Arc<AtomicU64>, MockWorker) {
    let mock = MockWorker::start(MockConfig {
        token_delay,
        devices: 2,
        ..MockConfig::default()
    })
    .await
    .unwrap();
    let client = ZmqWorker::connect(mock.endpoint(), mock::key(), BOUND).await.unwrap();
    let (control, clock) = control(vec![Arc::new(client)], &[2]);
    control.step().await;
    assert_eq!(mock.last_plan().map(|p| p.0), control.plan_json()["plan_id"].as_u64());
    assert_eq!(
        (groups(&control, "prefill"), groups(&control, "decode")),
        (vec![(0, 1)], vec![(1, 1)])
    );
    (control, clock, mock)
}

/// A request from a client, through the gateway's request path.
fn start(control: &Arc<Control>, admission: &Admission, max_tokens: u32) -> Running {
    let s = Start {
        tier: CHAT,
        input_ids: vec![5, 6, 7],
        sampling: Sampling {
            max_tokens,
            temperature: 0.0,
            top_p: 1.0,
            seed: None,
            stop_token_ids: Vec::new(),
        },
        stop: Vec::new(),
        permit: admission.admit(0).unwrap(),
        arrival: Instant::now(),
    };
    Running::start(control.clone(), Arc::new(TextCodec::tiny()), s, 1, BOUND).unwrap()
}

/// Reads the request to its end; its completion tokens.
async fn to_end(r: &mut Running) -> u32 {
    loop {
        if let Some(f) = r.next(true).await.unwrap().finish {
            return f.completion_tokens;
        }
    }
}

/// Takes every decode slot with chat requests the control loop alone
/// knows (no agent runs them), until the prefill group takes no more (a
/// prompt is admitted there only with a decode slot in view); their ids.
fn fill_decode_slots(control: &Control) -> Vec<u64> {
    let mut held = Vec::new();
    loop {
        let id = control.new_request_id();
        if control.place(id, CHAT, 16, 8, &[], true).is_err() {
            return held;
        }
        let handoff = control.first_token(id).unwrap().handoff;
        assert!(matches!(handoff, Handoff::Move(_)), "request {id} with a slot in view: {handoff:?}");
        held.push(id);
    }
}

/// Makes a client's chat request wait for a decode slot: with one slot
/// free, it is admitted (the slot in view), and before its first token an
/// agent request (counting the slots chat lends it) prefills and takes that
/// slot. Returns the client's request after its first token, and the agent
/// request's id.
async fn wait_for_a_slot(control: &Arc<Control>, admission: &Admission, max_tokens: u32) -> (Running, u64) {
    let held = fill_decode_slots(control);
    control.complete(held[0]);
    let mut waiting = start(control, admission, max_tokens);
    let agent = control.new_request_id();
    control.place(agent, AGENT, 16, 8, &[], true).unwrap();
    assert!(matches!(control.first_token(agent).unwrap().handoff, Handoff::Move(_)));
    waiting.next(true).await.unwrap();
    (waiting, agent)
}

async fn wait_for(what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + BOUND;
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_reaches_the_agent_as_a_hand_off_message_and_the_stream_goes_on() {
    let (control, _clock, mock) = one_node(Duration::from_millis(20)).await;
    let admission = Admission::new(&tiers());
    let mut r = start(&control, &admission, 12);
    let first = r.next(true).await.unwrap();
    assert!(first.finish.is_none());
    let id = r.id();
    wait_for("the hand-off at the agent", || !mock.hand_offs().is_empty()).await;
    assert_eq!(mock.hand_offs(), vec![(id, (1, 1))]);
    assert_eq!(to_end(&mut r).await, 12);
    assert_eq!(mock.counters().cancels.load(Ordering::Relaxed), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_granted_wait_is_handed_off_then_and_a_shed_wait_is_cancelled_with_503() {
    let (control, clock, mock) = one_node(Duration::from_millis(20)).await;
    let admission = Admission::new(&tiers());
    // No decode slot: the request waits, decoding where it is.
    let (mut granted, agent) = wait_for_a_slot(&control, &admission, 12).await;
    // A slot comes free: the core grants it to the waiting request, which
    // is handed off then.
    control.complete(agent);
    wait_for("the granted hand-off at the agent", || !mock.hand_offs().is_empty()).await;
    assert_eq!(mock.hand_offs(), vec![(granted.id(), (1, 1))]);
    assert_eq!(to_end(&mut granted).await, 12);
    drop(granted);

    // Full again; this one waits past its TPOT budget and the next window
    // sheds it.
    let (mut shed, _) = wait_for_a_slot(&control, &admission, 1000).await;
    let shed_before = control.metrics.tiers[CHAT].shed.load(Ordering::Relaxed);
    clock.store(1e3f64.to_bits(), Ordering::SeqCst);
    control.step().await;
    let err = shed.next(true).await.unwrap_err();
    assert!(matches!(err, ApiError::Overloaded { .. }), "{err:?}");
    assert!(err.to_string().contains("handoff_timeout"), "{err}");
    wait_for("the cancel at the agent", || mock.counters().cancels.load(Ordering::Relaxed) == 1).await;
    assert_eq!(mock.hand_offs().len(), 1, "the shed request was not handed off");
    assert_eq!(control.metrics.tiers[CHAT].shed.load(Ordering::Relaxed), shed_before + 1);
    assert_eq!(control.metrics.tiers[CHAT].errors.load(Ordering::Relaxed), 0);
    drop(shed);
    assert_eq!(
        control.metrics.tiers[CHAT].errors.load(Ordering::Relaxed),
        0,
        "a shed is not an error"
    );
    // What the client gets: like an admission shed.
    let resp = err.into_response();
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(resp.headers()[header::RETRY_AFTER], "1");
    let body = axum::body::to_bytes(resp.into_body(), 1 << 16).await.unwrap();
    let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body["error"]["code"], "overloaded");
}
