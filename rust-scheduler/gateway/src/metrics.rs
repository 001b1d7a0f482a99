//! Prometheus metrics, hand-rolled: atomics on the request path, text
//! exposition on scrape.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

/// Histogram bucket upper bounds in seconds (TTFT, TPOT and plan switches).
const BUCKETS_S: [f64; 14] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];

#[derive(Default)]
pub struct Histogram {
    counts: [AtomicU64; BUCKETS_S.len()],
    count: AtomicU64,
    sum_us: AtomicU64,
}

impl Histogram {
    pub fn observe(&self, seconds: f64) {
        if let Some(i) = BUCKETS_S.iter().position(|&b| seconds <= b) {
            self.counts[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_us.fetch_add((seconds * 1e6) as u64, Ordering::Relaxed);
    }

    fn write(&self, out: &mut String, name: &str, labels: &str) {
        let mut cumulative = 0;
        let sep = if labels.is_empty() { "" } else { "," };
        for (b, c) in BUCKETS_S.iter().zip(&self.counts) {
            cumulative += c.load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{b}\"}} {cumulative}");
        }
        let count = self.count.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {count}");
        let _ = writeln!(out, "{name}_sum{{{labels}}} {}", self.sum_us.load(Ordering::Relaxed) as f64 / 1e6);
        let _ = writeln!(out, "{name}_count{{{labels}}} {count}");
    }
}

/// Picks one counter of a tier.
type Counter = fn(&TierMetrics) -> &AtomicU64;

#[derive(Default)]
pub struct TierMetrics {
    pub arrivals: AtomicU64,
    pub completions: AtomicU64,
    pub errors: AtomicU64,
    /// Requests shed by the control loop (over the tier's SLO capacity).
    pub shed: AtomicU64,
    /// Completions that met the tier's TTFT and TPOT (all, for background).
    pub goodput: AtomicU64,
    pub ttft: Histogram,
    pub tpot: Histogram,
}

pub struct Metrics {
    pub tier_names: Vec<String>,
    pub tiers: Vec<TierMetrics>,
    pub plan_changes: AtomicU64,
    pub switch: Histogram,
    pub redispatches: AtomicU64,
}

impl Metrics {
    pub fn new(tier_names: Vec<String>) -> Self {
        Self {
            tiers: tier_names.iter().map(|_| TierMetrics::default()).collect(),
            tier_names,
            plan_changes: AtomicU64::new(0),
            switch: Histogram::default(),
            redispatches: AtomicU64::new(0),
        }
    }

    /// The exposition text; `queue_depth` per tier, `tp_per_gpu` and
    /// `gpu_up` come from the caller's live state.
    pub fn render(&self, queue_depth: &[u32], tp_per_gpu: &[u32], gpu_up: &[bool]) -> String {
        let mut out = String::with_capacity(8192);
        let counters: [(&str, &str, Counter); 5] = [
            ("tiertp_arrivals_total", "Requests received per tier.", |m| &m.arrivals),
            ("tiertp_completions_total", "Requests completed per tier.", |m| &m.completions),
            ("tiertp_errors_total", "Requests failed per tier.", |m| &m.errors),
            (
                "tiertp_shed_total",
                "Requests shed per tier: over its SLO capacity (503 with Retry-After).",
                |m| &m.shed,
            ),
            ("tiertp_goodput_total", "Completions within the tier's SLOs.", |m| &m.goodput),
        ];
        for (name, help, get) in counters {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            for (t, m) in self.tier_names.iter().zip(&self.tiers) {
                let _ = writeln!(out, "{name}{{tier=\"{t}\"}} {}", get(m).load(Ordering::Relaxed));
            }
        }
        for (name, help, get) in [
            (
                "tiertp_ttft_seconds",
                "Time to first token.",
                (|m| &m.ttft) as fn(&TierMetrics) -> &Histogram,
            ),
            ("tiertp_tpot_seconds", "Time per output token after the first.", |m| &m.tpot),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
            for (t, m) in self.tier_names.iter().zip(&self.tiers) {
                get(m).write(&mut out, name, &format!("tier=\"{t}\""));
            }
        }
        let _ = writeln!(
            out,
            "# HELP tiertp_queue_depth Requests of the tier in flight at the gateway.\n# TYPE tiertp_queue_depth gauge"
        );
        for (t, d) in self.tier_names.iter().zip(queue_depth) {
            let _ = writeln!(out, "tiertp_queue_depth{{tier=\"{t}\"}} {d}");
        }
        let _ = writeln!(
            out,
            "# HELP tiertp_tp_level TP size of the group each GPU belongs to.\n# TYPE tiertp_tp_level gauge"
        );
        for (gpu, tp) in tp_per_gpu.iter().enumerate() {
            let _ = writeln!(out, "tiertp_tp_level{{gpu=\"{gpu}\"}} {tp}");
        }
        let _ = writeln!(
            out,
            "# HELP tiertp_gpu_up Whether the GPU takes requests (worker connected, device ready).\n# TYPE tiertp_gpu_up gauge"
        );
        for (gpu, up) in gpu_up.iter().enumerate() {
            let _ = writeln!(out, "tiertp_gpu_up{{gpu=\"{gpu}\"}} {}", u8::from(*up));
        }
        let _ = writeln!(
            out,
            "# HELP tiertp_plan_changes_total Plans committed and sent to workers.\n# TYPE tiertp_plan_changes_total counter\ntiertp_plan_changes_total {}",
            self.plan_changes.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP tiertp_redispatches_total Requests sent to another worker after a worker failure.\n# TYPE tiertp_redispatches_total counter\ntiertp_redispatches_total {}",
            self.redispatches.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP tiertp_switch_seconds Plan switch durations reported by workers.\n# TYPE tiertp_switch_seconds histogram"
        );
        self.switch.write(&mut out, "tiertp_switch_seconds", "");
        out
    }
}
