//! What the HTTP handlers share (`App`) and do: from a request body to a
//! running request (tier, parse, tokenize, admission, placement), and the
//! bodies of the read-only endpoints. The handlers in `server.rs` only
//! call these.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::HeaderMap;
use serde_json::Value;

use crate::admission::Admission;
use crate::config::GatewayConfig;
use crate::control::{Control, Health};
use crate::error::ApiError;
use crate::generate::{Running, Start};
use crate::openai::{self, Endpoint, GenRequest, ModelList, Prompt};
use crate::openapi;
use crate::protocol::Sampling;
use crate::sampling::SamplingDefaults;
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
    max_body_bytes: usize,
    sampling: SamplingDefaults,
}

fn now_unix() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// A request body as the handlers get it: one the extractor could not read
/// comes as its rejection, so that it is answered in the API's error shape,
/// as every other error.
pub type RequestBody = Result<Bytes, BytesRejection>;

/// The request field that holds the prompt.
fn prompt_param(endpoint: Endpoint) -> &'static str {
    match endpoint {
        Endpoint::Chat => "messages",
        Endpoint::Completions => "prompt",
    }
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
            max_body_bytes: config.max_body_bytes,
            sampling: config.sampling,
        }
    }

    /// The largest request body the router reads.
    pub fn max_body_bytes(&self) -> usize {
        self.max_body_bytes
    }

    /// A generation request, admitted and placed: the running request and
    /// how to answer it.
    pub fn start(&self, headers: &HeaderMap, body: RequestBody, endpoint: Endpoint) -> Result<(Running, Reply), ApiError> {
        let arrival = Instant::now();
        let tier = self.admission.tier_of(headers)?;
        let body = body.map_err(|e| ApiError::unread_body(&e, self.max_body_bytes))?;
        let req = openai::parse(&body, endpoint, &self.sampling)?;
        if req.model != self.model {
            return Err(ApiError::ModelNotFound(req.model));
        }
        let input_ids = self.tokenize(&req.prompt, endpoint)?;
        let max_tokens = self.max_tokens(&req, input_ids.len(), endpoint)?;
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

    /// The request's `max_tokens`, checked as vLLM does against the model's
    /// context length when the agents report it: the prompt and the
    /// completion must fit (else 400 here, not a worker's rejection later).
    /// Without `max_tokens`, the default, cut to what fits.
    fn max_tokens(&self, req: &GenRequest, prompt: usize, endpoint: Endpoint) -> Result<u32, ApiError> {
        let asked = req.max_tokens;
        let Some(max_model_len) = self.control.max_model_len() else {
            return Ok(asked.unwrap_or(self.default_max_tokens));
        };
        let prompt = u32::try_from(prompt).unwrap_or(u32::MAX);
        let too_long = |completion: Option<u32>, param: &'static str| ApiError::ContextLength {
            max_model_len,
            prompt,
            completion,
            param,
        };
        match asked {
            Some(n) if u64::from(prompt) + u64::from(n) > u64::from(max_model_len) => Err(too_long(Some(n), req.max_tokens_param)),
            Some(n) => Ok(n),
            None if prompt >= max_model_len => Err(too_long(None, prompt_param(endpoint))),
            None => Ok(self.default_max_tokens.min(max_model_len - prompt)),
        }
    }

    fn tokenize(&self, prompt: &Prompt, endpoint: Endpoint) -> Result<Vec<u32>, ApiError> {
        let ids = match prompt {
            Prompt::Text(t) => self.codec.encode(t, true),
            Prompt::Ids(ids) => Ok(ids.clone()),
            Prompt::Chat(msgs) => self.codec.apply_chat_template(msgs).and_then(|p| self.codec.encode(&p, false)),
        }
        .map_err(|e| ApiError::bad_param(prompt_param(endpoint), e.to_string()))?;
        if ids.is_empty() {
            return Err(ApiError::bad_param("prompt", "the prompt is empty after tokenization"));
        }
        Ok(ids)
    }

    /// `/v1/models`: the one model served.
    pub fn models(&self) -> ModelList<'_> {
        ModelList::of(&self.model)
    }

    /// `/openapi.json`, for what this gateway serves now.
    pub fn openapi(&self) -> utoipa::openapi::OpenApi {
        let facts = openapi::Facts {
            model: &self.model,
            tiers: self.control.tiers().tiers().iter().map(|t| t.name.as_str()).collect(),
            max_model_len: self.control.max_model_len(),
            empty_prompt_has_no_tokens: self.codec.encode("", true).map_or(true, |ids| ids.is_empty()),
        };
        openapi::document(&facts)
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
