"""Running pinned SGLang for tiertp: CPU compatibility (sglang_compat), the
embedded models (models), engine start-up (launch) and process isolation for
anything that starts engines (isolated)."""
