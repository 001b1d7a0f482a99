//! The axum app (thin handlers) and `run_gateway`, which connects the
//! workers, starts the control loop and serves until shut down.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, State};
use axum::handler::Handler;
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{on, MethodFilter, MethodRouter};
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
use crate::openapi;
use crate::stream;
use crate::tokenize::TextCodec;
use crate::worker::zmq::ZmqWorker;
use crate::worker::WorkerClient;

/// One route: its path, its method and its handler.
pub struct Route {
    pub path: &'static str,
    pub method: Method,
    handler: MethodRouter<Arc<App>>,
}

fn route<H: Handler<T, Arc<App>>, T: 'static>(path: &'static str, method: Method, handler: H) -> Route {
    let filter = MethodFilter::try_from(method.clone()).expect("a method routes can filter on");
    Route {
        path,
        method,
        handler: on(filter, handler),
    }
}

/// Every route the gateway serves, the one list: the router is built from
/// it and `/openapi.json` documents it.
pub fn routes() -> Vec<Route> {
    vec![
        route("/v1/completions", Method::POST, completions),
        route("/v1/chat/completions", Method::POST, chat_completions),
        route("/v1/models", Method::GET, models),
        route("/v1/plan", Method::GET, plan),
        route("/health", Method::GET, health),
        route("/metrics", Method::GET, metrics),
        route(openapi::PATH, Method::GET, openapi_json),
    ]
}

pub fn router(app: Arc<App>) -> Router {
    let body_limit = DefaultBodyLimit::max(app.max_body_bytes());
    routes()
        .into_iter()
        .fold(Router::new(), |r, route| r.route(route.path, route.handler))
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

async fn models(State(app): State<Arc<App>>) -> Response {
    Json(app.models()).into_response()
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

async fn openapi_json(State(app): State<Arc<App>>) -> Json<utoipa::openapi::OpenApi> {
    Json(app.openapi())
}

/// A running gateway; dropping it (or `shutdown`) stops it.
pub struct GatewayHandle {
    pub addr: SocketAddr,
    pub control: Arc<Control>,
    stop: Option<oneshot::Sender<()>>,
    tasks: Vec<JoinHandle<()>>,
    /// What lives as long as the gateway (the mock agents it serves over);
    /// dropped after it stops.
    held: Vec<Box<dyn Send + Sync>>,
}

impl GatewayHandle {
    /// Keeps `thing` until the gateway is dropped.
    pub fn hold(&mut self, thing: impl Send + Sync + 'static) {
        self.held.push(Box::new(thing));
    }

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
    let key = config.control_key()?;
    let connects = config
        .workers
        .iter()
        .map(|w| ZmqWorker::connect(&w.endpoint, key, config.connect_timeout));
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
        held: Vec::new(),
    })
}
