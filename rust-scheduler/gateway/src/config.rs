//! The gateway's configuration: typed, validated once at startup, each
//! default written once (in `GatewayConfig::new`). A later `tiertp serve`
//! builds one of these and calls `server::run_gateway`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use rustc_hash::FxHashMap;
use serde::Deserialize;
use thiserror::Error;
use tiertp_scheduler::planner::PlannerConfig;
use tiertp_scheduler::tiers::TierSet;

use crate::tokenize::TokenizerError;
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

/// Optional per-tier admission limits (gateway config, not the tier file):
/// ```toml
/// [limits.chat]
/// max_concurrent = 64
/// max_rps = 100.0
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TierLimits {
    /// Requests of the tier in flight at once.
    pub max_concurrent: Option<u32>,
    /// Requests per second admitted (token bucket, burst = one second's worth).
    pub max_rps: Option<f64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitsFile {
    #[serde(default)]
    limits: FxHashMap<String, TierLimits>,
}

/// Parses `[limits.TIER]` tables; tier names are checked against the tiers.
pub fn parse_limits(text: &str, tiers: &TierSet) -> Result<FxHashMap<String, TierLimits>, GatewayError> {
    let f: LimitsFile = toml::from_str(text).map_err(|e| GatewayError::Config(e.to_string()))?;
    for (name, l) in &f.limits {
        tiers
            .id_of(name)
            .map_err(|e| GatewayError::Config(format!("[limits.{name}]: {e}")))?;
        if l.max_concurrent == Some(0) {
            return Err(GatewayError::Config(format!("[limits.{name}] max_concurrent = 0: must be >= 1")));
        }
        if let Some(r) = l.max_rps {
            if !(r.is_finite() && r > 0.0) {
                return Err(GatewayError::Config(format!(
                    "[limits.{name}] max_rps = {r}: must be a finite number > 0"
                )));
            }
        }
    }
    Ok(f.limits)
}

#[derive(Debug, Clone)]
pub struct GatewayConfig {
    pub bind: SocketAddr,
    /// The model name clients must ask for (`/v1/models` lists it).
    pub model: String,
    pub tokenizer: TokenizerSource,
    pub tiers: TierSet,
    pub limits: FxHashMap<String, TierLimits>,
    /// Profile JSON for the planner; `None` uses the core's synthetic one.
    pub profile: Option<PathBuf>,
    pub workers: Vec<WorkerSpec>,
    pub planner: PlannerConfig,
    /// Control window: the planner runs this often.
    pub window: Duration,
    /// Arrival rate horizon and memory of the observer (see `ArrivalObserver`).
    pub horizon: Duration,
    pub memory: Duration,
    /// Longest wait for a worker's next event before the request fails (504).
    pub worker_timeout: Duration,
    pub connect_timeout: Duration,
    /// Workers tried per request when workers die under it.
    pub max_attempts: u32,
    /// `max_tokens` when the request gives none.
    pub default_max_tokens: u32,
}

impl GatewayConfig {
    pub fn new(model: &str, tokenizer: TokenizerSource, tiers: TierSet, workers: Vec<WorkerSpec>) -> Self {
        Self {
            bind: SocketAddr::from(([127, 0, 0, 1], 8000)),
            model: model.to_string(),
            tokenizer,
            tiers,
            limits: FxHashMap::default(),
            profile: None,
            workers,
            planner: PlannerConfig::default(),
            window: Duration::from_secs(5),
            horizon: Duration::from_secs(10),
            memory: Duration::from_secs(30),
            worker_timeout: Duration::from_secs(120),
            connect_timeout: Duration::from_secs(10),
            max_attempts: 3,
            default_max_tokens: 16,
        }
    }

    pub fn validate(&self) -> Result<(), GatewayError> {
        let bad = |m: String| Err(GatewayError::Config(m));
        if self.workers.is_empty() {
            return bad("no workers: give at least one worker endpoint".into());
        }
        if self.model.is_empty() {
            return bad("model name is empty".into());
        }
        if self.window.is_zero() || self.horizon.is_zero() {
            return bad("window and horizon must be > 0".into());
        }
        if self.max_attempts == 0 || self.default_max_tokens == 0 {
            return bad("max_attempts and default_max_tokens must be >= 1".into());
        }
        for name in self.limits.keys() {
            self.tiers.id_of(name).map_err(|e| GatewayError::Config(format!("limits: {e}")))?;
        }
        Ok(())
    }
}
