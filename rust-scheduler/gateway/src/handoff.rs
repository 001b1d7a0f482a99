//! The core's prefill -> decode decisions, turned into orders for the
//! agents. The core decides every hand-off (`first_token`: move now, or
//! wait for a decode slot; `Released`: waits granted or shed); the gateway
//! knows which group holds each request, so it tells that group's agent
//! where to move the request (`hand_off`), or ends a request whose wait was
//! shed. Agents choose no decode group themselves.
//!
//! Orders are decided under the control loop's lock and sent after it
//! (`Control::execute`): sending only enqueues, but the lock stays short.

use rustc_hash::FxHashMap;
use tiertp_scheduler::control::{Handoff, Released};
use tiertp_scheduler::plan::GroupKey;
use tiertp_scheduler::tiers::TierId;
use tokio::sync::oneshot;

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
        self.held.insert(id, Held { key, tier, on_shed: None });
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
