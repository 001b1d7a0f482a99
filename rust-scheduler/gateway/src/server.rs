//! The axum app (thin handlers) and `run_gateway`, which connects the
//! workers, starts the control loop and serves until shut down.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;
use tiertp_scheduler::profile::{synthetic, Profile};
use tiertp_scheduler::topology::Cluster;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::admission::Admission;
use crate::config::{GatewayConfig, GatewayError, TokenizerSource};
use crate::control::{Control, ControlConfig};
use crate::error::ApiError;
use crate::generate::{Running, Start};
use crate::metrics::Metrics;
use crate::openai::{self, Endpoint, Envelope, Prompt, Usage};
use crate::protocol::Sampling;
use crate::tokenize::TextCodec;
use crate::worker::zmq::ZmqWorker;
use crate::worker::WorkerClient;

pub struct App {
    model: String,
    codec: Arc<TextCodec>,
    admission: Admission,
    control: Arc<Control>,
    max_attempts: u32,
    worker_timeout: Duration,
    default_max_tokens: u32,
}

pub fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/models", get(models))
        .route("/v1/plan", get(plan))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .with_state(app)
}

async fn completions(State(app): State<Arc<App>>, headers: HeaderMap, body: Bytes) -> Response {
    generate(app, headers, body, Endpoint::Completions)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn chat_completions(State(app): State<Arc<App>>, headers: HeaderMap, body: Bytes) -> Response {
    generate(app, headers, body, Endpoint::Chat)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

fn now_unix() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

async fn generate(app: Arc<App>, headers: HeaderMap, body: Bytes, endpoint: Endpoint) -> Result<Response, ApiError> {
    let arrival = Instant::now();
    let tier = app.admission.tier_of(&headers)?;
    let req = openai::parse(&body, endpoint)?;
    if req.model != app.model {
        return Err(ApiError::ModelNotFound(req.model));
    }
    let input_ids = match &req.prompt {
        Prompt::Text(t) => app.codec.encode(t, true),
        Prompt::Ids(ids) => Ok(ids.clone()),
        Prompt::Chat(msgs) => app.codec.apply_chat_template(msgs).and_then(|p| app.codec.encode(&p, false)),
    }
    .map_err(|e| ApiError::bad_param(if endpoint == Endpoint::Chat { "messages" } else { "prompt" }, e.to_string()))?;
    if input_ids.is_empty() {
        return Err(ApiError::bad_param("prompt", "the prompt is empty after tokenization"));
    }
    let max_tokens = req.max_tokens.unwrap_or(app.default_max_tokens);
    app.control.metrics.tiers[tier].arrivals.fetch_add(1, Ordering::Relaxed);
    let permit = app.admission.admit(tier)?;
    let sampling = Sampling {
        max_tokens,
        temperature: req.temperature,
        top_p: req.top_p,
        seed: req.seed,
        stop_token_ids: app.codec.stop_token_ids.clone(),
    };
    let start = Start {
        tier,
        input_ids,
        sampling,
        stop: req.stop.clone(),
        permit,
        arrival,
    };
    let mut run = Running::start(app.control.clone(), app.codec.clone(), start, app.max_attempts, app.worker_timeout)?;
    let prefix = if endpoint == Endpoint::Chat { "chatcmpl-" } else { "cmpl-" };
    let id = format!("{prefix}{:x}{:x}", now_unix(), run.id());
    let created = now_unix();
    let model = app.model.clone();
    if !req.stream {
        let mut text = String::new();
        let finish = loop {
            let piece = run.next(false).await?;
            text.push_str(&piece.text);
            if let Some(f) = piece.finish {
                break f;
            }
        };
        let env = Envelope {
            endpoint,
            id: &id,
            created,
            model: &model,
        };
        let body = env.full(&text, finish.reason, Usage::new(run.prompt_tokens(), finish.completion_tokens));
        return Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response());
    }
    // Streaming: the stream owns `run`; a client that goes away drops it,
    // which cancels the request on its worker.
    struct S {
        run: Running,
        id: String,
        model: String,
        created: u64,
        endpoint: Endpoint,
        first: bool,
        include_usage: bool,
        tail: Vec<String>,
        over: bool,
    }
    let state = S {
        run,
        id,
        model,
        created,
        endpoint,
        first: true,
        include_usage: req.include_usage,
        tail: Vec::new(),
        over: false,
    };
    let stream = futures_util::stream::unfold(state, |mut s| async move {
        if let Some(data) = s.tail.pop() {
            return Some((Ok::<_, Infallible>(Event::default().data(data)), s));
        }
        if s.over {
            return None;
        }
        let env = Envelope {
            endpoint: s.endpoint,
            id: &s.id,
            created: s.created,
            model: &s.model,
        };
        let data = match s.run.next(true).await {
            Ok(piece) => {
                let chunk = env.chunk(&piece.text, s.first, piece.finish.as_ref().map(|f| f.reason));
                if let Some(f) = piece.finish {
                    s.over = true;
                    // Sent in reverse order by `pop`.
                    s.tail.push("[DONE]".into());
                    if s.include_usage {
                        s.tail.push(env.usage_chunk(Usage::new(s.run.prompt_tokens(), f.completion_tokens)));
                    }
                }
                chunk
            }
            Err(e) => {
                s.over = true;
                s.tail.push("[DONE]".into());
                e.body().to_string()
            }
        };
        s.first = false;
        Some((Ok(Event::default().data(data)), s))
    });
    Ok(Sse::new(stream).into_response())
}

async fn models(State(app): State<Arc<App>>) -> Json<serde_json::Value> {
    Json(json!({"object": "list", "data": [{"id": app.model, "object": "model", "created": 0, "owned_by": "tiertp"}]}))
}

async fn plan(State(app): State<Arc<App>>) -> Json<serde_json::Value> {
    Json(app.control.plan_json())
}

async fn health(State(app): State<Arc<App>>) -> Response {
    let alive = app.control.workers.iter().filter(|w| w.is_alive()).count();
    let up = app.control.gpu_up();
    let gpus_up = up.iter().filter(|&&u| u).count();
    let ok = alive > 0 && gpus_up > 0;
    let status = if ok { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    let body = json!({
        "status": if ok { "ok" } else { "no_capacity" },
        "workers_alive": alive,
        "workers": app.control.workers.len(),
        "gpus_up": gpus_up,
        "gpus": up.len(),
    });
    (status, Json(body)).into_response()
}

async fn metrics(State(app): State<Arc<App>>) -> Response {
    let depth: Vec<u32> = (0..app.control.tiers().len()).map(|t| app.admission.in_flight(t)).collect();
    let text = app.control.metrics.render(&depth, &app.control.tp_per_gpu(), &app.control.gpu_up());
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

/// A running gateway; dropping it (or `shutdown`) stops it.
pub struct GatewayHandle {
    pub addr: SocketAddr,
    pub control: Arc<Control>,
    stop: Option<oneshot::Sender<()>>,
    tasks: Vec<JoinHandle<()>>,
}

impl GatewayHandle {
    /// Stops accepting, lets in-flight requests finish, stops the planner.
    pub async fn shutdown(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(server) = self.tasks.pop() {
            let _ = server.await;
        }
    }
}

impl Drop for GatewayHandle {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Connects to the configured workers and serves (see `run_gateway_with`).
pub async fn run_gateway(config: GatewayConfig) -> Result<GatewayHandle, GatewayError> {
    config.validate()?;
    let mut workers: Vec<Arc<dyn WorkerClient>> = Vec::with_capacity(config.workers.len());
    for w in &config.workers {
        workers.push(Arc::new(ZmqWorker::connect(&w.endpoint, config.connect_timeout).await?));
    }
    run_gateway_with(config, workers).await
}

/// Serves with the given worker clients (one per `config.workers` entry).
pub async fn run_gateway_with(config: GatewayConfig, workers: Vec<Arc<dyn WorkerClient>>) -> Result<GatewayHandle, GatewayError> {
    config.validate()?;
    if workers.len() != config.workers.len() {
        return Err(GatewayError::Config(format!(
            "{} worker clients for {} workers",
            workers.len(),
            config.workers.len()
        )));
    }
    let codec = Arc::new(match &config.tokenizer {
        TokenizerSource::Dir(d) => TextCodec::from_dir(d)?,
        TokenizerSource::Tiny => TextCodec::tiny(),
    });
    let profile = match &config.profile {
        Some(p) => Profile::load(&p.display().to_string()).map_err(|e| GatewayError::Config(e.to_string()))?,
        None => synthetic::llama8b_like(),
    };
    let gpus: Vec<u32> = config.workers.iter().map(|w| w.gpus).collect();
    Cluster::new(gpus.clone()).map_err(|e| GatewayError::Config(format!("workers: {e}")))?;
    let metrics = Arc::new(Metrics::new(config.tiers.tiers().iter().map(|t| t.name.clone()).collect()));
    let control_config = ControlConfig {
        planner: config.planner.clone(),
        window: config.window,
        stats_timeout: config.stats_timeout,
    };
    let control = Arc::new(
        Control::new(config.tiers.clone(), Arc::new(profile), workers, &gpus, control_config, metrics).map_err(GatewayError::Planner)?,
    );
    // The first window now: health, and the initial plan to every worker.
    control.step().await;
    let app = Arc::new(App {
        model: config.model.clone(),
        codec,
        admission: Admission::new(&config.tiers),
        control: control.clone(),
        max_attempts: config.max_attempts,
        worker_timeout: config.worker_timeout,
        default_max_tokens: config.default_max_tokens,
    });
    let listener = tokio::net::TcpListener::bind(config.bind).await.map_err(|e| GatewayError::Bind {
        addr: config.bind.to_string(),
        message: e.to_string(),
    })?;
    let addr = listener.local_addr().map_err(|e| GatewayError::Bind {
        addr: config.bind.to_string(),
        message: e.to_string(),
    })?;
    let (stop, stopped) = oneshot::channel::<()>();
    let planner_task = tokio::spawn(control.clone().run_loop());
    let server = tokio::spawn(async move {
        let serve = axum::serve(listener, router(app)).with_graceful_shutdown(async move {
            let _ = stopped.await;
        });
        if let Err(e) = serve.await {
            log::error!("gateway server stopped: {e}");
        }
    });
    Ok(GatewayHandle {
        addr,
        control,
        stop: Some(stop),
        tasks: vec![planner_task, server],
    })
}
