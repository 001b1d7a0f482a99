//! The fairness floor: goodput alone would give every GPU to the tier that
//! is cheapest to serve, so a tier with at least `FAIR_MIN_SHARE` of the
//! requests is owed a part of the goodput in proportion to its requests.
//!
//! Reports judge a run by `FAIR_MIN_GOODPUT_FRACTION` of that proportional
//! share; plans aim at `FAIR_PLANNED_FRACTION`, twice as much, since the
//! estimates of different tiers err differently (a tier of short prompts
//! admitted first under overload delivers above its estimate). The greedy
//! gives a tier short of the planned floor priority; the commit rule
//! replaces a current plan that leaves a tier far below
//! (`FAIR_REPLAN_FRACTION`) with a proposal that meets the plans' aim.

/// Tiers with a smaller share of the requests are exempt (too few requests
/// to judge).
pub const FAIR_MIN_SHARE: f64 = 0.10;
/// What reports require of each other tier, in proportional shares.
pub const FAIR_MIN_GOODPUT_FRACTION: f64 = 0.25;
/// What plans aim at.
pub const FAIR_PLANNED_FRACTION: f64 = 2.0 * FAIR_MIN_GOODPUT_FRACTION;
/// A running plan this far below gives way to a proposal that meets the
/// aim, and no proposal that leaves more tiers this far below is taken.
/// The wide band up to the aim is where estimate noise would otherwise flip
/// plans back and forth (a bursty tier's estimate errs low).
pub const FAIR_REPLAN_FRACTION: f64 = 0.5 * FAIR_MIN_GOODPUT_FRACTION;

/// Whether `tier` is planned below `fraction` of its proportional share,
/// given every tier's demand and planned served rate (req/s).
pub fn short_of_floor(tier: usize, fraction: f64, demand: &[f64], served: &[f64]) -> bool {
    below(fraction, demand[tier], served[tier], demand.iter().sum(), served.iter().sum())
}

/// `short_of_floor` for one tier's demand and served rate, given the totals
/// over all tiers.
pub fn below(fraction: f64, demand: f64, served: f64, total_demand: f64, total_served: f64) -> bool {
    if total_demand <= 0.0 {
        return false;
    }
    let share = demand / total_demand;
    share >= FAIR_MIN_SHARE && served < fraction * share * total_served - 1e-9
}

/// How many tiers are planned below `fraction` of their proportional share.
pub fn tiers_short(fraction: f64, demand: &[f64], served: &[f64]) -> usize {
    (0..demand.len()).filter(|&t| short_of_floor(t, fraction, demand, served)).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tier_is_owed_a_share_in_proportion_to_its_requests() {
        let planned = FAIR_PLANNED_FRACTION;
        // Equal demand; the second tier is planned 1 of 21 served.
        assert!(short_of_floor(1, planned, &[10.0, 10.0], &[20.0, 1.0]));
        assert!(!short_of_floor(0, planned, &[10.0, 10.0], &[20.0, 1.0]));
        // At 0.5x of its proportional share (5.25 of 10.5), it is not short.
        assert!(!short_of_floor(1, planned, &[10.0, 10.0], &[15.75, 5.25]));
        // At 0.3x it is short of the plan's aim, not of the judged floor.
        assert!(short_of_floor(1, planned, &[10.0, 10.0], &[16.8, 3.15]));
        assert!(!short_of_floor(1, FAIR_MIN_GOODPUT_FRACTION, &[10.0, 10.0], &[16.8, 3.15]));
        // A tier with under 10% of the requests is exempt.
        assert!(!short_of_floor(1, planned, &[95.0, 5.0], &[20.0, 0.0]));
        assert_eq!(tiers_short(planned, &[10.0, 10.0, 0.0], &[20.0, 1.0, 0.0]), 1);
    }
}
