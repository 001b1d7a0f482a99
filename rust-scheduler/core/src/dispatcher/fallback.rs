//! Where a node agent places a request when the gateway's placement cannot
//! be followed there: the submit names a group the node does not run (its
//! plan is not the gateway's, e.g. a TP switch was refused), or a plan
//! change stopped the group of a request still waiting at the agent and the
//! plan did not say where it goes.
//!
//! The rule is the dispatcher's: among the groups over the request's old
//! GPUs if any (its place stays where the plan put its GPUs), else all the
//! node runs, the request's tier's groups that prefill, then its decode
//! groups, then groups no plan has given a tier, then any; the least loaded
//! first (ties: the lowest group key).

use crate::plan::GroupKey;

/// A group a node runs, as the node sees it for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeGroup {
    pub key: GroupKey,
    /// Planned for the request's tier.
    pub its_tier: bool,
    /// Planned for no tier yet (a node's groups before its first plan).
    pub unplanned: bool,
    /// Decodes only: a new request starts where prefill runs.
    pub decode_only: bool,
    /// Requests in flight on it.
    pub load: u64,
}

impl NodeGroup {
    fn kind(&self) -> u8 {
        match (self.its_tier, self.decode_only, self.unplanned) {
            (true, false, _) => 0,
            (true, true, _) => 1,
            (false, _, true) => 2,
            (false, _, false) => 3,
        }
    }
}

/// The group for the request (see the module doc); `over`: the group it
/// was on, when a plan change stopped it. None when the node runs none.
pub fn fallback_group(groups: &[NodeGroup], over: Option<GroupKey>) -> Option<GroupKey> {
    let near = |g: &NodeGroup| over.is_some_and(|o| overlaps(g.key, o));
    let any_near = groups.iter().any(near);
    groups
        .iter()
        .filter(|g| !any_near || near(g))
        .min_by_key(|g| (g.kind(), g.load, g.key))
        .map(|g| g.key)
}

/// Whether two groups share a GPU.
pub fn overlaps(a: GroupKey, b: GroupKey) -> bool {
    a.0 < b.0 + b.1 && b.0 < a.0 + a.1
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(key: GroupKey, its_tier: bool, unplanned: bool, decode_only: bool, load: u64) -> NodeGroup {
        NodeGroup {
            key,
            its_tier,
            unplanned,
            decode_only,
            load,
        }
    }

    #[test]
    fn the_tiers_prefill_groups_come_first_then_its_decode_then_unplanned_then_any() {
        let groups = [
            g((0, 1), false, false, false, 0),
            g((1, 1), false, true, false, 5),
            g((2, 1), true, false, true, 9),
            g((3, 1), true, false, false, 7),
            g((4, 1), true, false, false, 3),
        ];
        assert_eq!(fallback_group(&groups, None), Some((4, 1)));
        assert_eq!(fallback_group(&groups[..3], None), Some((2, 1)));
        assert_eq!(fallback_group(&groups[..2], None), Some((1, 1)));
        assert_eq!(fallback_group(&groups[..1], None), Some((0, 1)));
        assert_eq!(fallback_group(&[], None), None);
    }

    #[test]
    fn a_stopped_groups_request_stays_over_its_gpus_and_ties_go_to_the_lowest_key() {
        let groups = [
            g((0, 1), false, true, false, 2),
            g((1, 1), false, true, false, 1),
            g((2, 2), true, false, false, 0),
        ];
        // Over GPUs 0-1 (its old TP2 group): the least loaded there, though
        // a group of its tier runs elsewhere.
        assert_eq!(fallback_group(&groups, Some((0, 2))), Some((1, 1)));
        // Nothing runs over GPU 7: any group, by the same order.
        assert_eq!(fallback_group(&groups, Some((7, 1))), Some((2, 2)));
        let tied = [g((3, 1), false, true, false, 1), g((1, 1), false, true, false, 1)];
        assert_eq!(fallback_group(&tied, None), Some((1, 1)));
    }
}
