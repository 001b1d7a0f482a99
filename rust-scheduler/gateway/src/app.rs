//! What the HTTP handlers share (`App`) and do: from a request body to a
//! running request (tier, parse, tokenize, admission, placement), and the
//! bodies of the read-only endpoints. The handlers in `server.rs` only
//! call these.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::http::HeaderMap;
use serde_json::{json, Value};

use crate::admission::Admission;
use crate::config::GatewayConfig;
use crate::control::{Control, Health};
use crate::error::ApiError;
use crate::generate::{Running, Start};
use crate::openai::{self, Endpoint, Prompt};
use crate::protocol::Sampling;
use crate::stream::Reply;
use crate::tokenize::TextCodec;

pub struct App {
    model: String,
    codec: Arc<TextCodec>,
    admission: Admission,
    control: Arc<Control>,
    max_attempts: u32,
    worker_timeout: Duration,
    default_max_tokens: u32,
}

fn now_unix() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

impl App {
    pub fn new(config: &GatewayConfig, codec: Arc<TextCodec>, control: Arc<Control>) -> Self {
        Self {
            model: config.model.clone(),
            codec,
            admission: Admission::new(&config.tiers),
            control,
            max_attempts: config.max_attempts,
            worker_timeout: config.worker_timeout,
            default_max_tokens: config.default_max_tokens,
        }
    }

    /// A generation request, admitted and placed: the running request and
    /// how to answer it.
    pub fn start(&self, headers: &HeaderMap, body: &[u8], endpoint: Endpoint) -> Result<(Running, Reply), ApiError> {
        let arrival = Instant::now();
        let tier = self.admission.tier_of(headers)?;
        let req = openai::parse(body, endpoint)?;
        if req.model != self.model {
            return Err(ApiError::ModelNotFound(req.model));
        }
        let input_ids = self.tokenize(&req.prompt, endpoint)?;
        let max_tokens = req.max_tokens.unwrap_or(self.default_max_tokens);
        self.control.metrics.tiers[tier].arrivals.fetch_add(1, Ordering::Relaxed);
        let permit = self.admission.admit(tier)?;
        let sampling = Sampling {
            max_tokens,
            temperature: req.temperature,
            top_p: req.top_p,
            seed: req.seed,
            stop_token_ids: self.codec.stop_token_ids.clone(),
        };
        let start = Start {
            tier,
            input_ids,
            sampling,
            stop: req.stop,
            permit,
            arrival,
        };
        let run = Running::start(
            self.control.clone(),
            self.codec.clone(),
            start,
            self.max_attempts,
            self.worker_timeout,
        )?;
        let prefix = if endpoint == Endpoint::Chat { "chatcmpl-" } else { "cmpl-" };
        let reply = Reply {
            endpoint,
            id: format!("{prefix}{:x}{:x}", now_unix(), run.id()),
            created: now_unix(),
            model: self.model.clone(),
            stream: req.stream,
            include_usage: req.include_usage,
        };
        Ok((run, reply))
    }

    fn tokenize(&self, prompt: &Prompt, endpoint: Endpoint) -> Result<Vec<u32>, ApiError> {
        let ids = match prompt {
            Prompt::Text(t) => self.codec.encode(t, true),
            Prompt::Ids(ids) => Ok(ids.clone()),
            Prompt::Chat(msgs) => self.codec.apply_chat_template(msgs).and_then(|p| self.codec.encode(&p, false)),
        }
        .map_err(|e| ApiError::bad_param(if endpoint == Endpoint::Chat { "messages" } else { "prompt" }, e.to_string()))?;
        if ids.is_empty() {
            return Err(ApiError::bad_param("prompt", "the prompt is empty after tokenization"));
        }
        Ok(ids)
    }

    /// `/v1/models`: the one model served.
    pub fn models_json(&self) -> Value {
        json!({"object": "list", "data": [{"id": self.model, "object": "model", "created": 0, "owned_by": "tiertp"}]})
    }

    /// `/v1/plan`.
    pub fn plan_json(&self) -> Value {
        self.control.plan_json()
    }

    /// `/health`.
    pub fn health(&self) -> Health {
        self.control.health()
    }

    /// `/metrics`, in Prometheus' text format.
    pub fn metrics_text(&self) -> String {
        let depth: Vec<u32> = (0..self.control.tiers().len()).map(|t| self.admission.in_flight(t)).collect();
        self.control
            .metrics
            .render(&depth, &self.control.tp_per_gpu(), &self.control.gpu_up())
    }
}
