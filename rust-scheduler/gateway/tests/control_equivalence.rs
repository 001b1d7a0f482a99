//! One policy, two drivers: a simulated run of `tiertp` is replayed through
//! the gateway's control path (mock workers, a virtual clock) event by
//! event — arrivals, first tokens, completions, control windows — and the
//! gateway must decide exactly what the simulator decided: the same
//! admission (group and class, or shed) for every request, the same hand-off
//! decisions, and the same plan, with the same caps, at every window.

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

#[tokio::test(flavor = "current_thread")]
async fn the_gateway_decides_what_the_simulator_decided() {
    let profile = Arc::new(synthetic::llama8b_like());
    let reqs = trace();
    let gpus = 4;
    let settings = SimSettings {
        record_control: true,
        ..SimSettings::new(gpus)
    };
    let sim = simulate(profile.clone(), &tiers(), &reqs, "tiertp", &settings, &mut |_| {}).unwrap();
    let log = sim.control_log;
    assert!(
        !log.iter().any(|e| matches!(e, ControlEvent::Migrate { .. })),
        "the scenario must not move requests between groups (the agent does that in production)"
    );

    // The gateway's control path over one worker with the same GPUs.
    let clock = Arc::new(AtomicU64::new(0));
    let now = clock.clone();
    let workers: Vec<Arc<dyn WorkerClient>> = vec![Arc::new(Recorder::default())];
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

    let (mut admitted, mut shed, mut windows, mut changes) = (0, 0, 0, 0);
    for event in &log {
        match event {
            ControlEvent::Admit { time_s, request, route } => {
                set_time(*time_s);
                let r = &reqs[*request as usize];
                let got = control.place(u64::from(*request), r.tier, r.prompt_tokens, r.output_tokens, &[], true);
                match (route, got) {
                    (Route::To(key, class), Ok(p)) => {
                        assert_eq!((*key, *class), (p.key, p.class), "request {request} at {time_s}");
                        admitted += 1;
                    }
                    // Shed by both, for the same reason (the 503's message names it).
                    (Route::Reject(Rejection::Shed(reason)), Err(ApiError::Overloaded { message, .. }))
                        if message.contains(reason.name()) =>
                    {
                        shed += 1
                    }
                    (Route::Reject(Rejection::Shed(ShedReason::NoCapacity)), Err(ApiError::NoCapacity(_))) => shed += 1,
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
            ControlEvent::Migrate { .. } => unreachable!(),
            ControlEvent::Window { time_s, groups } => {
                set_time(*time_s);
                let before = control.plan_json()["plan_id"].as_u64();
                control.step().await;
                let plan = control.plan_json();
                windows += 1;
                match groups {
                    None => assert_eq!(plan["plan_id"].as_u64(), before, "window at {time_s}: the gateway changed its plan"),
                    Some(specs) => {
                        changes += 1;
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
    eprintln!("admitted {admitted}, shed {shed}, windows {windows}, plan changes {changes}");
    // The scenario exercised every kind of decision.
    assert!(admitted > 100 && shed > 10, "admitted {admitted}, shed {shed}");
    assert!(windows > 30 && changes >= 1, "windows {windows}, plan changes {changes}");
}
