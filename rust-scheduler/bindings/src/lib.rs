//! `tiertp._scheduler`: a thin PyO3 layer over the scheduler core. Every
//! policy lives in `tiertp-scheduler`; this crate only converts types and
//! maps each core error family to one Python exception (all ValueErrors).

use pyo3::prelude::*;

mod batch;
mod convert;
mod dispatch;
mod errors;
mod gateway;
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
    m.add_function(wrap_pyfunction!(planner::bench_scheduler, m)?)?;
    m.add_function(wrap_pyfunction!(sim::simulate, m)?)?;
    m.add_function(wrap_pyfunction!(gateway::bench_gateway, m)?)?;
    m.add_class::<serve::GatewayServer>()?;
    m.add("SIM_POLICIES", tiertp_sim::POLICIES.map(|p| p.0).to_vec())?;
    m.add("FAIR_MIN_REQUEST_SHARE", tiertp_scheduler::planner::FAIR_MIN_SHARE)?;
    m.add("FAIR_MIN_GOODPUT_FRACTION", tiertp_scheduler::planner::FAIR_MIN_GOODPUT_FRACTION)?;
    m.add("ROLES", tiertp_scheduler::plan::Role::ALL.map(|r| r.name()).to_vec())?;
    m.add(
        "DISPATCH_CLASSES",
        tiertp_scheduler::dispatcher::DispatchClass::ALL.map(|c| c.name()).to_vec(),
    )?;
    Ok(())
}
