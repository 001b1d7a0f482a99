//! A node agent for tests that drive the gateway's control path in
//! process (no sockets): it accepts every plan and records the hand-off and
//! cancel orders and the plans' moves it gets.

#![allow(dead_code)]

use std::sync::Mutex;

use async_trait::async_trait;
use tiertp_gateway::protocol::{DevicePlan, PlanApplied, PlanMove, StatsReply};
use tiertp_gateway::worker::{Submit, TokenStream, WorkerClient, WorkerError};
use tiertp_scheduler::plan::GroupKey;

/// A node agent that records the orders it gets.
#[derive(Default)]
pub struct Recorder {
    pub hand_offs: Mutex<Vec<(u64, GroupKey)>>,
    pub cancels: Mutex<Vec<u64>>,
    /// Every `apply_plan`'s moves, in order.
    pub moves: Mutex<Vec<(u64, GroupKey)>>,
}

#[async_trait]
impl WorkerClient for Recorder {
    fn name(&self) -> &str {
        "recorder"
    }
    fn is_alive(&self) -> bool {
        true
    }
    fn submit(&self, _request: Submit) -> Result<TokenStream, WorkerError> {
        unreachable!("requests are placed through the control path only, never submitted")
    }
    fn cancel(&self, id: u64) {
        self.cancels.lock().unwrap().push(id);
    }
    fn hand_off(&self, id: u64, group: GroupKey) {
        self.hand_offs.lock().unwrap().push((id, group));
    }
    async fn apply_plan(&self, plan_id: u64, _devices: Vec<DevicePlan>, moves: Vec<PlanMove>) -> Result<PlanApplied, WorkerError> {
        self.moves.lock().unwrap().extend(moves.into_iter().map(|m| (m.id, m.tp_group)));
        Ok(PlanApplied {
            plan_id,
            ok: true,
            reason: None,
            switch_ms: 0.0,
        })
    }
    async fn stats(&self) -> Result<StatsReply, WorkerError> {
        Ok(StatsReply {
            devices: Vec::new(),
            plan_id: None,
            max_model_len: None,
        })
    }
}
