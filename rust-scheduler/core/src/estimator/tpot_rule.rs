//! Which TPOT rule a tier's colocated groups are held to: every
//! iteration, or each request's mean step where nothing serves the tier
//! the first way.

use crate::profile::Profile;
use crate::tiers::Tier;

/// How a colocated group's chunked iterations are held to the TPOT.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum TpotRule {
    /// Every iteration, a chunk's included: no request's TPOT depends on
    /// how many chunks fall into its decode.
    EveryIteration,
    /// A request's TPOT is the mean of its steps, so an iteration that
    /// carries a chunk may run past it when the decode-only ones leave
    /// room: the mean step of a request of the tier's mean output that
    /// sees its share of chunk iterations, and at least one, must fit.
    /// Only for a tier that no group it can have (`estimator::room_gpus`)
    /// serves under `EveryIteration`: no colocated point at any TP level
    /// and no prefill + decode pair that fits that room. There a TPOT that
    /// one decode step nearly fills left the tier nothing where SGLang
    /// served it (14B on 8 H100 at half the paper's SLOs, chat at 100 ms /
    /// 5 ms: decode fits only at TP8, a 4.3 ms step, with no GPU left for
    /// a prefill group; 0.41 -> 3.35 req/s at 5 req/s, chat 0 -> 3.10). Not beside a group that does:
    /// nothing paces the chunks, so under overload they run back to back
    /// and every running request's TPOT breaks (14B on 8 H100, 1,000-token
    /// outputs at 30 req/s: 18.3 -> 16.1 req/s with it wherever a level
    /// had no colocated point), and at light load it moved plans off
    /// better ones (long prompts at 5 req/s: 4.56 -> 4.38).
    RequestMean,
}

/// What a tier's stages at one TP level can do on every iteration.
pub(super) struct Stages<D: Fn() -> bool> {
    pub prefill: bool,
    pub colocated: bool,
    /// Worked out only where a pair is looked for.
    pub decode: D,
}

/// Whether some group at one of `levels` meets the tier's SLOs on every
/// iteration: a colocated one, or a prefill + decode pair that fits in
/// `room_gpus` (`estimator::room_gpus`).
fn servable<D: Fn() -> bool>(levels: &[u32], stages_at: impl Fn(u32) -> Stages<D>, room_gpus: u32) -> bool {
    // Levels not planned are estimated here: stop at the first colocated
    // point.
    let mut stages: Vec<(u32, Stages<D>)> = Vec::with_capacity(levels.len());
    for &tp in levels {
        let s = stages_at(tp);
        if s.colocated {
            return true;
        }
        stages.push((tp, s));
    }
    let Some(smallest_prefill) = stages.iter().filter(|(_, s)| s.prefill).map(|&(tp, _)| tp).min() else {
        return false;
    };
    stages
        .iter()
        .filter(|&&(d, _)| u64::from(smallest_prefill) + u64::from(d) <= u64::from(room_gpus))
        .any(|(_, s)| (s.decode)())
}

/// The rule for a tier's colocated groups: `RequestMean` only where no
/// group at any power-of-two level of the profile that fits `room_gpus`
/// serves it step by step (`stages_at(tp)`: its stages there), judged over
/// all of them, not only the levels being planned: a static-TP plan or a
/// split partition plans one level, and a tier another level serves step
/// by step is not one that nothing serves (estimated on the mean at TP2,
/// split's 3-GPU chat partition of 8B on 4 A100 served 6.40 -> 4.54 req/s
/// at 20 req/s, where a TP1 pair serves it). A tier without a TPOT keeps
/// the first rule (it has none to break).
pub(super) fn colocated_rule<D: Fn() -> bool>(
    profile: &Profile,
    tier: &Tier,
    room_gpus: u32,
    stages_at: impl Fn(u32) -> Stages<D>,
) -> TpotRule {
    if tier.tpot_ms.is_none() {
        return TpotRule::EveryIteration;
    }
    let levels: Vec<u32> = profile
        .tp_levels()
        .into_iter()
        .filter(|tp| tp.is_power_of_two() && *tp <= room_gpus)
        .collect();
    if servable(&levels, stages_at, room_gpus) {
        TpotRule::EveryIteration
    } else {
        TpotRule::RequestMean
    }
}
