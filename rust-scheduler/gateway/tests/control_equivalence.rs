//! One policy, two drivers: a simulated run of `tiertp` is replayed through
//! the gateway's control path (mock workers, a virtual clock) event by
//! event — arrivals, first tokens, completions, control windows — and the
//! gateway must decide exactly what the simulator decided: the same
//! admission (group and class, or shed) for every request, the same hand-off
//! decisions, the same plan, with the same caps, at every window, and, for
//! each request on a group a plan change stops, the same new group (the
//! simulator moves it there; the gateway sends it with the plan).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tiertp_gateway::control::{Control, ControlConfig};
use tiertp_gateway::error::ApiError;
use tiertp_gateway::metrics::Metrics;
use tiertp_gateway::worker::WorkerClient;
use tiertp_scheduler::control::{Handoff, ShedReason};
use tiertp_scheduler::planner::PlannerConfig;
use tiertp_scheduler::profile::synthetic;
use tiertp_scheduler::tiers::{Tier, TierSet};
use tiertp_sim::policy::Route;
use tiertp_sim::rejection::Rejection;
use tiertp_sim::request::TraceRequest;
use tiertp_sim::{simulate, ControlEvent, SimSettings};

mod recording;
use recording::Recorder;

fn tiers() -> TierSet {
    TierSet::new(
        vec![
            Tier::slo_tier("chat", 400.0, 40.0, 2.0),
            Tier::slo_tier("agent", 1500.0, 100.0, 1.0),
        ],
        "t",
    )
    .unwrap()
}

/// Two tiers, a load that grows past what 4 GPUs serve within the SLOs (so
/// requests are shed too), deterministic arrivals.
fn trace() -> Vec<TraceRequest> {
    let mut out = Vec::new();
    let mut t = 0.0;
    let mut k = 0u32;
    while t < 40.0 {
        let rate = 4.0 + t * 4.0;
        t += 1.0 / rate;
        k += 1;
        let tier = usize::from(k % 3 == 0);
        out.push(TraceRequest {
            arrival_s: t,
            tier,
            prompt_tokens: 300 + (k * 97) % 1400,
            output_tokens: if tier == 0 { 40 + (k * 31) % 120 } else { 8 + k % 24 },
        });
    }
    out
}

/// Long chat prompts (a TP2 prefill fits chat's TTFT, a TP1 one does not),
/// then short agent ones, then chat again: each phase outlasts the demand
/// memory, so TP groups merge and split with requests in flight.
fn phased_trace() -> Vec<TraceRequest> {
    let mut out = Vec::new();
    let mut k = 0u32;
    for (start, end, tier, rate) in [(0.0, 40.0, 0, 5.0), (40.0, 80.0, 1, 30.0), (80.0, 110.0, 0, 5.0)] {
        let mut t = start;
        while t < end {
            t += 1.0 / rate;
            k += 1;
            out.push(TraceRequest {
                arrival_s: t,
                tier,
                prompt_tokens: if tier == 0 { 6000 + (k * 97) % 4000 } else { 200 + (k * 97) % 600 },
                output_tokens: 20 + (k * 31) % 100,
            });
        }
    }
    out.sort_by(|a, b| a.arrival_s.total_cmp(&b.arrival_s));
    out
}

/// Decisions the two drivers agreed on.
#[derive(Debug, Default)]
struct Agreed {
    admitted: u32,
    shed: u32,
    windows: u32,
    changes: u32,
    moved: u32,
    /// TP groups the simulator started at plan changes.
    switches: u64,
}

#[tokio::test(flavor = "current_thread")]
async fn the_gateway_decides_what_the_simulator_decided() {
    let a = replay_through_gateway(&trace()).await;
    // The scenario exercised every kind of decision.
    assert!(a.admitted > 100 && a.shed > 10, "{a:?}");
    assert!(a.windows > 30 && a.changes >= 1, "{a:?}");
}

#[tokio::test(flavor = "current_thread")]
async fn the_gateway_moves_requests_off_stopped_groups_where_the_simulator_does() {
    let a = replay_through_gateway(&phased_trace()).await;
    assert!(a.switches >= 2 && a.moved >= 5 && a.shed > 0, "{a:?}");
}

/// Simulates `reqs` under `tiertp`, then feeds its control events to the
/// gateway's control path and asserts each decision is the same.
async fn replay_through_gateway(reqs: &[TraceRequest]) -> Agreed {
    let profile = Arc::new(synthetic::llama8b_like());
    let gpus = 4;
    let settings = SimSettings {
        record_control: true,
        ..SimSettings::new(gpus)
    };
    let sim = simulate(profile.clone(), &tiers(), reqs, "tiertp", &settings, &mut |_| {}).unwrap();
    let log = sim.control_log;
    let mut a = Agreed {
        switches: sim.switches,
        ..Agreed::default()
    };

    // The gateway's control path over one worker with the same GPUs.
    let clock = Arc::new(AtomicU64::new(0));
    let now = clock.clone();
    let recorder = Arc::new(Recorder::default());
    let workers: Vec<Arc<dyn WorkerClient>> = vec![recorder.clone()];
    let config = ControlConfig {
        planner: PlannerConfig::default(),
        window: std::time::Duration::from_secs_f64(settings.window_s),
        stats_timeout: std::time::Duration::from_secs(1),
    };
    let metrics = Arc::new(Metrics::new(vec!["chat".into(), "agent".into()]));
    let control = Control::new(tiers(), profile, workers, &[gpus], config, metrics)
        .unwrap()
        .with_clock(Arc::new(move || f64::from_bits(now.load(Ordering::SeqCst))));
    let set_time = |t: f64| clock.store(t.to_bits(), Ordering::SeqCst);

    for event in &log {
        match event {
            ControlEvent::Admit { time_s, request, route } => {
                set_time(*time_s);
                let r = &reqs[*request as usize];
                let got = control.place(u64::from(*request), r.tier, r.prompt_tokens, r.output_tokens, &[], true);
                match (route, got) {
                    (Route::To(key, class), Ok(p)) => {
                        assert_eq!((*key, *class), (p.key, p.class), "request {request} at {time_s}");
                        a.admitted += 1;
                    }
                    // Shed by both, for the same reason (the 503's message names it).
                    (Route::Reject(Rejection::Shed(reason)), Err(ApiError::Overloaded { message, .. }))
                        if message.contains(reason.name()) =>
                    {
                        a.shed += 1
                    }
                    (Route::Reject(Rejection::Shed(ShedReason::NoCapacity)), Err(ApiError::NoCapacity(_))) => a.shed += 1,
                    (want, got) => panic!("request {request} at {time_s}: simulator {want:?}, gateway {got:?}"),
                }
            }
            ControlEvent::FirstToken { time_s, request } => {
                set_time(*time_s);
                let got = control.first_token(u64::from(*request)).map(|p| p.handoff);
                assert_eq!(got, Some(Handoff::Stay), "request {request}");
            }
            ControlEvent::Handoff { time_s, request, route } => {
                set_time(*time_s);
                let got = control.first_token(u64::from(*request)).map(|p| p.handoff);
                let same = match (route, got) {
                    (None, Some(Handoff::Stay)) | (Some(Route::Wait), Some(Handoff::Wait)) => true,
                    (Some(Route::To(key, _)), Some(Handoff::Move(d))) => *key == d.key(),
                    _ => false,
                };
                assert!(same, "request {request} at {time_s}: simulator {route:?}, gateway {got:?}");
            }
            ControlEvent::Finish { time_s, request } => {
                set_time(*time_s);
                control.complete(u64::from(*request));
            }
            ControlEvent::Migrate { time_s, request, route } => {
                // One worker: its numbering is the cluster's.
                let Route::To(key, _) = route else {
                    panic!("request {request} at {time_s}: the simulator placed it anew ({route:?}), not by the plan")
                };
                let moves = recorder.moves.lock().unwrap();
                let sent = moves.iter().rev().find(|(id, _)| *id == u64::from(*request)).map(|(_, k)| *k);
                assert_eq!(sent, Some(*key), "request {request} at {time_s}: the gateway's move");
                a.moved += 1;
            }
            ControlEvent::Window { time_s, groups } => {
                set_time(*time_s);
                let before = control.plan_json()["plan_id"].as_u64();
                control.step().await;
                let plan = control.plan_json();
                a.windows += 1;
                match groups {
                    None => assert_eq!(plan["plan_id"].as_u64(), before, "window at {time_s}: the gateway changed its plan"),
                    Some(specs) => {
                        a.changes += 1;
                        let got: Vec<_> = plan["groups"]
                            .as_array()
                            .unwrap()
                            .iter()
                            .map(|g| {
                                (
                                    g["first_gpu"].as_u64().unwrap() as u32,
                                    g["tp"].as_u64().unwrap() as u32,
                                    g["role"].as_str().unwrap().to_string(),
                                    g["tier"].as_str().unwrap().to_string(),
                                    g["batch_cap"].as_u64().unwrap() as u32,
                                    g["token_cap"].as_u64().unwrap() as u32,
                                )
                            })
                            .collect();
                        let want: Vec<_> = specs
                            .iter()
                            .map(|s| {
                                let tier = tiers().tiers()[s.tier.unwrap()].name.clone();
                                (s.first_gpu, s.tp, s.role.name().to_string(), tier, s.batch_cap, s.token_cap)
                            })
                            .collect();
                        assert_eq!(got, want, "window at {time_s}");
                    }
                }
            }
        }
    }
    eprintln!("{a:?}");
    a
}
