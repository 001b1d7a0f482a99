//! Defaults shared by the control loop, the simulator, the gateway and,
//! through the bindings (`tiertp._scheduler.DEFAULT_*`), the Python side;
//! each is written once, here.

use crate::topology::MAX_GPUS_PER_NODE;

/// Control window in seconds: how often the loop re-plans (DESIGN.md §1).
pub const WINDOW_S: f64 = 1.0;

/// How long a tier's past arrival rate keeps counting as demand (seconds),
/// so a bursty tier that pauses for a few seconds keeps its GPUs.
pub const DEMAND_MEMORY_S: f64 = 30.0;

/// Prompt and output lengths the control loop assumes for a tier before it
/// has seen a request (a chat-like turn).
pub const PRIOR_PROMPT_TOKENS: f64 = 1024.0;
pub const PRIOR_OUTPUT_TOKENS: f64 = 128.0;

/// GPUs per node when a cluster is given as a GPU count alone: full nodes.
pub const GPUS_PER_NODE: u32 = MAX_GPUS_PER_NODE;
