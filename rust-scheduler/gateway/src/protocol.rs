//! Messages of the worker control protocol (docs/worker-protocol.md): one
//! msgpack map per ZeroMQ frame, tagged by `"type"`. Both the gateway's
//! client and the mock worker use these types, so they cannot drift apart.

use serde::{Deserialize, Serialize};
use tiertp_scheduler::dispatcher::DispatchClass;
use tiertp_scheduler::plan::GroupKey;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sampling {
    pub max_tokens: u32,
    pub temperature: f64,
    pub top_p: f64,
    pub seed: Option<u64>,
    pub stop_token_ids: Vec<u32>,
}

/// One device of an `apply_plan`; indices are local to the agent (a TP group
/// never spans nodes, and each agent is one node).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DevicePlan {
    pub device: u32,
    pub role: String,
    pub tier: String,
    pub tp_group: GroupKey,
    pub batch_cap: u32,
    pub token_cap: u32,
}

/// A request on a group an `apply_plan` stops, and the group of the new
/// plan (in the agent's numbering, over the same devices) its TP switch
/// moves it to: the control loop's decision (`ControlLoop::window`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanMove {
    pub id: u64,
    pub tp_group: GroupKey,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ClientMsg {
    Submit {
        id: u64,
        tier: String,
        input_ids: Vec<u32>,
        sampling: Sampling,
        #[serde(with = "class_name")]
        class: DispatchClass,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        group: Option<GroupKey>,
        /// Seconds from its arrival at the agent by which the request must
        /// start prefilling to meet its TTFT (none: no deadline); past it
        /// the worker sheds it (`slo_unattainable`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        start_within_s: Option<f64>,
    },
    Cancel {
        id: u64,
    },
    /// Moves a prefilled request (its KV) to `group`, a TP group of the same
    /// agent in its own device numbering: the control loop's decision. The
    /// agent answers `handed_off`; the request's stream goes on either way.
    HandOff {
        id: u64,
        group: GroupKey,
    },
    ApplyPlan {
        plan_id: u64,
        devices: Vec<DevicePlan>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        moves: Vec<PlanMove>,
    },
    Stats,
    Ping,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenItem {
    pub id: u64,
    pub tokens: Vec<u32>,
    pub finished: bool,
    #[serde(default)]
    pub finish_reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanApplied {
    pub plan_id: u64,
    pub ok: bool,
    #[serde(default)]
    pub reason: Option<String>,
    #[serde(default)]
    pub switch_ms: f64,
}

/// Lenient: an agent reports nil for what it does not know (no plan yet,
/// no KV limit configured).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceStats {
    pub device: u32,
    #[serde(default)]
    pub role: Option<String>,
    #[serde(default)]
    pub tier: Option<String>,
    #[serde(default)]
    pub tp_group: Option<GroupKey>,
    #[serde(default)]
    pub running: u32,
    #[serde(default)]
    pub waiting: u32,
    #[serde(default)]
    pub kv_used_tokens: Option<u64>,
    #[serde(default)]
    pub kv_capacity_tokens: Option<u64>,
    /// The device's execution process: `device_states::READY`, `STARTING`
    /// or `DEAD`; an agent that does not say is taken to be ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
}

impl DeviceStats {
    /// Whether requests placed on this device can run now.
    pub fn is_ready(&self) -> bool {
        self.state.as_deref().is_none_or(|s| s == device_states::READY)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatsReply {
    pub devices: Vec<DeviceStats>,
    #[serde(default)]
    pub plan_id: Option<u64>,
    /// The model's context length: the most tokens (prompt + completion)
    /// one request may hold. The gateway refuses longer requests itself, as
    /// vLLM does; an agent that does not say leaves them to its own check.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_model_len: Option<u32>,
}

/// Why an agent did not make a hand-off it was told to make; the request
/// keeps decoding where it was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HandOffFailure {
    /// The group is not one of the agent's active groups (e.g. the agent
    /// runs another plan).
    UnknownGroup,
    /// The source or destination group's process is not ready or cannot
    /// take part in KV moves.
    GroupNotReady,
    /// The request is not running there: finished, cancelled, not started
    /// on a process yet, or moved meanwhile.
    NotRunning,
    /// The KV move failed and was rolled back.
    MoveFailed,
}

impl HandOffFailure {
    pub fn name(self) -> &'static str {
        match self {
            HandOffFailure::UnknownGroup => "unknown_group",
            HandOffFailure::GroupNotReady => "group_not_ready",
            HandOffFailure::NotRunning => "not_running",
            HandOffFailure::MoveFailed => "move_failed",
        }
    }
}

/// The answer to a `hand_off`: `code` and `message` say why when not `ok`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HandedOff {
    pub id: u64,
    pub group: GroupKey,
    pub ok: bool,
    #[serde(default)]
    pub code: Option<HandOffFailure>,
    #[serde(default)]
    pub message: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum AgentMsg {
    Tokens {
        items: Vec<TokenItem>,
    },
    Error {
        #[serde(default)]
        id: Option<u64>,
        code: String,
        message: String,
    },
    PlanApplied(PlanApplied),
    HandedOff(HandedOff),
    Stats(StatsReply),
    Pong,
}

/// Error codes of the `error` message.
pub mod codes {
    pub const WORKER_DIED: &str = "worker_died";
    pub const CANCELLED: &str = "cancelled";
    pub const BAD_REQUEST: &str = "bad_request";
    pub const OVERLOADED: &str = "overloaded";
    /// Shed by the worker: it could not start before its TTFT deadline.
    pub const SLO_UNATTAINABLE: &str = "slo_unattainable";
    pub const INTERNAL: &str = "internal";
}

/// Values of `stats.devices[].state`.
pub mod device_states {
    pub const READY: &str = "ready";
    pub const STARTING: &str = "starting";
    pub const DEAD: &str = "dead";
}

/// A dispatch class on the wire: its name (`DispatchClass::name`).
mod class_name {
    use serde::de::Error;
    use serde::{Deserialize, Deserializer, Serializer};
    use tiertp_scheduler::dispatcher::DispatchClass;

    pub fn serialize<S: Serializer>(class: &DispatchClass, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(class.name())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<DispatchClass, D::Error> {
        DispatchClass::parse(&String::deserialize(d)?).map_err(D::Error::custom)
    }
}

/// Encodes a message as a msgpack map (field names, as the Python side reads them).
pub fn encode<T: Serialize>(msg: &T) -> Vec<u8> {
    rmp_serde::to_vec_named(msg).expect("protocol messages always serialize")
}

pub fn decode<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, rmp_serde::decode::Error> {
    rmp_serde::from_slice(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_as_tagged_maps() {
        let m = ClientMsg::Submit {
            id: 7,
            tier: "chat".into(),
            input_ids: vec![1, 2],
            sampling: Sampling {
                max_tokens: 4,
                temperature: 0.0,
                top_p: 1.0,
                seed: None,
                stop_token_ids: vec![0],
            },
            class: DispatchClass::BestEffort,
            group: Some((0, 1)),
            start_within_s: Some(0.25),
        };
        assert_eq!(decode::<ClientMsg>(&encode(&m)).unwrap(), m);
        // The class travels as its name; an unknown one is refused, naming the valid ones.
        let mut wire: serde_json::Value = rmp_serde::from_slice(&encode(&m)).unwrap();
        assert_eq!(wire["class"], "best_effort");
        wire["class"] = "vip".into();
        let e = decode::<ClientMsg>(&encode(&wire)).unwrap_err().to_string();
        assert!(e.contains("vip") && e.contains("best_effort"), "{e}");
        let m = ClientMsg::HandOff { id: 7, group: (2, 2) };
        assert_eq!(decode::<ClientMsg>(&encode(&m)).unwrap(), m);
        // A plan's moves: a list of {id, tp_group} maps (what `parse_apply_plan` reads), left out when empty.
        let m = ClientMsg::ApplyPlan {
            plan_id: 4,
            devices: Vec::new(),
            moves: vec![PlanMove { id: 7, tp_group: (0, 2) }],
        };
        assert_eq!(decode::<ClientMsg>(&encode(&m)).unwrap(), m);
        let wire: serde_json::Value = rmp_serde::from_slice(&encode(&m)).unwrap();
        assert_eq!(wire["moves"], serde_json::json!([{"id": 7, "tp_group": [0, 2]}]));
        let none = ClientMsg::ApplyPlan {
            plan_id: 4,
            devices: Vec::new(),
            moves: Vec::new(),
        };
        let wire: serde_json::Value = rmp_serde::from_slice(&encode(&none)).unwrap();
        assert!(wire.get("moves").is_none(), "{wire}");
        for m in [
            AgentMsg::Pong,
            AgentMsg::PlanApplied(PlanApplied {
                plan_id: 3,
                ok: true,
                reason: None,
                switch_ms: 1.5,
            }),
        ] {
            assert_eq!(decode::<AgentMsg>(&encode(&m)).unwrap(), m);
        }
        // What a Python agent sends: nil fields, optional keys left out, lists for pairs.
        let stats = serde_json::json!({"type": "stats", "plan_id": 3, "devices": [{"device": 0, "role": "colocated", "tier": "chat",
            "tp_group": [0, 1], "running": 1, "waiting": 0, "kv_used_tokens": 5, "kv_capacity_tokens": null}]});
        let AgentMsg::Stats(s) = decode::<AgentMsg>(&encode(&stats)).unwrap() else {
            panic!()
        };
        assert_eq!((s.devices[0].tp_group, s.devices[0].kv_capacity_tokens), (Some((0, 1)), None));
        assert_eq!(s.max_model_len, None);
        let with_len = serde_json::json!({"type": "stats", "plan_id": null, "devices": [], "max_model_len": 4096});
        let AgentMsg::Stats(reported) = decode::<AgentMsg>(&encode(&with_len)).unwrap() else {
            panic!()
        };
        assert_eq!(reported.max_model_len, Some(4096));
        // No `state`: ready; a dead or starting process is not.
        assert!(s.devices[0].is_ready());
        for (state, ready) in [("ready", true), ("starting", false), ("dead", false)] {
            let m = serde_json::json!({"type": "stats", "plan_id": null, "devices": [{"device": 0, "state": state}]});
            let AgentMsg::Stats(s) = decode::<AgentMsg>(&encode(&m)).unwrap() else {
                panic!()
            };
            assert_eq!(s.devices[0].is_ready(), ready, "{state}");
        }
        // What a Python agent answers to a hand-off it could not make.
        let failed = serde_json::json!({"type": "handed_off", "id": 7, "group": [2, 2], "ok": false, "code": "unknown_group",
            "message": "group [2, 2] is not active here"});
        let AgentMsg::HandedOff(h) = decode::<AgentMsg>(&encode(&failed)).unwrap() else {
            panic!()
        };
        assert_eq!((h.ok, h.code, h.group), (false, Some(HandOffFailure::UnknownGroup), (2, 2)));
        let done = serde_json::json!({"type": "handed_off", "id": 7, "group": [2, 2], "ok": true, "code": null, "message": null});
        assert!(matches!(
            decode::<AgentMsg>(&encode(&done)).unwrap(),
            AgentMsg::HandedOff(HandedOff { ok: true, code: None, .. })
        ));
        let tokens = serde_json::json!({"type": "tokens", "items": [{"id": 1, "tokens": [5], "finished": false}]});
        assert!(matches!(decode::<AgentMsg>(&encode(&tokens)).unwrap(), AgentMsg::Tokens { .. }));
        // The map carries "type", as the Python agent expects.
        let v: rmp_serde::decode::Error = decode::<ClientMsg>(&encode(&serde_json::json!({"type": "nope"}))).unwrap_err();
        assert!(v.to_string().contains("nope"), "{v}");
    }
}
