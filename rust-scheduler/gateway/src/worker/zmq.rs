//! The worker control protocol over ZeroMQ (docs/worker-protocol.md): one
//! DEALER socket per agent, written from a channel (so the request path
//! never awaits the socket), read by routing token batches to per-request
//! channels, and watched: when the connection drops, every pending request
//! fails and the agent is dialled again until it is back. An agent that is
//! not up when the gateway starts is dialled the same way, so a node may
//! join after the gateway (its GPUs are out of the plan until then). Each
//! connection is one sealed session (`seal`): an agent without the same key
//! hears nothing from the gateway, and the gateway opens only its agent's
//! replies.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use futures_util::StreamExt;
use rustc_hash::FxHashMap;
use tiertp_scheduler::plan::GroupKey;
use tokio::sync::{mpsc, oneshot};
use zeromq::{DealerSocket, Socket, SocketEvent, SocketRecv, SocketSend, ZmqMessage};

use super::seal::{ControlKey, Direction, Session};
use super::{Submit, TokenEvent, TokenStream, WorkerClient, WorkerError};
use crate::protocol::{self, AgentMsg, ClientMsg, DevicePlan, HandOffFailure, HandedOff, PlanApplied, PlanMove, StatsReply};

struct Shared {
    name: String,
    key: ControlKey,
    alive: AtomicBool,
    pending: Mutex<FxHashMap<u64, mpsc::UnboundedSender<TokenEvent>>>,
    plan_waiters: Mutex<FxHashMap<u64, oneshot::Sender<PlanApplied>>>,
    stats_waiters: Mutex<VecDeque<oneshot::Sender<StatsReply>>>,
    out: mpsc::UnboundedSender<Vec<u8>>,
}

impl Shared {
    fn died(&self, reason: &str) -> WorkerError {
        WorkerError::Died {
            worker: self.name.clone(),
            reason: reason.to_string(),
        }
    }

    /// Ends every pending request with `worker_died`: none may hang.
    fn fail_all(&self, reason: &str) {
        self.alive.store(false, Ordering::SeqCst);
        let pending: Vec<_> = self.pending.lock().unwrap().drain().collect();
        for (_, tx) in pending {
            let _ = tx.send(TokenEvent::Failed(self.died(reason)));
        }
        self.plan_waiters.lock().unwrap().clear();
        self.stats_waiters.lock().unwrap().clear();
    }

    fn route(&self, msg: AgentMsg) {
        match msg {
            AgentMsg::Tokens { items } => {
                let mut pending = self.pending.lock().unwrap();
                for item in items {
                    let tx = if item.finished {
                        pending.remove(&item.id)
                    } else {
                        pending.get(&item.id).cloned()
                    };
                    if let Some(tx) = tx {
                        let _ = tx.send(TokenEvent::Tokens {
                            tokens: item.tokens,
                            finished: item.finished,
                            finish_reason: item.finish_reason,
                            prompt_tokens: item.prompt_tokens,
                        });
                    }
                }
            }
            AgentMsg::Error {
                id: Some(id),
                code,
                message,
            } => {
                if let Some(tx) = self.pending.lock().unwrap().remove(&id) {
                    let _ = tx.send(TokenEvent::Failed(WorkerError::Rejected {
                        worker: self.name.clone(),
                        code,
                        message,
                    }));
                }
            }
            AgentMsg::Error { id: None, code, message } => {
                log::warn!("worker {}: protocol error {code}: {message}", self.name);
            }
            AgentMsg::PlanApplied(p) => {
                if let Some(tx) = self.plan_waiters.lock().unwrap().remove(&p.plan_id) {
                    let _ = tx.send(p);
                }
            }
            AgentMsg::HandedOff(h) => log_hand_off(&self.name, &h),
            AgentMsg::Stats(s) => {
                if let Some(tx) = self.stats_waiters.lock().unwrap().pop_front() {
                    let _ = tx.send(s);
                }
            }
            AgentMsg::Pong => {}
        }
    }

    fn send(&self, msg: &ClientMsg) -> Result<(), WorkerError> {
        self.out.send(protocol::encode(msg)).map_err(|_| self.died("connection closed"))
    }
}

/// A hand-off the agent could not make leaves the request decoding where it
/// was: worth a warning, except for a request that ended before it could
/// move (an expected race).
fn log_hand_off(worker: &str, h: &HandedOff) {
    if h.ok {
        return;
    }
    let code = h.code.map_or("unknown", HandOffFailure::name);
    let why = h.message.as_deref().unwrap_or("");
    if h.code == Some(HandOffFailure::NotRunning) {
        log::debug!("worker {worker}: request {} not handed off to {:?} ({code}): {why}", h.id, h.group);
    } else {
        log::warn!(
            "worker {worker}: request {} not handed off to {:?} ({code}): {why}; it decodes where it is",
            h.id,
            h.group
        );
    }
}

pub struct ZmqWorker {
    shared: Arc<Shared>,
    supervisor: tokio::task::JoinHandle<()>,
}

/// Waits between reconnection attempts: doubling from the first to the last.
const RECONNECT_BACKOFF: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(2));

/// One connection to the agent: the socket, its event monitor and its session.
struct Connection {
    socket: DealerSocket,
    monitor: futures_util::stream::BoxStream<'static, SocketEvent>,
    session: Session,
}

impl Connection {
    async fn open(endpoint: &str, key: &ControlKey, timeout: Duration) -> Result<Self, WorkerError> {
        let connect_err = |reason: String| WorkerError::Connect {
            worker: endpoint.to_string(),
            reason,
        };
        let mut socket = DealerSocket::new();
        let monitor = Box::pin(socket.monitor());
        tokio::time::timeout(timeout, socket.connect(endpoint))
            .await
            .map_err(|_| connect_err(format!("no connection within {} s", timeout.as_secs_f64())))?
            .map_err(|e| connect_err(e.to_string()))?;
        Ok(Self {
            socket,
            monitor,
            session: Session::start(key),
        })
    }

    /// Carries messages both ways until the connection fails; returns why.
    async fn run(self, shared: &Shared, out_rx: &mut mpsc::UnboundedReceiver<Vec<u8>>) -> String {
        let Connection {
            socket,
            mut monitor,
            session,
        } = self;
        let (mut sealer, mut opener) = (session.sealer(Direction::ToAgent), session.opener(Direction::ToClient));
        let (mut tx, mut rx) = socket.split();
        let writer = async {
            while let Some(buf) = out_rx.recv().await {
                if let Err(e) = tx.send(ZmqMessage::from(sealer.seal(&buf))).await {
                    return format!("send failed: {e}");
                }
            }
            "client closed".to_string()
        };
        let reader = async {
            loop {
                match rx.recv().await {
                    Ok(msg) => match msg.get(0).map(|f| opener.open(f)) {
                        Some(Ok(body)) => match protocol::decode::<AgentMsg>(&body) {
                            Ok(m) => shared.route(m),
                            Err(e) => log::warn!("worker {}: undecodable message: {e}", shared.name),
                        },
                        Some(Err(e)) => log::warn!("worker {}: a frame refused: {e}", shared.name),
                        None => {}
                    },
                    Err(e) => return format!("receive failed: {e}"),
                }
            }
        };
        let watcher = async {
            while let Some(event) = monitor.next().await {
                if matches!(event, SocketEvent::Disconnected(_) | SocketEvent::Closed) {
                    return "connection lost".to_string();
                }
            }
            "connection monitor ended".to_string()
        };
        tokio::select! {
            r = writer => r,
            r = reader => r,
            r = watcher => r,
        }
    }
}

/// Runs connections one after the other, starting with `conn` (`None`: the
/// agent was not reachable at start): when one fails, every pending request
/// fails (`worker_died`: none may hang) and the agent is dialled again until
/// it answers, e.g. after a restart or once it has started.
async fn supervise(shared: Arc<Shared>, mut conn: Option<Connection>, mut out_rx: mpsc::UnboundedReceiver<Vec<u8>>, timeout: Duration) {
    loop {
        if let Some(c) = conn.take() {
            let reason = c.run(&shared, &mut out_rx).await;
            log::warn!("worker {}: {reason}; reconnecting", shared.name);
            shared.fail_all(&reason);
        }
        let mut wait = RECONNECT_BACKOFF.0;
        conn = Some(loop {
            tokio::time::sleep(wait).await;
            match Connection::open(&shared.name, &shared.key, timeout).await {
                Ok(c) => break c,
                Err(_) => wait = (wait * 2).min(RECONNECT_BACKOFF.1),
            }
        });
        // What was queued meanwhile was meant for the agent that is gone.
        while out_rx.try_recv().is_ok() {}
        shared.fail_all("connection lost");
        shared.alive.store(true, Ordering::SeqCst);
        log::info!("worker {}: connected", shared.name);
    }
}

/// Checks an agent endpoint's syntax: the gateway reaches agents over TCP.
pub fn check_endpoint(endpoint: &str) -> Result<(), String> {
    match endpoint.parse::<zeromq::Endpoint>() {
        Ok(zeromq::Endpoint::Tcp(..)) => Ok(()),
        Ok(_) => Err(format!(
            "worker endpoint {endpoint:?}: the gateway reaches agents over TCP only (tcp://HOST:PORT)"
        )),
        Err(e) => Err(format!("worker endpoint {endpoint:?}: {e}; expected tcp://HOST:PORT")),
    }
}

impl ZmqWorker {
    /// Connects to an agent's ROUTER endpoint (e.g. `tcp://127.0.0.1:7100`),
    /// waiting up to `timeout` for it. An agent not reachable by then is no
    /// error (a node may start after the gateway): the client starts
    /// disconnected (`is_alive` false, so its GPUs are out of the plan) and
    /// dials it for as long as the client lives, as after a lost connection.
    /// Only a malformed endpoint is an error. Every frame is sealed under
    /// `key`, the agent's (`tiertp keys`).
    pub async fn connect(endpoint: &str, key: &ControlKey, timeout: Duration) -> Result<Self, WorkerError> {
        check_endpoint(endpoint).map_err(|reason| WorkerError::Connect {
            worker: endpoint.to_string(),
            reason,
        })?;
        let conn = match Connection::open(endpoint, key, timeout).await {
            Ok(c) => Some(c),
            Err(e) => {
                log::warn!("{e}; dialling it until it answers (its GPUs are out of the plan until then)");
                None
            }
        };
        let (out, out_rx) = mpsc::unbounded_channel::<Vec<u8>>();
        let shared = Arc::new(Shared {
            name: endpoint.to_string(),
            key: key.clone(),
            alive: AtomicBool::new(conn.is_some()),
            pending: Mutex::default(),
            plan_waiters: Mutex::default(),
            stats_waiters: Mutex::default(),
            out,
        });
        let supervisor = tokio::spawn(supervise(shared.clone(), conn, out_rx, timeout));
        Ok(Self { shared, supervisor })
    }
}

impl Drop for ZmqWorker {
    fn drop(&mut self) {
        self.shared.fail_all("client closed");
        self.supervisor.abort();
    }
}

#[async_trait]
impl WorkerClient for ZmqWorker {
    fn name(&self) -> &str {
        &self.shared.name
    }

    fn is_alive(&self) -> bool {
        self.shared.alive.load(Ordering::SeqCst)
    }

    fn submit(&self, r: Submit) -> Result<TokenStream, WorkerError> {
        if !self.is_alive() {
            return Err(self.shared.died("connection lost"));
        }
        let (tx, rx) = mpsc::unbounded_channel();
        self.shared.pending.lock().unwrap().insert(r.id, tx);
        let msg = ClientMsg::Submit {
            id: r.id,
            tier: r.tier,
            input_ids: r.input_ids,
            sampling: r.sampling,
            class: r.class,
            group: r.group,
            start_within_s: r.start_within_s,
        };
        if let Err(e) = self.shared.send(&msg) {
            self.shared.pending.lock().unwrap().remove(&r.id);
            return Err(e);
        }
        Ok(rx)
    }

    fn cancel(&self, id: u64) {
        // Dropping the sender first: whatever the agent still sends is ignored.
        if self.shared.pending.lock().unwrap().remove(&id).is_some() {
            let _ = self.shared.send(&ClientMsg::Cancel { id });
        }
    }

    fn hand_off(&self, id: u64, group: GroupKey) {
        if self.shared.pending.lock().unwrap().contains_key(&id) {
            let _ = self.shared.send(&ClientMsg::HandOff { id, group });
        }
    }

    async fn apply_plan(&self, plan_id: u64, devices: Vec<DevicePlan>, moves: Vec<PlanMove>) -> Result<PlanApplied, WorkerError> {
        let (tx, rx) = oneshot::channel();
        self.shared.plan_waiters.lock().unwrap().insert(plan_id, tx);
        self.shared.send(&ClientMsg::ApplyPlan { plan_id, devices, moves })?;
        rx.await.map_err(|_| self.shared.died("connection lost before plan_applied"))
    }

    async fn stats(&self) -> Result<StatsReply, WorkerError> {
        let (tx, rx) = oneshot::channel();
        self.shared.stats_waiters.lock().unwrap().push_back(tx);
        self.shared.send(&ClientMsg::Stats)?;
        rx.await.map_err(|_| self.shared.died("connection lost before stats"))
    }
}
