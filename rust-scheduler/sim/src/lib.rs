//! Trace-replay cluster simulator (DESIGN.md §5).
//!
//! A discrete-event simulation of a GPU cluster serving a trace: GPU
//! iteration times come from a TP profile, TP switches cost a parameter
//! (the measured switching mechanism), prefill→decode KV hand-off and
//! migrations cost bytes / bandwidth, and queues, batch caps and KV capacity
//! are modelled. Every policy decision is made by production code: tiertp
//! runs the real `Planner`, `Dispatcher` and `BatchPolicy`; baselines are
//! policies over the same engine model.

pub mod engine;
pub mod policy;
pub mod rejection;
pub mod request;
pub mod result;
pub mod settings;
pub mod simulator;

pub use policy::POLICIES;
pub use result::{ControlEvent, SimResult};
pub use settings::SimSettings;
pub use simulator::{simulate, SimError, SimProfiles};
