//! One Python exception per core error family; all are ValueErrors so
//! callers can catch bad input generically.

use pyo3::create_exception;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

create_exception!(_scheduler, ProfileError, PyValueError, "A profile file or query is invalid.");
create_exception!(_scheduler, TierConfigError, PyValueError, "A tier configuration is invalid.");
create_exception!(
    _scheduler,
    PlanError,
    PyValueError,
    "Planner input (stats, cluster, config) is invalid."
);
create_exception!(_scheduler, DispatchError, PyValueError, "A dispatch call was refused.");

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("ProfileError", py.get_type::<ProfileError>())?;
    m.add("TierConfigError", py.get_type::<TierConfigError>())?;
    m.add("PlanError", py.get_type::<PlanError>())?;
    m.add("DispatchError", py.get_type::<DispatchError>())?;
    Ok(())
}

pub fn profile_err(e: impl ToString) -> PyErr {
    ProfileError::new_err(e.to_string())
}

pub fn tier_err(e: impl ToString) -> PyErr {
    TierConfigError::new_err(e.to_string())
}

pub fn plan_err(e: impl ToString) -> PyErr {
    PlanError::new_err(e.to_string())
}

pub fn dispatch_err(e: impl ToString) -> PyErr {
    DispatchError::new_err(e.to_string())
}
