//! The gateway's configuration: typed, validated once at startup, each
//! default written once (in `GatewayConfig::new`). `tiertp serve` builds one
//! (bindings: `GatewayServer`) and calls `server::run_gateway`. Tier limits
//! are part of the tiers (core `TierLimits`, from the tier file).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use thiserror::Error;
use tiertp_scheduler::defaults;
use tiertp_scheduler::planner::PlannerConfig;
use tiertp_scheduler::tiers::TierSet;

use crate::sampling::SamplingDefaults;
use crate::tokenize::TokenizerError;
use crate::worker::seal::ControlKey;
use crate::worker::WorkerError;

#[derive(Debug, Error)]
pub enum GatewayError {
    #[error("gateway config: {0}")]
    Config(String),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error(transparent)]
    Worker(#[from] WorkerError),
    #[error("planner: {0}")]
    Planner(String),
    #[error("cannot listen on {addr}: {message}")]
    Bind { addr: String, message: String },
}

/// Where the tokenizer comes from.
#[derive(Debug, Clone)]
pub enum TokenizerSource {
    /// A model directory (`tokenizer.json`, `tokenizer_config.json`, ...).
    Dir(PathBuf),
    /// The built-in tiny word-level tokenizer (tests, bench).
    Tiny,
}

/// One node agent and the number of GPUs (devices) it drives; agents are the
/// cluster's nodes, in order, and GPUs are numbered globally across them.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerSpec {
    pub endpoint: String,
    pub gpus: u32,
}

/// Where the gateway listens unless told otherwise.
pub const DEFAULT_BIND: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 8000);

/// The control windows the design allows (DESIGN.md §1).
pub const WINDOW_RANGE: (Duration, Duration) = (Duration::from_millis(250), Duration::from_secs(5));

#[derive(Debug, Clone)]
pub struct GatewayConfig {
    pub bind: SocketAddr,
    /// The model name clients must ask for (`/v1/models` lists it).
    pub model: String,
    pub tokenizer: TokenizerSource,
    /// `temperature` and `top_p` for requests that omit them (default:
    /// OpenAI's; `tiertp serve` loads the model's, `sampling.rs`).
    pub sampling: SamplingDefaults,
    /// Tiers, with their API keys and admission limits.
    pub tiers: TierSet,
    /// Profile JSON for the planner; `None` uses the core's synthetic one.
    pub profile: Option<PathBuf>,
    pub workers: Vec<WorkerSpec>,
    /// The agents' control-plane key (`tiertp keys`): every frame to and
    /// from them is sealed under it. Needed to dial agents (`run_gateway`);
    /// `None` until given. Printed as `<redacted>`.
    pub control_key: Option<ControlKey>,
    pub planner: PlannerConfig,
    /// Control window: the planner runs and the workers' health is polled
    /// this often (DESIGN.md §1: 0.25–5 s).
    pub window: Duration,
    /// A worker that does not answer a `stats` poll within this long counts
    /// as down (its GPUs leave the plan) until it answers again; also the
    /// longest wait for a `plan_applied` (unanswered: sent again next window).
    pub stats_timeout: Duration,
    /// Longest wait for a worker's next event before the request fails (504).
    pub worker_timeout: Duration,
    /// How long one attempt to reach an agent may take; at start, one not
    /// reached by then is dialled until it answers (its GPUs out of the plan
    /// meanwhile), not an error.
    pub connect_timeout: Duration,
    /// Workers tried per request when workers die under it.
    pub max_attempts: u32,
    /// `max_tokens` when the request gives none (cut to what fits in the
    /// model's context, when the agents report it).
    pub default_max_tokens: u32,
    /// The largest request body accepted; a larger one gets 413.
    pub max_body_bytes: usize,
}

impl GatewayConfig {
    pub fn new(model: &str, tokenizer: TokenizerSource, tiers: TierSet, workers: Vec<WorkerSpec>) -> Self {
        Self {
            bind: DEFAULT_BIND,
            model: model.to_string(),
            tokenizer,
            sampling: SamplingDefaults::OPENAI,
            tiers,
            profile: None,
            workers,
            control_key: None,
            planner: PlannerConfig::default(),
            window: Duration::from_secs_f64(defaults::WINDOW_S),
            stats_timeout: Duration::from_secs(5),
            worker_timeout: Duration::from_secs(120),
            connect_timeout: Duration::from_secs(10),
            max_attempts: 3,
            default_max_tokens: 16,
            // axum's own default, written here so the 413 can name it.
            max_body_bytes: 2 * 1024 * 1024,
        }
    }

    /// The key to dial the agents with; an error naming the option without one.
    pub fn control_key(&self) -> Result<&ControlKey, GatewayError> {
        self.control_key.as_ref().ok_or_else(|| {
            GatewayError::Config(
                "no control-plane key: agents hear only a gateway holding theirs (give the same key file as \
                 `tiertp worker --key-file`; `tiertp keys` makes one)"
                    .into(),
            )
        })
    }

    pub fn validate(&self) -> Result<(), GatewayError> {
        let bad = |m: String| Err(GatewayError::Config(m));
        if self.workers.is_empty() {
            return bad("no workers: give at least one worker endpoint".into());
        }
        for (i, w) in self.workers.iter().enumerate() {
            crate::worker::zmq::check_endpoint(&w.endpoint).map_err(GatewayError::Config)?;
            if self.workers[..i].iter().any(|o| o.endpoint == w.endpoint) {
                return bad(format!("worker {} is listed twice", w.endpoint));
            }
        }
        if self.model.is_empty() {
            return bad("model name is empty".into());
        }
        if !(WINDOW_RANGE.0..=WINDOW_RANGE.1).contains(&self.window) {
            return bad(format!(
                "control window {} s: must be from {} to {} s",
                self.window.as_secs_f64(),
                WINDOW_RANGE.0.as_secs_f64(),
                WINDOW_RANGE.1.as_secs_f64()
            ));
        }
        self.sampling.check().map_err(GatewayError::Config)?;
        if self.stats_timeout.is_zero() {
            return bad("stats_timeout must be > 0".into());
        }
        if self.max_attempts == 0 || self.default_max_tokens == 0 || self.max_body_bytes == 0 {
            return bad("max_attempts, default_max_tokens and max_body_bytes must be >= 1".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_workers(endpoints: &[&str]) -> GatewayConfig {
        let tiers = TierSet::from_toml("[[tier]]\nname = \"chat\"\nttft_ms = 500\ntpot_ms = 50\n", "t").unwrap();
        let workers = endpoints
            .iter()
            .map(|e| WorkerSpec {
                endpoint: e.to_string(),
                gpus: 1,
            })
            .collect();
        GatewayConfig::new("m", TokenizerSource::Tiny, tiers, workers)
    }

    #[test]
    fn worker_endpoints_are_tcp_and_listed_once() {
        assert!(with_workers(&["tcp://127.0.0.1:7100", "tcp://node-b:7100", "tcp://[::1]:7100"])
            .validate()
            .is_ok());
        for (endpoints, needle) in [
            (&["tcp://node-a"][..], "expected tcp://HOST:PORT"),
            (&["node-a:7100"][..], "expected tcp://HOST:PORT"),
            (&["ipc:///tmp/agent.sock"][..], "over TCP only"),
            (&["tcp://node-a:7100", "tcp://node-a:7100"][..], "tcp://node-a:7100 is listed twice"),
        ] {
            let e = with_workers(endpoints).validate().unwrap_err().to_string();
            assert!(e.contains(needle), "{endpoints:?}: {e}");
        }
    }

    #[test]
    fn the_control_key_is_needed_to_dial_and_never_printed() {
        let mut c = with_workers(&["tcp://127.0.0.1:7100"]);
        assert!(c.control_key().unwrap_err().to_string().contains("no control-plane key"));
        c.control_key = Some(ControlKey::from_bytes(&[0x5a; 32]).unwrap());
        assert!(c.control_key().is_ok());
        let shown = format!("{c:?}");
        assert!(shown.contains("ControlKey(<redacted>)") && !shown.contains("90, 90"), "{shown}");
    }
}
