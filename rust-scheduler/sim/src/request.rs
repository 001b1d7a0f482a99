//! Requests of a trace and their progress through the cluster.

use tiertp_scheduler::tiers::TierId;

use crate::rejection::Rejection;

/// One trace request, as replayed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TraceRequest {
    pub arrival_s: f64,
    pub tier: TierId,
    pub prompt_tokens: u32,
    pub output_tokens: u32,
}

/// Where a request is in its life; the simulator keeps one per request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Progress {
    pub prefilled: u32,
    pub generated: u32,
    pub first_token_s: f64,
    pub finish_s: f64,
    /// Set when it was rejected, with why.
    pub rejection: Option<Rejection>,
}

impl Default for Progress {
    fn default() -> Self {
        Self {
            prefilled: 0,
            generated: 0,
            first_token_s: f64::NAN,
            finish_s: f64::NAN,
            rejection: None,
        }
    }
}

impl Progress {
    pub fn done(&self) -> bool {
        self.rejection.is_some() || !self.finish_s.is_nan()
    }
}

/// KV tokens a request holds once admitted: its whole prompt and output are
/// reserved up front (conservative, so a batch never runs out mid-decode).
pub fn kv_reservation(r: &TraceRequest) -> u64 {
    u64::from(r.prompt_tokens) + u64::from(r.output_tokens)
}
