//! The gateway's view of a node agent: one trait, one file per implementation
//! (`zmq`: the real protocol client; `mock`: an agent for tests and benches),
//! and `seal`: the sealed frames both speak.

pub mod mock;
pub mod seal;
pub mod zmq;

use async_trait::async_trait;
use thiserror::Error;
use tiertp_scheduler::dispatcher::DispatchClass;
use tiertp_scheduler::plan::GroupKey;
use tokio::sync::mpsc;

use crate::protocol::{DevicePlan, PlanApplied, PlanMove, Sampling, StatsReply};

#[derive(Debug, Clone, Error, PartialEq)]
pub enum WorkerError {
    #[error("worker {worker} is gone: {reason}")]
    Died { worker: String, reason: String },
    #[error("worker {worker} cannot be reached: {reason}")]
    Connect { worker: String, reason: String },
    #[error("worker {worker} rejected the request ({code}): {message}")]
    Rejected { worker: String, code: String, message: String },
    #[error("worker {worker} did not answer within {seconds} s")]
    Timeout { worker: String, seconds: f64 },
}

impl WorkerError {
    /// Whether the request may be sent to another worker: the worker failed,
    /// not the request.
    pub fn retriable(&self) -> bool {
        match self {
            WorkerError::Died { .. } | WorkerError::Connect { .. } => true,
            WorkerError::Rejected { code, .. } => code == crate::protocol::codes::WORKER_DIED || code == crate::protocol::codes::OVERLOADED,
            WorkerError::Timeout { .. } => false,
        }
    }
}

/// What a request gets back from its worker, in order; the last event is a
/// `Tokens` with `finished` or a `Failed`.
#[derive(Debug, Clone, PartialEq)]
pub enum TokenEvent {
    Tokens {
        tokens: Vec<u32>,
        finished: bool,
        finish_reason: Option<String>,
        prompt_tokens: Option<u32>,
    },
    Failed(WorkerError),
}

pub type TokenStream = mpsc::UnboundedReceiver<TokenEvent>;

/// One request as the worker sees it (token ids, not text).
#[derive(Debug, Clone)]
pub struct Submit {
    pub id: u64,
    pub tier: String,
    pub input_ids: Vec<u32>,
    pub sampling: Sampling,
    pub class: DispatchClass,
    /// The group to run on, in the agent's device numbering; `None`: the
    /// agent routes by tier.
    pub group: Option<GroupKey>,
    /// Seconds from now by which it must start prefilling (its TTFT
    /// deadline); `None`: no deadline.
    pub start_within_s: Option<f64>,
}

/// A node agent. `submit`, `cancel` and `hand_off` only enqueue (they never
/// wait on the network), so they can be called from `Drop` and on the
/// request path.
#[async_trait]
pub trait WorkerClient: Send + Sync {
    fn name(&self) -> &str;
    /// False once the connection is known to be lost.
    fn is_alive(&self) -> bool;
    /// Starts a request; its events arrive on the returned stream, which ends
    /// with exactly one terminal event (also when the worker dies).
    fn submit(&self, request: Submit) -> Result<TokenStream, WorkerError>;
    /// Stops a request; its stream gets no more events.
    fn cancel(&self, id: u64);
    /// Moves a prefilled request's KV to `group` (first device, TP size, in
    /// the agent's numbering); its stream goes on. Nothing is sent for a
    /// request no longer in flight here. A move the agent cannot make is
    /// logged, and the request keeps decoding where it is.
    fn hand_off(&self, id: u64, group: GroupKey);
    /// Applies the agent's share of a plan; `moves` says where its TP
    /// switches take the requests of the groups it stops.
    async fn apply_plan(&self, plan_id: u64, devices: Vec<DevicePlan>, moves: Vec<PlanMove>) -> Result<PlanApplied, WorkerError>;
    async fn stats(&self) -> Result<StatsReply, WorkerError>;
}
