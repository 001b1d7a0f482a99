//! A plan: which GPUs serve which tier, in which role, at which TP level.

use std::fmt;

use crate::tiers::TierId;

/// What a TP group does for its tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Role {
    Prefill,
    Decode,
    /// Prefill and decode on the same group (chunked prefill).
    Colocated,
}

impl Role {
    /// Every role, in the spelling used by configs, bindings and JSON.
    pub const ALL: [Role; 3] = [Role::Prefill, Role::Decode, Role::Colocated];

    pub fn name(self) -> &'static str {
        match self {
            Role::Prefill => "prefill",
            Role::Decode => "decode",
            Role::Colocated => "colocated",
        }
    }

    pub fn parse(name: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|r| r.name() == name)
            .ok_or_else(|| format!("unknown role {name:?}; valid roles: {:?}", Self::ALL.map(Role::name)))
    }

    /// Whether new requests (their prefill) can be dispatched here.
    pub fn takes_prefill(self) -> bool {
        matches!(self, Role::Prefill | Role::Colocated)
    }

    /// Whether prefilled requests decode here.
    pub fn decodes(self) -> bool {
        matches!(self, Role::Decode | Role::Colocated)
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A TP group's identity across plans and processes: (first GPU, TP size).
pub type GroupKey = (u32, u32);

/// One TP group of a plan.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GroupPlan {
    pub tier: TierId,
    pub role: Role,
    pub tp: u32,
    pub first_gpu: u32,
    /// SLO-compliant requests per second this group contributes.
    pub capacity_rps: f64,
    /// Most requests per batch (prefill: prompts; decode/colocated: running).
    pub batch_cap: u32,
    /// Most prompt tokens per iteration (prefill batch or colocated chunk);
    /// 0 for decode groups.
    pub token_cap: u32,
    /// In-flight work the group can hold and still meet its SLO, in the
    /// dispatcher's units (prompt tokens for prefill and colocated groups,
    /// running requests for decode groups).
    pub slo_budget: u64,
    /// Longest prompt the group takes (prefill and colocated groups): one it
    /// cannot prefill within the TTFT even alone is shed, not run late in
    /// front of prompts that can; 0: any.
    pub max_prompt_tokens: u32,
    /// Share of its tier's prompts the group serves in time (1 for decode
    /// groups and where the whole tier fits).
    pub served_share: f64,
}

impl GroupPlan {
    pub fn key(&self) -> GroupKey {
        (self.first_gpu, self.tp)
    }

    pub fn gpus(&self) -> std::ops::Range<u32> {
        self.first_gpu..self.first_gpu + self.tp
    }

    /// Identity of the group across plans: where it is and what it does.
    pub fn same_assignment(&self, other: &GroupPlan) -> bool {
        self.tier == other.tier && self.role == other.role && self.tp == other.tp && self.first_gpu == other.first_gpu
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub num_gpus: u32,
    /// Sorted by first GPU; every GPU is in exactly one group.
    pub groups: Vec<GroupPlan>,
    /// Planned SLO-compliant capacity per tier (requests/s).
    pub tier_capacity_rps: Vec<f64>,
    /// Per tier, the share of its prompts its groups can serve in time (the
    /// best of its prefill-capable groups'; `TierStats::served_within`).
    pub tier_served_share: Vec<f64>,
    /// Per tier, the tier whose groups its requests run on as a member of
    /// that tier's pool (`None`: its own groups, and those of the tiers
    /// that lend to it). The plan, not the tiers' weights, puts it there.
    pub pooled_on: Vec<Option<TierId>>,
}

impl Plan {
    /// The group each GPU belongs to.
    pub fn group_of_gpu(&self) -> Vec<Option<usize>> {
        let mut out = vec![None; self.num_gpus as usize];
        for (i, g) in self.groups.iter().enumerate() {
            for gpu in g.gpus() {
                out[gpu as usize] = Some(i);
            }
        }
        out
    }

    pub fn gpus_of_tier(&self, tier: TierId) -> u32 {
        self.groups.iter().filter(|g| g.tier == tier).map(|g| g.tp).sum()
    }
}

/// A per-GPU instruction emitted when a plan changes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GpuCommand {
    pub gpu: u32,
    pub tier: TierId,
    pub role: Role,
    pub tp: u32,
    /// First GPU of the TP group this GPU joins.
    pub group_first_gpu: u32,
    pub batch_cap: u32,
    pub token_cap: u32,
}
