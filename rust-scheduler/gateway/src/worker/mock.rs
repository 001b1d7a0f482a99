//! A mock node agent speaking the real protocol on a ROUTER socket, for
//! tests and the bench: it echoes the prompt's token ids as output (so the
//! text is predictable), with a configurable per-token delay and a failure
//! rate (a failed request ends with `worker_died`, as when an execution
//! process dies). Devices can die and come back (`kill_device`,
//! `revive_device`: their requests fail with `worker_died` and `stats`
//! reports them `dead`, as an agent whose execution process died); `kill`
//! drops the socket, as when the whole agent dies, and `restart_at` brings
//! an agent back on the same endpoint. A `hand_off` is recorded and
//! answered as an agent would: the running request moves to the group
//! named when the applied plan has it (any group of its devices before a
//! plan), else `unknown_group`; its tokens keep coming either way. Frames
//! are sealed as a real agent's (`seal`), under `mock::key()`; one that does
//! not open gets no reply. Unlike a real agent it has no window for new
//! sessions (a test double, not a control plane).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use rustc_hash::FxHashMap;
use tiertp_scheduler::plan::GroupKey;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use zeromq::{RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

use super::seal::{ControlKey, Direction, Header, Opener, Sealer, Session};
use crate::protocol::{
    self, codes, device_states, AgentMsg, ClientMsg, DevicePlan, DeviceStats, HandOffFailure, HandedOff, PlanApplied, Sampling, StatsReply,
    TokenItem,
};

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MockConfig {
    /// Time per output token; zero sends the whole output in one batch.
    pub token_delay: Duration,
    /// Probability that a request fails with `worker_died` before any token.
    pub failure_rate: f64,
    pub seed: u64,
    /// Devices (GPUs) this agent drives.
    pub devices: u32,
    /// The context length reported in `stats` and checked on `submit` (a
    /// longer request fails with `bad_request`, as the real agent's check).
    pub max_model_len: Option<u32>,
}

impl Default for MockConfig {
    fn default() -> Self {
        Self {
            token_delay: Duration::ZERO,
            failure_rate: 0.0,
            seed: 1,
            devices: 1,
            max_model_len: None,
        }
    }
}

/// What the mock saw, for assertions.
#[derive(Debug, Default)]
pub struct MockCounters {
    pub submits: AtomicU64,
    pub cancels: AtomicU64,
    pub failures: AtomicU64,
    pub plans: AtomicU64,
    pub hand_offs: AtomicU64,
}

type Outbox = mpsc::UnboundedSender<(Bytes, AgentMsg)>;

/// The key every mock agent of this process holds (random per process): a
/// gateway over mocks is given it.
pub fn key() -> &'static ControlKey {
    static KEY: OnceLock<ControlKey> = OnceLock::new();
    KEY.get_or_init(ControlKey::random)
}

/// One sealed session per client connection (its ROUTER peer id), begun by
/// the client's first frame.
#[derive(Clone, Default)]
struct Sessions(Arc<Mutex<FxHashMap<Bytes, (Opener, Sealer)>>>);

impl Sessions {
    /// The frame's plaintext, or `None`: it does not open (no reply then).
    fn open(&self, peer: &Bytes, frame: &[u8]) -> Option<Vec<u8>> {
        let mut map = self.0.lock().unwrap();
        if let Some((opener, _)) = map.get_mut(peer) {
            return opener.open(frame).ok();
        }
        let session = Session::join(key(), &Header::parse(frame).ok()?);
        let mut opener = session.opener(Direction::ToAgent);
        let body = opener.open(frame).ok()?;
        map.insert(peer.clone(), (opener, session.sealer(Direction::ToClient)));
        Some(body)
    }

    fn seal(&self, peer: &Bytes, plaintext: &[u8]) -> Option<Vec<u8>> {
        self.0.lock().unwrap().get_mut(peer).map(|(_, sealer)| sealer.seal(plaintext))
    }
}

struct Running {
    task: JoinHandle<()>,
    /// The TP group's devices, as (first, tp).
    group: GroupKey,
    peer: Bytes,
}

/// State that outlives a `kill` (what the devices are doing).
struct Devices {
    dead: Vec<bool>,
    running: FxHashMap<u64, Running>,
    /// Submits per device (the first device of the request's group).
    submits: Vec<u64>,
    plan: Option<(u64, Vec<DevicePlan>)>,
    /// Every `hand_off` received: the request and the group named.
    hand_offs: Vec<(u64, GroupKey)>,
    /// The sampling parameters of every `submit` received, in order.
    samplings: Vec<Sampling>,
    out: Option<Outbox>,
}

pub struct MockWorker {
    endpoint: String,
    config: MockConfig,
    counters: Arc<MockCounters>,
    tasks: Vec<JoinHandle<()>>,
    devices: Arc<Mutex<Devices>>,
}

fn covers(group: GroupKey, device: u32) -> bool {
    (group.0..group.0 + group.1).contains(&device)
}

impl MockWorker {
    /// Binds `tcp://127.0.0.1:0` and serves until dropped or killed.
    pub async fn start(config: MockConfig) -> Result<Self, zeromq::ZmqError> {
        let devices = Arc::new(Mutex::new(Devices {
            dead: vec![false; config.devices as usize],
            running: FxHashMap::default(),
            submits: vec![0; config.devices as usize],
            plan: None,
            hand_offs: Vec::new(),
            samplings: Vec::new(),
            out: None,
        }));
        let mut w = Self {
            endpoint: String::new(),
            config,
            counters: Arc::default(),
            tasks: Vec::new(),
            devices,
        };
        w.serve("tcp://127.0.0.1:0").await?;
        Ok(w)
    }

    /// After `kill`: serves again on the same endpoint, as an agent that was
    /// restarted (no plan applied yet, every device alive).
    pub async fn restart(&mut self) -> Result<(), zeromq::ZmqError> {
        self.kill();
        {
            let mut d = self.devices.lock().unwrap();
            d.dead.iter_mut().for_each(|x| *x = false);
            d.plan = None;
        }
        let endpoint = self.endpoint.clone();
        // The old listener may take a moment to let go of the port.
        let mut last = None;
        for _ in 0..100 {
            match self.serve(&endpoint).await {
                Ok(()) => return Ok(()),
                Err(e) => last = Some(e),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Err(last.expect("tried at least once"))
    }

    async fn serve(&mut self, endpoint: &str) -> Result<(), zeromq::ZmqError> {
        let mut socket = RouterSocket::new();
        self.endpoint = socket.bind(endpoint).await?.to_string();
        let (mut tx, mut rx) = socket.split();
        let (out, mut out_rx) = mpsc::unbounded_channel::<(Bytes, AgentMsg)>();
        self.devices.lock().unwrap().out = Some(out.clone());
        let sessions = Sessions::default();
        let seals = sessions.clone();
        let writer = tokio::spawn(async move {
            let mut batch = Vec::new();
            while out_rx.recv_many(&mut batch, 256).await > 0 {
                // Token items for the same client go out as one message, as a
                // real agent batches them per iteration.
                let mut tokens: Vec<(Bytes, Vec<TokenItem>)> = Vec::new();
                for (peer, msg) in batch.drain(..) {
                    match msg {
                        AgentMsg::Tokens { items } => match tokens.iter_mut().find(|(p, _)| *p == peer) {
                            Some((_, v)) => v.extend(items),
                            None => tokens.push((peer, items)),
                        },
                        other => send(&mut tx, &seals, peer, &other).await,
                    }
                }
                for (peer, items) in tokens {
                    send(&mut tx, &seals, peer, &AgentMsg::Tokens { items }).await;
                }
            }
        });
        let reader = {
            let (counters, devices, config) = (self.counters.clone(), self.devices.clone(), self.config);
            tokio::spawn(async move {
                let mut rng = config.seed.max(1);
                while let Ok(msg) = rx.recv().await {
                    let mut frames = msg.into_vecdeque();
                    let (Some(peer), Some(frame)) = (frames.pop_front(), frames.pop_back()) else {
                        continue;
                    };
                    let Some(body) = sessions.open(&peer, &frame) else {
                        continue;
                    };
                    let reply = |m: AgentMsg| {
                        let _ = out.send((peer.clone(), m));
                    };
                    match protocol::decode::<ClientMsg>(&body) {
                        Ok(ClientMsg::Submit {
                            id,
                            input_ids,
                            sampling,
                            group,
                            ..
                        }) => {
                            counters.submits.fetch_add(1, Ordering::Relaxed);
                            let group = group.unwrap_or((0, 1));
                            let mut d = devices.lock().unwrap();
                            d.samplings.push(sampling.clone());
                            if let Some(n) = d.submits.get_mut(group.0 as usize) {
                                *n += 1;
                            }
                            let dead = (group.0..group.0 + group.1).find(|&g| d.dead.get(g as usize).copied().unwrap_or(true));
                            if let Some(g) = dead {
                                counters.failures.fetch_add(1, Ordering::Relaxed);
                                reply(error(Some(id), codes::WORKER_DIED, &format!("mock device {g} is dead or unknown")));
                                continue;
                            }
                            let total = input_ids.len() as u64 + u64::from(sampling.max_tokens);
                            if let Some(limit) = config.max_model_len.filter(|&l| total > u64::from(l)) {
                                reply(error(
                                    Some(id),
                                    codes::BAD_REQUEST,
                                    &format!("submit {id}: {total} tokens exceed the {limit} tokens a request may hold"),
                                ));
                                continue;
                            }
                            if next_unit(&mut rng) < config.failure_rate {
                                counters.failures.fetch_add(1, Ordering::Relaxed);
                                reply(error(Some(id), codes::WORKER_DIED, "mock execution process died"));
                                continue;
                            }
                            let output = echo(&input_ids, sampling.max_tokens, &sampling.stop_token_ids);
                            let prompt_tokens = Some(input_ids.len() as u32);
                            if config.token_delay.is_zero() {
                                reply(AgentMsg::Tokens {
                                    items: vec![TokenItem {
                                        id,
                                        tokens: output.0,
                                        finished: true,
                                        finish_reason: Some(output.1.into()),
                                        prompt_tokens,
                                    }],
                                });
                            } else {
                                let task = tokio::spawn(stream_tokens(
                                    out.clone(),
                                    peer.clone(),
                                    devices.clone(),
                                    id,
                                    output,
                                    prompt_tokens,
                                    config.token_delay,
                                ));
                                d.running.insert(
                                    id,
                                    Running {
                                        task,
                                        group,
                                        peer: peer.clone(),
                                    },
                                );
                            }
                        }
                        Ok(ClientMsg::Cancel { id }) => {
                            counters.cancels.fetch_add(1, Ordering::Relaxed);
                            if let Some(r) = devices.lock().unwrap().running.remove(&id) {
                                r.task.abort();
                            }
                            reply(error(Some(id), codes::CANCELLED, "cancelled by the client"));
                        }
                        Ok(ClientMsg::HandOff { id, group }) => {
                            counters.hand_offs.fetch_add(1, Ordering::Relaxed);
                            let mut d = devices.lock().unwrap();
                            d.hand_offs.push((id, group));
                            reply(AgentMsg::HandedOff(hand_off(&mut d, id, group, config.devices)));
                        }
                        Ok(ClientMsg::ApplyPlan {
                            plan_id, devices: plan, ..
                        }) => {
                            counters.plans.fetch_add(1, Ordering::Relaxed);
                            let n = config.devices;
                            let applied = match plan.iter().find(|p| p.device >= n) {
                                Some(p) => PlanApplied {
                                    plan_id,
                                    ok: false,
                                    reason: Some(format!("unknown device {}: this node has devices 0..{}", p.device, n - 1)),
                                    switch_ms: 0.0,
                                },
                                None => {
                                    devices.lock().unwrap().plan = Some((plan_id, plan));
                                    PlanApplied {
                                        plan_id,
                                        ok: true,
                                        reason: None,
                                        switch_ms: 0.0,
                                    }
                                }
                            };
                            reply(AgentMsg::PlanApplied(applied));
                        }
                        Ok(ClientMsg::Stats) => reply(AgentMsg::Stats(stats(&devices.lock().unwrap(), config.max_model_len))),
                        Ok(ClientMsg::Ping) => reply(AgentMsg::Pong),
                        Err(e) => reply(error(None, codes::BAD_REQUEST, &e.to_string())),
                    }
                }
            })
        };
        self.tasks = vec![writer, reader];
        Ok(())
    }

    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The devices it drives (its node's GPUs).
    pub fn devices(&self) -> u32 {
        self.config.devices
    }

    pub fn counters(&self) -> &Arc<MockCounters> {
        &self.counters
    }

    /// Requests submitted to each device (the first device of their group).
    pub fn submits_per_device(&self) -> Vec<u64> {
        self.devices.lock().unwrap().submits.clone()
    }

    /// Every `hand_off` received, in order: the request and the group named.
    pub fn hand_offs(&self) -> Vec<(u64, GroupKey)> {
        self.devices.lock().unwrap().hand_offs.clone()
    }

    /// The sampling parameters of every `submit` received, in order.
    pub fn samplings(&self) -> Vec<Sampling> {
        self.devices.lock().unwrap().samplings.clone()
    }

    /// The last plan applied: its id and device entries.
    pub fn last_plan(&self) -> Option<(u64, Vec<DevicePlan>)> {
        self.devices.lock().unwrap().plan.clone()
    }

    /// A device's execution process dies: its running requests fail with
    /// `worker_died`, new ones on it too, `stats` says `dead`.
    pub fn kill_device(&self, device: u32) {
        let mut d = self.devices.lock().unwrap();
        d.dead[device as usize] = true;
        let lost: Vec<u64> = d
            .running
            .iter()
            .filter(|(_, r)| covers(r.group, device))
            .map(|(&id, _)| id)
            .collect();
        for id in lost {
            let r = d.running.remove(&id).expect("listed above");
            r.task.abort();
            if let Some(out) = &d.out {
                let _ = out.send((r.peer, error(Some(id), codes::WORKER_DIED, &format!("mock device {device} died"))));
            }
        }
    }

    /// The device is ready again.
    pub fn revive_device(&self, device: u32) {
        self.devices.lock().unwrap().dead[device as usize] = false;
    }

    /// Dies like `kill`, and returns once its tasks have ended, so that the
    /// socket they held is closed: a client dialling now finds nobody.
    pub async fn kill_and_wait(&mut self) {
        let tasks: Vec<JoinHandle<()>> = self.tasks.drain(..).collect();
        for t in &tasks {
            t.abort();
        }
        self.kill();
        for t in tasks {
            let _ = t.await; // cancelled: its socket half is dropped
        }
    }

    /// Dies: drops the socket and every running request without a reply.
    pub fn kill(&mut self) {
        for t in self.tasks.drain(..) {
            t.abort();
        }
        let mut d = self.devices.lock().unwrap();
        d.out = None;
        for (_, r) in d.running.drain() {
            r.task.abort();
        }
    }
}

impl Drop for MockWorker {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Moves a running request to `group` when this agent has it.
fn hand_off(d: &mut Devices, id: u64, group: GroupKey, num_devices: u32) -> HandedOff {
    let known = match &d.plan {
        Some((_, plan)) => plan.iter().any(|p| p.tp_group == group),
        None => group.1 > 0 && group.0 + group.1 <= num_devices,
    };
    let failure = if !known {
        Some((
            HandOffFailure::UnknownGroup,
            format!("group {group:?} is not active on this mock agent"),
        ))
    } else if (group.0..group.0 + group.1).any(|g| d.dead[g as usize]) {
        Some((HandOffFailure::GroupNotReady, format!("a device of group {group:?} is dead")))
    } else if let Some(r) = d.running.get_mut(&id) {
        r.group = group;
        None
    } else {
        Some((HandOffFailure::NotRunning, format!("request {id} is not running here")))
    };
    HandedOff {
        id,
        group,
        ok: failure.is_none(),
        code: failure.as_ref().map(|f| f.0),
        message: failure.map(|f| f.1),
    }
}

fn stats(d: &Devices, max_model_len: Option<u32>) -> StatsReply {
    let planned = |device: u32| d.plan.as_ref().and_then(|(_, p)| p.iter().find(|e| e.device == device));
    StatsReply {
        devices: (0..d.dead.len() as u32)
            .map(|device| {
                let p = planned(device);
                DeviceStats {
                    device,
                    role: p.map(|p| p.role.clone()),
                    tier: p.map(|p| p.tier.clone()),
                    tp_group: p.map(|p| p.tp_group),
                    running: d.running.values().filter(|r| covers(r.group, device)).count() as u32,
                    waiting: 0,
                    kv_used_tokens: None,
                    kv_capacity_tokens: None,
                    state: Some(
                        if d.dead[device as usize] {
                            device_states::DEAD
                        } else {
                            device_states::READY
                        }
                        .to_string(),
                    ),
                }
            })
            .collect(),
        plan_id: d.plan.as_ref().map(|(id, _)| *id),
        max_model_len,
    }
}

async fn stream_tokens(
    out: Outbox,
    peer: Bytes,
    devices: Arc<Mutex<Devices>>,
    id: u64,
    output: (Vec<u32>, &'static str),
    prompt_tokens: Option<u32>,
    delay: Duration,
) {
    let n = output.0.len();
    for (k, tok) in output.0.into_iter().enumerate() {
        tokio::time::sleep(delay).await;
        let last = k + 1 == n;
        let item = TokenItem {
            id,
            tokens: vec![tok],
            finished: last,
            finish_reason: last.then(|| output.1.to_string()),
            prompt_tokens: if k == 0 { prompt_tokens } else { None },
        };
        if last {
            // Off the running list before the terminal item, so a device
            // death cannot send a second terminal message.
            if devices.lock().unwrap().running.remove(&id).is_none() {
                return;
            }
        }
        let _ = out.send((peer.clone(), AgentMsg::Tokens { items: vec![item] }));
    }
    if n == 0 && devices.lock().unwrap().running.remove(&id).is_some() {
        let item = TokenItem {
            id,
            tokens: Vec::new(),
            finished: true,
            finish_reason: Some(output.1.to_string()),
            prompt_tokens,
        };
        let _ = out.send((peer.clone(), AgentMsg::Tokens { items: vec![item] }));
    }
}

async fn send<S: SocketSend>(tx: &mut S, sessions: &Sessions, peer: Bytes, msg: &AgentMsg) {
    let Some(frame) = sessions.seal(&peer, &protocol::encode(msg)) else {
        return;
    };
    let mut m = ZmqMessage::from(frame);
    m.push_front(peer);
    let _ = tx.send(m).await;
}

fn error(id: Option<u64>, code: &str, message: &str) -> AgentMsg {
    AgentMsg::Error {
        id,
        code: code.to_string(),
        message: message.to_string(),
    }
}

/// The prompt's ids, cycled to `max_tokens`, ending early (`stop`, the stop
/// token not emitted) at a stop token.
fn echo(input: &[u32], max_tokens: u32, stop: &[u32]) -> (Vec<u32>, &'static str) {
    let mut out = Vec::with_capacity(max_tokens as usize);
    for k in 0..max_tokens as usize {
        let t = input.get(k % input.len().max(1)).copied().unwrap_or(0);
        if stop.contains(&t) {
            return (out, "stop");
        }
        out.push(t);
    }
    (out, "length")
}

/// xorshift64: deterministic failures without a rand dependency.
fn next_unit(state: &mut u64) -> f64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    (*state >> 11) as f64 / (1u64 << 53) as f64
}
