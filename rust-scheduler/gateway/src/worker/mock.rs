//! A mock node agent speaking the real protocol on a ROUTER socket, for
//! tests and the bench: it echoes the prompt's token ids as output (so the
//! text is predictable), with a configurable per-token delay and a failure
//! rate (a failed request ends with `worker_died`, as when an execution
//! process dies). `kill` drops the socket, as when the whole agent dies.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use rustc_hash::FxHashMap;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use zeromq::{RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

use crate::protocol::{self, codes, AgentMsg, ClientMsg, PlanApplied, StatsReply, TokenItem};

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MockConfig {
    /// Time per output token; zero sends the whole output in one batch.
    pub token_delay: Duration,
    /// Probability that a request fails with `worker_died` before any token.
    pub failure_rate: f64,
    pub seed: u64,
}

impl Default for MockConfig {
    fn default() -> Self {
        Self {
            token_delay: Duration::ZERO,
            failure_rate: 0.0,
            seed: 1,
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
}

pub struct MockWorker {
    endpoint: String,
    counters: Arc<MockCounters>,
    tasks: Vec<JoinHandle<()>>,
    running: Arc<Mutex<FxHashMap<u64, JoinHandle<()>>>>,
}

impl MockWorker {
    /// Binds `tcp://127.0.0.1:0` and serves until dropped or killed.
    pub async fn start(config: MockConfig) -> Result<Self, zeromq::ZmqError> {
        let mut socket = RouterSocket::new();
        let endpoint = socket.bind("tcp://127.0.0.1:0").await?.to_string();
        let (mut tx, mut rx) = socket.split();
        let (out, mut out_rx) = mpsc::unbounded_channel::<(Bytes, AgentMsg)>();
        let counters = Arc::new(MockCounters::default());
        let running: Arc<Mutex<FxHashMap<u64, JoinHandle<()>>>> = Arc::default();
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
                        other => send(&mut tx, peer, &other).await,
                    }
                }
                for (peer, items) in tokens {
                    send(&mut tx, peer, &AgentMsg::Tokens { items }).await;
                }
            }
        });
        let reader = {
            let (counters, running) = (counters.clone(), running.clone());
            tokio::spawn(async move {
                let mut rng = config.seed.max(1);
                while let Ok(msg) = rx.recv().await {
                    let mut frames = msg.into_vecdeque();
                    let (Some(peer), Some(body)) = (frames.pop_front(), frames.pop_back()) else {
                        continue;
                    };
                    let reply = |m: AgentMsg| {
                        let _ = out.send((peer.clone(), m));
                    };
                    match protocol::decode::<ClientMsg>(&body) {
                        Ok(ClientMsg::Submit {
                            id, input_ids, sampling, ..
                        }) => {
                            counters.submits.fetch_add(1, Ordering::Relaxed);
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
                                let (out, peer, running2) = (out.clone(), peer.clone(), running.clone());
                                let task = tokio::spawn(async move {
                                    let n = output.0.len();
                                    for (k, tok) in output.0.into_iter().enumerate() {
                                        tokio::time::sleep(config.token_delay).await;
                                        let last = k + 1 == n;
                                        let item = TokenItem {
                                            id,
                                            tokens: vec![tok],
                                            finished: last,
                                            finish_reason: last.then(|| output.1.to_string()),
                                            prompt_tokens: if k == 0 { prompt_tokens } else { None },
                                        };
                                        let _ = out.send((peer.clone(), AgentMsg::Tokens { items: vec![item] }));
                                    }
                                    if n == 0 {
                                        let item = TokenItem {
                                            id,
                                            tokens: Vec::new(),
                                            finished: true,
                                            finish_reason: Some(output.1.to_string()),
                                            prompt_tokens,
                                        };
                                        let _ = out.send((peer.clone(), AgentMsg::Tokens { items: vec![item] }));
                                    }
                                    running2.lock().unwrap().remove(&id);
                                });
                                running.lock().unwrap().insert(id, task);
                            }
                        }
                        Ok(ClientMsg::Cancel { id }) => {
                            counters.cancels.fetch_add(1, Ordering::Relaxed);
                            if let Some(t) = running.lock().unwrap().remove(&id) {
                                t.abort();
                            }
                            reply(error(Some(id), codes::CANCELLED, "cancelled by the client"));
                        }
                        Ok(ClientMsg::ApplyPlan { plan_id, .. }) => {
                            counters.plans.fetch_add(1, Ordering::Relaxed);
                            reply(AgentMsg::PlanApplied(PlanApplied {
                                plan_id,
                                ok: true,
                                reason: None,
                                switch_ms: 0.0,
                            }));
                        }
                        Ok(ClientMsg::Stats) => reply(AgentMsg::Stats(StatsReply {
                            devices: Vec::new(),
                            plan_id: None,
                        })),
                        Ok(ClientMsg::Ping) => reply(AgentMsg::Pong),
                        Err(e) => reply(error(None, codes::BAD_REQUEST, &e.to_string())),
                    }
                }
            })
        };
        Ok(Self {
            endpoint,
            counters,
            tasks: vec![writer, reader],
            running,
        })
    }

    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    pub fn counters(&self) -> &Arc<MockCounters> {
        &self.counters
    }

    /// Dies: drops the socket and every running request without a reply.
    pub fn kill(&mut self) {
        for t in self.tasks.drain(..) {
            t.abort();
        }
        for (_, t) in self.running.lock().unwrap().drain() {
            t.abort();
        }
    }
}

impl Drop for MockWorker {
    fn drop(&mut self) {
        self.kill();
    }
}

async fn send<S: SocketSend>(tx: &mut S, peer: Bytes, msg: &AgentMsg) {
    let mut m = ZmqMessage::from(protocol::encode(msg));
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
