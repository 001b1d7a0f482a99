//! The axum app (thin handlers) and `run_gateway`, which connects the
//! workers, starts the control loop and serves until shut down.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use tiertp_scheduler::profile::{synthetic, Profile};
use tiertp_scheduler::topology::Cluster;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::app::{App, RequestBody};
use crate::config::{GatewayConfig, GatewayError, TokenizerSource};
use crate::control::{Control, ControlConfig};
use crate::metrics::Metrics;
use crate::openai::Endpoint;
use crate::stream;
use crate::tokenize::TextCodec;
use crate::worker::zmq::ZmqWorker;
use crate::worker::WorkerClient;

pub fn router(app: Arc<App>) -> Router {
    let body_limit = DefaultBodyLimit::max(app.max_body_bytes());
    Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/models", get(models))
        .route("/v1/plan", get(plan))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .layer(body_limit)
        .with_state(app)
}

async fn completions(State(app): State<Arc<App>>, headers: HeaderMap, body: RequestBody) -> Response {
    generate(&app, &headers, body, Endpoint::Completions).await
}

async fn chat_completions(State(app): State<Arc<App>>, headers: HeaderMap, body: RequestBody) -> Response {
    generate(&app, &headers, body, Endpoint::Chat).await
}

async fn generate(app: &App, headers: &HeaderMap, body: RequestBody, endpoint: Endpoint) -> Response {
    let answer = match app.start(headers, body, endpoint) {
        Ok((run, reply)) => stream::respond(run, reply).await,
        Err(e) => Err(e),
    };
    answer.unwrap_or_else(IntoResponse::into_response)
}

async fn models(State(app): State<Arc<App>>) -> Json<serde_json::Value> {
    Json(app.models_json())
}

async fn plan(State(app): State<Arc<App>>) -> Json<serde_json::Value> {
    Json(app.plan_json())
}

async fn health(State(app): State<Arc<App>>) -> Response {
    let h = app.health();
    let status = if h.is_ok() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(h.json())).into_response()
}

async fn metrics(State(app): State<Arc<App>>) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], app.metrics_text()).into_response()
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
/// The workers are dialled together, each for up to `connect_timeout`; one
/// not up by then joins when it comes up (`ZmqWorker::connect`).
pub async fn run_gateway(config: GatewayConfig) -> Result<GatewayHandle, GatewayError> {
    config.validate()?;
    let connects = config
        .workers
        .iter()
        .map(|w| ZmqWorker::connect(&w.endpoint, config.connect_timeout));
    let mut workers: Vec<Arc<dyn WorkerClient>> = Vec::with_capacity(config.workers.len());
    for w in futures_util::future::join_all(connects).await {
        workers.push(Arc::new(w?));
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
    let app = Arc::new(App::new(&config, codec, control.clone()));
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
