//! Placing a request: the core's admission and dispatch over the groups
//! that are up, and a shed turned into the client's error.

use std::sync::atomic::Ordering;
use std::time::Instant;

use tiertp_scheduler::control::{Admission, ShedReason};
use tiertp_scheduler::dispatcher::DispatchClass;
use tiertp_scheduler::plan::GroupKey;
use tiertp_scheduler::tiers::TierId;

use super::Control;
use crate::error::ApiError;

/// Where a request went.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Placement {
    pub worker: usize,
    /// The group in global numbering.
    pub key: GroupKey,
    /// The group in the worker's own device numbering, or `None` when the
    /// worker does not run the current plan (not yet acknowledged, or
    /// refused): the agent then routes by tier over its own assignment.
    pub group: Option<GroupKey>,
    pub class: DispatchClass,
}

impl Control {
    /// Seconds from now by which a request that arrived at `arrival` must
    /// start prefilling to meet its TTFT (the core's deadline); `None` for
    /// a tier without one.
    pub fn start_within_s(&self, tier: TierId, arrival: Instant) -> Option<f64> {
        // The core's deadline, counted from the arrival.
        let from_arrival = self.tiers.tiers()[tier].ttft_deadline(0.0);
        from_arrival
            .is_finite()
            .then(|| (from_arrival - arrival.elapsed().as_secs_f64()).max(0.0))
    }

    /// Places a request (the core's admission and dispatch), never on a
    /// group that is down or was already tried (`exclude`). `first` says it
    /// is a new arrival (recorded for the planner); later attempts follow a
    /// failure. A shed request gets 503: `overloaded` with Retry-After (its
    /// tier is at its SLO capacity: the server's limit, not the client's
    /// rate, so not 429) or `no_capacity` (no live group can take it).
    pub fn place(
        &self,
        id: u64,
        tier: TierId,
        prompt_tokens: u32,
        max_tokens: u32,
        exclude: &[GroupKey],
        first: bool,
    ) -> Result<Placement, ApiError> {
        let mut s = self.state.lock().unwrap();
        let mut down: Vec<GroupKey> = s
            .control
            .plan()
            .groups
            .iter()
            .map(|g| g.key())
            .filter(|&k| !self.group_usable(&s, k))
            .collect();
        down.extend_from_slice(exclude);
        let now = self.now_s();
        let admission = if first {
            s.control.admit(id, tier, prompt_tokens, max_tokens, now, &down)
        } else {
            s.control.readmit(id, tier, prompt_tokens, &down)
        };
        match admission.map_err(|e| ApiError::Internal(e.to_string()))? {
            Admission::Admitted(d) => {
                let key = d.key();
                s.holders.placed(id, key, tier);
                let w = self.nodes.worker_of(key.0);
                let runs_plan = s.workers[w].applied == Some(s.control.plan_id());
                Ok(Placement {
                    worker: w,
                    key,
                    group: runs_plan.then(|| self.nodes.local(w, key)),
                    class: d.class,
                })
            }
            Admission::Shed { reason, retry_after_s } => {
                self.metrics.tiers[tier].shed.fetch_add(1, Ordering::Relaxed);
                let all_down = s.control.plan().groups.iter().all(|g| down.contains(&g.key()));
                Err(self.shed_error(tier, reason, retry_after_s, s.control.planner_note(), all_down))
            }
        }
    }

    /// The client's error for an admission shed.
    fn shed_error(&self, tier: TierId, reason: ShedReason, retry_after_s: f64, planner_note: Option<&str>, all_down: bool) -> ApiError {
        let retry = retry_after_s.ceil().max(1.0) as u64;
        match (reason, planner_note) {
            // No GPU to plan over, or none up: not a matter of load.
            (ShedReason::NoCapacity, Some(note)) => ApiError::NoCapacity(note.to_string()),
            (ShedReason::NoCapacity, None) if all_down => ApiError::NoCapacity("no live GPU can take the request".into()),
            (ShedReason::PromptTooLong, _) => ApiError::Overloaded {
                message: format!(
                    "tier {:?}: the current plan has no group that can prefill a prompt this long within the tier's TTFT \
                     ({}); retry after {retry} s, or shorten the prompt",
                    self.tiers.tiers()[tier].name,
                    reason.name()
                ),
                retry_after_s: retry,
            },
            _ => ApiError::Overloaded {
                message: format!(
                    "tier {:?} is at its SLO capacity ({}); retry after {retry} s",
                    self.tiers.tiers()[tier].name,
                    reason.name()
                ),
                retry_after_s: retry,
            },
        }
    }
}
