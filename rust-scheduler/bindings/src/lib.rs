//! `tiertp._scheduler`: a thin PyO3 layer over the scheduler core. Every
//! policy lives in `tiertp-scheduler`; this crate only converts types and
//! maps each core error family to one Python exception (all ValueErrors).

use pyo3::prelude::*;
use pyo3::types::PyDict;

mod batch;
mod convert;
mod dispatch;
mod errors;
mod gateway;
mod hosted;
mod mock_gateway;
mod planner;
mod profile;
mod serve;
mod sim;
mod stats;
mod tiers;

#[pymodule]
fn _scheduler(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // Rust `log` records (e.g. profile clamp warnings) go to Python logging.
    let _ = pyo3_log::try_init();
    errors::register(m)?;
    m.add_class::<profile::Profile>()?;
    m.add_class::<tiers::TierSet>()?;
    m.add_class::<stats::TierStats>()?;
    m.add_class::<stats::ArrivalObserver>()?;
    m.add_class::<planner::Plan>()?;
    m.add_class::<planner::Planner>()?;
    m.add_class::<dispatch::Dispatcher>()?;
    m.add_class::<batch::BatchPolicy>()?;
    m.add_class::<dispatch::NodeGroup>()?;
    m.add_function(wrap_pyfunction!(dispatch::fallback_group, m)?)?;
    m.add_function(wrap_pyfunction!(planner::bench_scheduler, m)?)?;
    m.add_function(wrap_pyfunction!(sim::simulate, m)?)?;
    m.add_function(wrap_pyfunction!(gateway::bench_gateway, m)?)?;
    m.add_class::<serve::GatewayServer>()?;
    m.add_class::<mock_gateway::MockGateway>()?;
    // The one list of policies, and the settings each reads (what replay sweeps).
    let table = tiertp_sim::policy::POLICY_TABLE;
    m.add("SIM_POLICIES", table.map(|p| p.name).to_vec())?;
    let settings = PyDict::new(m.py());
    for p in table {
        settings.set_item(p.name, p.settings.to_vec())?;
    }
    m.add("SIM_POLICY_SETTINGS", settings)?;
    m.add("DEFAULT_WINDOW_S", tiertp_scheduler::defaults::WINDOW_S)?;
    m.add("DEFAULT_DEMAND_MEMORY_S", tiertp_scheduler::defaults::DEMAND_MEMORY_S)?;
    m.add("DEFAULT_GPUS_PER_NODE", tiertp_scheduler::defaults::GPUS_PER_NODE)?;
    m.add("PRIOR_PROMPT_TOKENS", tiertp_scheduler::defaults::PRIOR_PROMPT_TOKENS)?;
    m.add("PRIOR_OUTPUT_TOKENS", tiertp_scheduler::defaults::PRIOR_OUTPUT_TOKENS)?;
    m.add("MAX_GPUS_PER_NODE", tiertp_scheduler::topology::MAX_GPUS_PER_NODE)?;
    let bind = tiertp_gateway::config::DEFAULT_BIND;
    m.add("DEFAULT_GATEWAY_HOST", bind.ip().to_string())?;
    m.add("DEFAULT_GATEWAY_PORT", bind.port())?;
    m.add("SAMPLING_DEFAULTS", tiertp_gateway::sampling::SamplingSource::NAMES.to_vec())?;
    m.add("FAIR_MIN_REQUEST_SHARE", tiertp_scheduler::planner::FAIR_MIN_SHARE)?;
    m.add("FAIR_MIN_GOODPUT_FRACTION", tiertp_scheduler::planner::FAIR_MIN_GOODPUT_FRACTION)?;
    m.add("ROLES", tiertp_scheduler::plan::Role::ALL.map(|r| r.name()).to_vec())?;
    m.add(
        "DISPATCH_CLASSES",
        tiertp_scheduler::dispatcher::DispatchClass::ALL.map(|c| c.name()).to_vec(),
    )?;
    Ok(())
}
