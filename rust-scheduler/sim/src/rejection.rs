//! Why the simulator counted a request as rejected: the report gives the
//! count per reason next to the goodput, as the live replay gives the
//! failures by reason.

use tiertp_scheduler::control::ShedReason;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejection {
    /// The control loop shed it, for the reason the gateway's 503 names.
    Shed(ShedReason),
    /// The control loop refused it with an error (a request it does not know).
    ControlError,
    /// A baseline had no group to send it to.
    NoGroup,
    /// It waited in a queue past its TTFT deadline (the SLO-aware batch rule).
    DeadlinePassed,
    /// Its KV does not fit the group it was sent to.
    KvTooLarge,
    /// Still unfinished when the run's drain limit ran out.
    Unfinished,
}

impl Rejection {
    pub fn name(self) -> &'static str {
        match self {
            Rejection::Shed(reason) => reason.name(),
            Rejection::ControlError => "control_error",
            Rejection::NoGroup => "no_group",
            Rejection::DeadlinePassed => "deadline_passed",
            Rejection::KvTooLarge => "kv_too_large",
            Rejection::Unfinished => "unfinished",
        }
    }
}
