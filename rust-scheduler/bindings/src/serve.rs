//! `GatewayServer`: the OpenAI gateway (`tiertp_gateway::server`) run from
//! Python (`tiertp serve`), on its own tokio runtime (`Hosted`).

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use pyo3::exceptions::{PyOSError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use tiertp_gateway::config::{GatewayConfig, GatewayError, TokenizerSource, WorkerSpec};
use tiertp_gateway::sampling::{SamplingDefaults, SamplingSource};
use tiertp_gateway::server::run_gateway;
use tiertp_gateway::worker::seal::ControlKey;
use tiertp_scheduler::tiers::TierSet;

use crate::errors::tier_err;
use crate::hosted::Hosted;

fn gateway_err(e: GatewayError) -> PyErr {
    match e {
        GatewayError::Bind { .. } => PyOSError::new_err(e.to_string()),
        GatewayError::Worker(_) => PyRuntimeError::new_err(e.to_string()),
        _ => PyValueError::new_err(e.to_string()),
    }
}

/// A running gateway. Starting connects to the worker agents (each waited
/// for up to `connect_timeout_s`; one not up by then joins the plan when it
/// comes up), every frame sealed under `control_key` (the agents' 32-byte
/// control-plane key, `tiertp keys`), and binds `host:port` (0: a free
/// port); `shutdown()` stops accepting, lets in-flight requests finish and
/// stops the runtime. Options left None take
/// the gateway's defaults (`GatewayConfig::new`). `profile_path` is the
/// planner's profile JSON (None: the synthetic one), `tp_levels` the TP
/// levels the planner may use (None: the planner's default; give the
/// levels the workers run), `window_s` the control window (None: the
/// gateway's default). `sampling_defaults` is where `temperature` and
/// `top_p` come from when a request omits them: "model" (None: the model
/// dir's `generation_config.json`, as SGLang and vLLM do; OpenAI's values
/// without one) or "openai" (1.0 and 1.0). Errors: TierConfigError (tiers
/// file), ValueError (config, e.g. a malformed or repeated worker endpoint;
/// profile, tokenizer, sampling defaults), OSError (bind).
#[pyclass(module = "tiertp._scheduler")]
pub struct GatewayServer {
    hosted: Hosted,
}

#[pymethods]
impl GatewayServer {
    #[new]
    #[pyo3(signature = (tiers_path, model, model_dir, workers, control_key, host = None, port = None, threads = 2, worker_timeout_s = None, connect_timeout_s = None, profile_path = None, tp_levels = None, window_s = None, sampling_defaults = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        tiers_path: String,
        model: String,
        model_dir: String,
        workers: Vec<(String, u32)>,
        control_key: &[u8],
        host: Option<String>,
        port: Option<u16>,
        threads: usize,
        worker_timeout_s: Option<f64>,
        connect_timeout_s: Option<f64>,
        profile_path: Option<String>,
        tp_levels: Option<Vec<u32>>,
        window_s: Option<f64>,
        sampling_defaults: Option<String>,
    ) -> PyResult<Self> {
        let source = match sampling_defaults {
            Some(name) => SamplingSource::parse(&name).map_err(|e| PyValueError::new_err(e.to_string()))?,
            None => SamplingSource::default(),
        };
        let model_dir = PathBuf::from(model_dir);
        let sampling = SamplingDefaults::load(source, &model_dir).map_err(|e| PyValueError::new_err(e.to_string()))?;
        let tiers = TierSet::load(&tiers_path).map_err(tier_err)?;
        for (name, v) in [
            ("worker_timeout_s", worker_timeout_s),
            ("connect_timeout_s", connect_timeout_s),
            ("window_s", window_s),
        ] {
            if let Some(v) = v.filter(|v| !(v.is_finite() && *v > 0.0)) {
                return Err(PyValueError::new_err(format!("{name} = {v}: must be a finite number > 0")));
            }
        }
        let specs = workers.into_iter().map(|(endpoint, gpus)| WorkerSpec { endpoint, gpus }).collect();
        let mut config = GatewayConfig::new(&model, TokenizerSource::Dir(model_dir), tiers, specs);
        config.control_key = Some(ControlKey::from_bytes(control_key).map_err(|e| PyValueError::new_err(e.to_string()))?);
        config.sampling = sampling;
        if let Some(host) = host {
            let ip: IpAddr = host
                .parse()
                .map_err(|_| PyValueError::new_err(format!("host {host:?} is not an IP address")))?;
            config.bind.set_ip(ip);
        }
        if let Some(port) = port {
            config.bind.set_port(port);
        }
        if let Some(t) = worker_timeout_s {
            config.worker_timeout = Duration::from_secs_f64(t);
        }
        if let Some(t) = connect_timeout_s {
            config.connect_timeout = Duration::from_secs_f64(t);
        }
        config.profile = profile_path.map(PathBuf::from);
        if let Some(levels) = tp_levels {
            config.planner.tp_levels = levels;
        }
        if let Some(w) = window_s {
            config.window = Duration::from_secs_f64(w);
        }
        let hosted = Hosted::start(py, threads, run_gateway(config), gateway_err)?;
        Ok(Self { hosted })
    }

    /// `host:port` the gateway listens on.
    #[getter]
    fn address(&self) -> String {
        self.hosted.address()
    }

    /// Whether the gateway is still serving (`shutdown` not called yet).
    #[getter]
    fn running(&self) -> bool {
        self.hosted.running()
    }

    /// Stops the gateway (idempotent); waits at most `timeout_s` for
    /// in-flight requests, then aborts them.
    #[pyo3(signature = (timeout_s = 10.0))]
    fn shutdown(&self, py: Python<'_>, timeout_s: f64) {
        self.hosted.shutdown(py, timeout_s);
    }
}
