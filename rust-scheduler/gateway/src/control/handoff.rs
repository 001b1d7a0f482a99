//! Hand-offs: the core's prefill -> decode decisions, carried out. The core
//! decides every hand-off; the gateway knows which group holds each request
//! and tells that group's agent. Agents choose no decode group themselves.
//!
//! When a request's first token arrives (`first_token`) the core says
//! stay, move to a decode group, or wait for a decode slot. A move is sent
//! at once to the agent holding the request (`hand_off`, naming the group
//! in the agent's numbering); a waiting request keeps decoding where it is
//! until the core grants it a slot (then it is moved the same way) or sheds
//! it (then it is cancelled at its agent and its client gets 503
//! `overloaded` with Retry-After). Grants and sheds are collected
//! (`take_released`) whenever a request completes and every window.
//! An agent moves KV within its node only; the core moves a request only
//! to a decode group on its node (one node per agent).
//!
//! Orders are decided under the control loop's lock and sent after it
//! (`Control::execute`): sending only enqueues, but the lock stays short.

use std::sync::atomic::Ordering;

use rustc_hash::FxHashMap;
use tiertp_scheduler::control::{Handoff, Released, ShedReason};
use tiertp_scheduler::plan::GroupKey;
use tiertp_scheduler::tiers::TierId;
use tokio::sync::oneshot;

use super::Control;
use crate::error::ApiError;

/// What a request learns when its first token arrives.
#[derive(Debug)]
pub struct Prefilled {
    /// The core's decision (a `Move` is on its way to the agent).
    pub handoff: Handoff,
    /// For `Wait` only: answered with the client's error if the wait is shed
    /// (the request is cancelled at its agent by then); closed without a
    /// value once a decode slot is granted.
    pub shed: Option<oneshot::Receiver<ApiError>>,
}

/// An order for the agent holding a request (global GPU numbering).
#[derive(Debug)]
pub enum Order {
    /// Move request `id`, running on group `from`, to decode group `to`.
    Move { id: u64, from: GroupKey, to: GroupKey },
    /// Cancel request `id` on group `at`, and give its client `notify`'s
    /// error: its wait for a decode slot was shed.
    Shed {
        id: u64,
        at: GroupKey,
        tier: TierId,
        notify: Option<oneshot::Sender<ApiError>>,
    },
}

/// A placed request: the group it was placed on and, while it waits for a
/// decode slot, who hears of a shed.
#[derive(Debug)]
struct Held {
    key: GroupKey,
    tier: TierId,
    on_shed: Option<oneshot::Sender<ApiError>>,
    /// A plan change moved it to `key` (its group stopped), and its agent
    /// has not yet applied a plan with that move.
    moving: bool,
}

/// The requests placed and not ended, by id.
#[derive(Debug, Default)]
pub struct Holders {
    held: FxHashMap<u64, Held>,
}

impl Holders {
    /// The request now runs on `key` (a new placement replaces the old one:
    /// only a request without a first token is placed again).
    pub fn placed(&mut self, id: u64, key: GroupKey, tier: TierId) {
        self.held.insert(
            id,
            Held {
                key,
                tier,
                on_shed: None,
                moving: false,
            },
        );
    }

    /// A plan change stopped the request's group: the core settled it on
    /// `key`, where its agent's TP switch is to move it.
    pub fn settled(&mut self, id: u64, key: GroupKey) {
        if let Some(h) = self.held.get_mut(&id) {
            h.key = key;
            h.moving = true;
        }
    }

    /// The moves not yet applied, by request id, with their groups.
    pub fn moves(&self) -> Vec<(u64, GroupKey)> {
        let mut out: Vec<(u64, GroupKey)> = self.held.iter().filter(|(_, h)| h.moving).map(|(&id, h)| (id, h.key)).collect();
        out.sort_unstable();
        out
    }

    /// An agent applied a plan with the moves to its groups (`on_agent`).
    pub fn moves_applied(&mut self, on_agent: impl Fn(GroupKey) -> bool) {
        for h in self.held.values_mut() {
            if h.moving && on_agent(h.key) {
                h.moving = false;
            }
        }
    }

    /// The request ended (or left its group to be placed again).
    pub fn ended(&mut self, id: u64) {
        self.held.remove(&id);
    }

    /// The core's decision for a request whose first token arrived: a
    /// `Move` becomes an order now; a `Wait` gets its shed notice.
    pub fn prefilled(&mut self, id: u64, handoff: Handoff, orders: &mut Vec<Order>) -> Prefilled {
        let mut shed = None;
        if let Some(h) = self.held.get_mut(&id) {
            match handoff {
                Handoff::Stay => {}
                Handoff::Move(d) => orders.push(Order::Move {
                    id,
                    from: h.key,
                    to: d.key(),
                }),
                Handoff::Wait => {
                    let (tx, rx) = oneshot::channel();
                    h.on_shed = Some(tx);
                    shed = Some(rx);
                }
            }
        }
        Prefilled { handoff, shed }
    }

    /// Waits the core let go of: granted ones move now, shed ones end.
    pub fn released(&mut self, released: Released, orders: &mut Vec<Order>) {
        for (id, d) in released.granted {
            if let Some(h) = self.held.get_mut(&id) {
                // Dropping the notice's sender: the request no longer waits.
                h.on_shed = None;
                orders.push(Order::Move {
                    id,
                    from: h.key,
                    to: d.key(),
                });
            }
        }
        for id in released.shed {
            if let Some(h) = self.held.remove(&id) {
                orders.push(Order::Shed {
                    id,
                    at: h.key,
                    tier: h.tier,
                    notify: h.on_shed,
                });
            }
        }
    }
}

impl Control {
    /// A request's first token arrived: its prompt charge comes back and the
    /// core decides its hand-off, which is carried out here (a move is sent
    /// to its agent now; see `Prefilled` for a wait); `None` for a request
    /// the loop does not hold.
    pub fn first_token(&self, id: u64) -> Option<Prefilled> {
        let now = self.now_s();
        let mut orders = Vec::new();
        let prefilled = {
            let mut s = self.state.lock().unwrap();
            let handoff = s.control.first_token(id, now).ok()?;
            s.holders.prefilled(id, handoff, &mut orders)
        };
        self.execute(orders);
        Some(prefilled)
    }

    /// The request ended (completion, failure or cancellation), or failed
    /// before its first token to be placed again: what it held comes back,
    /// and the hand-offs that were waiting for it are granted (or shed, if
    /// their wait ran out meanwhile).
    pub fn complete(&self, id: u64) {
        let now = self.now_s();
        let mut orders = Vec::new();
        {
            let mut s = self.state.lock().unwrap();
            s.control.finish(id, now);
            s.holders.ended(id);
            let released = s.control.take_released(now);
            s.holders.released(released, &mut orders);
        }
        self.execute(orders);
    }

    /// Carries out the core's hand-off orders: a move goes to the agent
    /// holding the request, in that agent's device numbering; a shed request
    /// is cancelled there after its client has been given the error (so its
    /// stream reports the shed, not a closed channel).
    pub(super) fn execute(&self, orders: Vec<Order>) {
        for order in orders {
            match order {
                Order::Move { id, from, to } => {
                    let w = self.nodes.worker_of(from.0);
                    if self.nodes.worker_of(to.0) != w {
                        // The core's nodes are the agents: never happens.
                        log::error!("request {id}: a move from group {from:?} to {to:?} on another agent; it decodes where it is");
                        continue;
                    }
                    self.workers[w].hand_off(id, self.nodes.local(w, to));
                }
                Order::Shed { id, at, tier, notify } => {
                    self.metrics.tiers[tier].shed.fetch_add(1, Ordering::Relaxed);
                    if let Some(n) = notify {
                        let _ = n.send(self.handoff_shed_error(tier));
                    }
                    self.workers[self.nodes.worker_of(at.0)].cancel(id);
                }
            }
        }
    }

    /// What the client of a request shed while waiting for a decode slot gets:
    /// like an admission shed, 503 `overloaded`, worth retrying after the
    /// next plan.
    fn handoff_shed_error(&self, tier: TierId) -> ApiError {
        let retry = self.window.as_secs_f64().ceil().max(1.0) as u64;
        ApiError::Overloaded {
            message: format!(
                "tier {:?} is at its SLO capacity ({}): no decode slot came free within its TPOT budget; retry after {retry} s",
                self.tiers.tiers()[tier].name,
                ShedReason::HandoffTimeout.name()
            ),
            retry_after_s: retry,
        }
    }
}
