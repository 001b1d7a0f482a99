//! What the control loop observes per tier: arrival rate, how it varies
//! across windows, and mean lengths over a sliding horizon of recent windows.

use std::collections::VecDeque;

use crate::prompt_lengths::PromptLengths;
use crate::rate_shape::{self, RateShape};
use crate::tiers::TierId;

/// Per-tier load the estimator plans for.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TierStats {
    /// Requests per second.
    pub arrival_rate: f64,
    pub mean_prompt_tokens: f64,
    pub mean_output_tokens: f64,
    /// Mean output length of the requests a decode batch holds at a random
    /// step, E[o²]/E[o]: a request stays one step per output token, so the
    /// long outputs are over-represented (`mean_output_tokens` when all are
    /// alike). With outputs of CV 1 it is twice the mean, and a batch sized
    /// for the mean's context ran its steps past the TPOT.
    pub resident_output_tokens: f64,
    /// How the rate varies across control windows (steady unless observed).
    pub rate_shape: RateShape,
    /// How prompt lengths spread around the mean (all at the mean unless
    /// observed).
    pub prompt_lengths: PromptLengths,
    /// Mean prompt of the tier's recently prefilled requests, the ones its
    /// decode groups hold (None until enough were seen). Under overload
    /// they are not the arrivals: a prefill group's token budget lets short
    /// prompts in where a long one does not fit, and the rest are shed.
    pub prefilled_prompt_tokens: Option<f64>,
    /// Requests per second over the observer's memory, or since the tier's
    /// first arrival when that is more recent: the demand that a burst in
    /// `arrival_rate` rides on and falls back to.
    pub sustained_rate: f64,
    /// How long the tier's bursts last, in seconds: the mean run of
    /// consecutive windows busier than the memory's mean
    /// (`rate_shape::mean_burst_windows`). Infinite until enough windows
    /// were seen: a reading is then taken to persist.
    pub burst_s: f64,
}

impl TierStats {
    /// Stats of a steady tier.
    pub fn new(arrival_rate: f64, mean_prompt_tokens: f64, mean_output_tokens: f64) -> Self {
        Self {
            arrival_rate,
            mean_prompt_tokens,
            mean_output_tokens,
            resident_output_tokens: mean_output_tokens,
            rate_shape: RateShape::steady(),
            prompt_lengths: PromptLengths::all(mean_prompt_tokens),
            prefilled_prompt_tokens: None,
            sustained_rate: arrival_rate,
            burst_s: f64::INFINITY,
        }
    }

    pub fn with_rate_shape(self, rate_shape: RateShape) -> Self {
        Self { rate_shape, ..self }
    }

    pub fn with_prompt_lengths(self, prompt_lengths: PromptLengths) -> Self {
        Self { prompt_lengths, ..self }
    }

    pub fn with_resident_output_tokens(self, resident_output_tokens: f64) -> Self {
        Self {
            resident_output_tokens,
            ..self
        }
    }

    /// Mean context (prompt plus tokens generated so far) of a decode
    /// batch's requests, for prompts of `prompt_tokens`.
    pub fn decode_context_tokens(&self, prompt_tokens: f64) -> f64 {
        prompt_tokens + self.resident_output_tokens / 2.0
    }

    pub fn with_prefilled_prompt_tokens(self, prefilled_prompt_tokens: Option<f64>) -> Self {
        Self {
            prefilled_prompt_tokens,
            ..self
        }
    }

    /// The same tier with its burst and the rate it falls back to.
    pub fn with_sustained(self, sustained_rate: f64, burst_s: f64) -> Self {
        Self {
            sustained_rate,
            burst_s,
            ..self
        }
    }

    /// The rate expected on average over the next `horizon_s`: the part of
    /// `arrival_rate` above `sustained_rate` lasts `burst_s`, then the tier
    /// falls back. A plan change pays only for what outlasts its switch;
    /// judged at a burst's peak, a layout built for the burst is committed
    /// and switched back when it ends, evicting running decodes each time.
    pub fn rate_over(&self, horizon_s: f64) -> f64 {
        let burst = (self.arrival_rate - self.sustained_rate).max(0.0);
        if burst <= 0.0 || horizon_s <= 0.0 || self.burst_s >= horizon_s {
            return self.arrival_rate;
        }
        self.arrival_rate - burst * (1.0 - self.burst_s / horizon_s)
    }

    /// Requests per second a capacity of `capacity_rps` serves of this
    /// tier's demand scaled by `scale` (see `rate_shape`).
    pub fn served(&self, scale: f64, capacity_rps: f64) -> f64 {
        self.rate_shape.served(self.arrival_rate * scale, capacity_rps)
    }

    /// `served` when only `share` of the requests can be served at all
    /// (the rest have prompts too long for the plan's groups): the
    /// servable part's rate is share·Λ, so E[min(share·Λ, c)] =
    /// share·E[min(Λ, c/share)].
    pub fn served_within(&self, scale: f64, capacity_rps: f64, share: f64) -> f64 {
        if share >= 1.0 {
            return self.served(scale, capacity_rps);
        }
        if share <= 0.0 {
            return 0.0;
        }
        share * self.served(scale, capacity_rps / share)
    }

    /// The least capacity that serves `target_rps` when only `share` of the
    /// requests can be served (the inverse of `served_within` at scale 1).
    pub fn capacity_within(&self, target_rps: f64, share: f64) -> f64 {
        let share = share.clamp(f64::MIN_POSITIVE, 1.0);
        share * self.rate_shape.capacity_for(self.arrival_rate, target_rps / share)
    }

    /// Checks the numbers are usable; the message names the field.
    pub fn validate(&self) -> Result<(), String> {
        for (field, v, min) in [
            ("arrival_rate", self.arrival_rate, 0.0),
            ("mean_prompt_tokens", self.mean_prompt_tokens, 1.0),
            ("mean_output_tokens", self.mean_output_tokens, 1.0),
            ("sustained_rate", self.sustained_rate, 0.0),
        ] {
            if !v.is_finite() || v < min {
                return Err(format!("{field} = {v}: must be a finite number >= {min}"));
            }
        }
        if self.burst_s.is_nan() || self.burst_s <= 0.0 {
            return Err(format!("burst_s = {}: must be > 0 (infinite: bursts persist)", self.burst_s));
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy)]
struct Arrival {
    time_s: f64,
    prompt_tokens: u32,
    output_tokens: u32,
}

/// Fewest recent requests whose lengths a tier's mean lengths average.
/// Lengths are heavy-tailed (a coefficient of variation of 2 is common for
/// prompts): the mean of the 30 requests a 1 req/s tier has in its memory is
/// off by a third either way from one window to the next, and the plan
/// chased that noise. 256 samples keep it within about an eighth, and a
/// busy tier's memory holds more than that anyway.
pub const MIN_LENGTH_SAMPLES: usize = 256;

/// Fewest prefilled requests whose mean prompt stands for a tier's decode
/// population (`TierStats::prefilled_prompt_tokens`).
pub const MIN_PREFILLED_SAMPLES: usize = 64;

/// Records arrivals and summarises them per tier. The rate is the larger of
/// the rate over the last `horizon_s` (reacts to a burst within a window or
/// two) and over the last `memory_s` (so a bursty tier that pauses for a few
/// seconds keeps its GPUs); the rate's shape and how long its bursts last
/// come from the longer span: the arrival counts of the full `window_s`
/// windows since the tier's oldest remembered arrival. Mean lengths come from the memory's arrivals or, when
/// it holds fewer, the last `MIN_LENGTH_SAMPLES` arrivals, however old.
/// Tiers that have seen nothing report rate 0 and the prior lengths.
#[derive(Debug, Clone)]
pub struct ArrivalObserver {
    horizon_s: f64,
    memory_s: f64,
    window_s: f64,
    prior: TierStats,
    per_tier: Vec<VecDeque<Arrival>>,
    /// Per tier, the (prompt, output) lengths of its last
    /// `MIN_LENGTH_SAMPLES` arrivals.
    recent_lengths: Vec<VecDeque<(u32, u32)>>,
    /// Per tier, (time, prompt length) of its prefilled requests: those in
    /// the memory, and at least the last `MIN_LENGTH_SAMPLES`.
    prefilled: Vec<VecDeque<(f64, u32)>>,
    /// Per tier, the time of its first arrival.
    first_seen: Vec<Option<f64>>,
}

impl ArrivalObserver {
    /// `prior` supplies the lengths used for a tier that has seen nothing
    /// yet; `memory_s` below `horizon_s` is raised to it (no memory).
    pub fn new(num_tiers: usize, horizon_s: f64, memory_s: f64, window_s: f64, prior: TierStats) -> Self {
        assert!(horizon_s > 0.0, "horizon must be positive");
        assert!(window_s > 0.0, "window must be positive");
        Self {
            horizon_s,
            memory_s: memory_s.max(horizon_s),
            window_s,
            prior,
            per_tier: vec![VecDeque::new(); num_tiers],
            recent_lengths: vec![VecDeque::new(); num_tiers],
            prefilled: vec![VecDeque::new(); num_tiers],
            first_seen: vec![None; num_tiers],
        }
    }

    /// A request of `tier` finished its prefill at `time_s` and goes to
    /// decode.
    pub fn record_prefilled(&mut self, tier: TierId, time_s: f64, prompt_tokens: u32) {
        self.prefilled[tier].push_back((time_s, prompt_tokens));
    }

    /// `prefilled_prompt_tokens` of each tier at `now_s`, over the same
    /// span as the mean lengths (the memory, or the last
    /// `MIN_LENGTH_SAMPLES` when it holds fewer); older ones are dropped.
    fn prefilled_means(&mut self, now_s: f64) -> Vec<Option<f64>> {
        let cutoff = now_s - self.memory_s;
        self.prefilled
            .iter_mut()
            .map(|q| {
                while q.len() > MIN_LENGTH_SAMPLES && q.front().is_some_and(|&(t, _)| t <= cutoff) {
                    q.pop_front();
                }
                (q.len() >= MIN_PREFILLED_SAMPLES).then(|| (q.iter().map(|&(_, p)| f64::from(p)).sum::<f64>() / q.len() as f64).max(1.0))
            })
            .collect()
    }

    pub fn record(&mut self, tier: TierId, time_s: f64, prompt_tokens: u32, output_tokens: u32) {
        self.first_seen[tier].get_or_insert(time_s);
        self.per_tier[tier].push_back(Arrival {
            time_s,
            prompt_tokens,
            output_tokens,
        });
        let lengths = &mut self.recent_lengths[tier];
        if lengths.len() == MIN_LENGTH_SAMPLES {
            lengths.pop_front();
        }
        lengths.push_back((prompt_tokens, output_tokens));
    }

    /// Stats at `now`; arrivals older than the memory are dropped.
    pub fn snapshot(&mut self, now_s: f64) -> Vec<TierStats> {
        let cutoff = now_s - self.memory_s;
        let (horizon, memory, window, prior) = (self.horizon_s, self.memory_s, self.window_s, self.prior);
        let prefilled = self.prefilled_means(now_s);
        self.per_tier
            .iter_mut()
            .zip(&self.recent_lengths)
            .zip(prefilled)
            .zip(&self.first_seen)
            .map(|(((q, lengths), prefilled_prompt_tokens), first_seen)| {
                while q.front().is_some_and(|a| a.time_s <= cutoff) {
                    q.pop_front();
                }
                let sample: Vec<(u32, u32)> = if q.len() >= lengths.len() {
                    q.iter().map(|a| (a.prompt_tokens, a.output_tokens)).collect()
                } else {
                    lengths.iter().copied().collect()
                };
                let (mean_prompt_tokens, mean_output_tokens, resident_output_tokens) =
                    mean_lengths(&sample).unwrap_or((prior.mean_prompt_tokens, prior.mean_output_tokens, prior.resident_output_tokens));
                let prompt_lengths = PromptLengths::from_samples(sample.iter().map(|&(p, _)| p)).unwrap_or(prior.prompt_lengths);
                if q.is_empty() {
                    return TierStats {
                        arrival_rate: 0.0,
                        mean_prompt_tokens,
                        mean_output_tokens,
                        resident_output_tokens,
                        rate_shape: prior.rate_shape,
                        prompt_lengths,
                        prefilled_prompt_tokens,
                        sustained_rate: 0.0,
                        burst_s: f64::INFINITY,
                    };
                }
                let n = q.len() as f64;
                let recent = q.iter().rev().take_while(|a| a.time_s > now_s - horizon).count() as f64;
                let seen_for = (now_s - first_seen.unwrap_or(now_s)).clamp(horizon, memory);
                let counts = window_counts(q, now_s, window);
                TierStats {
                    arrival_rate: (recent / horizon).max(n / memory),
                    mean_prompt_tokens,
                    mean_output_tokens,
                    resident_output_tokens,
                    rate_shape: RateShape::from_counts(&counts),
                    prompt_lengths,
                    prefilled_prompt_tokens,
                    sustained_rate: n / seen_for,
                    burst_s: rate_shape::mean_burst_windows(&counts).map_or(f64::INFINITY, |w| w * window),
                }
            })
            .collect()
    }
}

/// Mean (prompt, output) lengths, each at least 1, and the resident output
/// E[o²]/E[o] (`TierStats::resident_output_tokens`); None when empty.
fn mean_lengths(lengths: &[(u32, u32)]) -> Option<(f64, f64, f64)> {
    let (mut n, mut prompt, mut output, mut output_sq) = (0.0, 0.0, 0.0, 0.0);
    for &(p, o) in lengths {
        n += 1.0;
        prompt += f64::from(p);
        output += f64::from(o);
        output_sq += f64::from(o) * f64::from(o);
    }
    (n > 0.0).then(|| {
        let mean_output = (output / n).max(1.0);
        (
            (prompt / n).max(1.0),
            mean_output,
            resident_output_tokens(output, output_sq, mean_output),
        )
    })
}

/// E[o²]/E[o] from the sum of the outputs and of their squares, at least
/// their mean `mean_output` (`TierStats::resident_output_tokens`).
pub fn resident_output_tokens(sum: f64, sum_of_squares: f64, mean_output: f64) -> f64 {
    if sum > 0.0 {
        (sum_of_squares / sum).max(mean_output)
    } else {
        mean_output
    }
}

/// Arrivals per full window, from the window of the oldest arrival in `q`
/// to the last one that ended by `now_s` (the one in progress is partial).
fn window_counts(q: &VecDeque<Arrival>, now_s: f64, window_s: f64) -> Vec<f64> {
    let Some(first) = q.front() else { return Vec::new() };
    let start = (first.time_s / window_s).floor();
    let end = (now_s / window_s).floor();
    let n = (end - start).max(0.0) as usize;
    let mut counts = vec![0.0; n];
    for a in q {
        let k = ((a.time_s / window_s).floor() - start) as usize;
        if k < n {
            counts[k] += 1.0;
        }
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_and_means_over_the_horizon() {
        let mut o = ArrivalObserver::new(2, 2.0, 2.0, 1.0, TierStats::new(0.0, 512.0, 128.0));
        o.record(0, 0.5, 100, 10);
        o.record(0, 1.5, 300, 30);
        o.record(0, 2.5, 200, 20);
        let s = o.snapshot(3.0);
        // The rate over the 2 s memory; the lengths over every arrival seen,
        // fewer than `MIN_LENGTH_SAMPLES`.
        assert_eq!(s[0].arrival_rate, 1.0);
        assert_eq!((s[0].mean_prompt_tokens, s[0].mean_output_tokens), (200.0, 20.0));
        assert!(s[0].rate_shape.is_steady(), "too few windows for a shape");
        assert_eq!(
            s[0].prompt_lengths,
            PromptLengths::from_samples([100, 300, 200].into_iter()).unwrap()
        );
        assert_eq!(s[1], TierStats::new(0.0, 512.0, 128.0));
    }

    #[test]
    fn prefilled_prompts_are_averaged_once_enough_were_seen() {
        let mut o = ArrivalObserver::new(1, 2.0, 10.0, 1.0, TierStats::new(0.0, 512.0, 128.0));
        for k in 0..(MIN_PREFILLED_SAMPLES as u32 - 1) {
            o.record_prefilled(0, 0.0, 100 + k);
        }
        assert_eq!(o.snapshot(1.0)[0].prefilled_prompt_tokens, None, "too few to stand for the tier");
        o.record_prefilled(0, 0.0, 100 + MIN_PREFILLED_SAMPLES as u32 - 1);
        let mean = 100.0 + (MIN_PREFILLED_SAMPLES as f64 - 1.0) / 2.0;
        assert_eq!(o.snapshot(1.0)[0].prefilled_prompt_tokens, Some(mean));
        // Past the memory, the last MIN_LENGTH_SAMPLES still count; within
        // it, all of them.
        for k in 0..400 {
            o.record_prefilled(0, 100.0 + f64::from(k) / 100.0, if k < 200 { 1000 } else { 3000 });
        }
        assert_eq!(o.snapshot(104.0)[0].prefilled_prompt_tokens, Some(2000.0));
        assert_eq!(
            o.snapshot(200.0)[0].prefilled_prompt_tokens,
            Some((56.0 * 1000.0 + 200.0 * 3000.0) / 256.0)
        );
    }

    #[test]
    fn a_decode_batch_holds_the_long_outputs_longer() {
        let mut o = ArrivalObserver::new(1, 2.0, 10.0, 1.0, TierStats::new(0.0, 512.0, 128.0));
        assert_eq!(o.snapshot(0.0)[0].resident_output_tokens, 128.0, "the prior's, all alike");
        // Half the outputs 100 tokens, half 900: mean 500, but a batch at a
        // random step holds a 900-token one nine times as often.
        for k in 0..100 {
            o.record(0, 1.0, 10, if k % 2 == 0 { 100 } else { 900 });
        }
        let s = o.snapshot(1.0)[0];
        assert_eq!(s.mean_output_tokens, 500.0);
        assert_eq!(s.resident_output_tokens, (100.0 * 100.0 + 900.0 * 900.0) / 1000.0);
        assert_eq!(s.decode_context_tokens(10.0), 10.0 + 820.0 / 2.0);
    }

    #[test]
    fn lengths_outlast_the_rate_memory_of_a_slow_tier() {
        let mut o = ArrivalObserver::new(1, 2.0, 10.0, 1.0, TierStats::new(0.0, 512.0, 128.0));
        for k in 0..300u32 {
            o.record(0, f64::from(k), 1000 + k, 10);
        }
        let s = o.snapshot(300.0)[0];
        // Nine arrivals in the 10 s memory, but the last 256 set the lengths.
        assert_eq!(s.arrival_rate, 0.9);
        assert_eq!(s.mean_prompt_tokens, 1000.0 + (44.0 + 299.0) / 2.0);
        // Idle past its memory, the tier keeps what it was seen to send.
        let idle = o.snapshot(400.0)[0];
        assert_eq!((idle.arrival_rate, idle.mean_prompt_tokens), (0.0, s.mean_prompt_tokens));
    }

    #[test]
    fn memory_keeps_a_paused_burst_visible() {
        let mut o = ArrivalObserver::new(1, 2.0, 10.0, 1.0, TierStats::new(0.0, 512.0, 128.0));
        for k in 0..40 {
            o.record(0, 1.0 + f64::from(k) * 0.025, 100, 10);
        }
        // A burst of 40 in one second: the short horizon sees 20/s.
        assert_eq!(o.snapshot(2.0)[0].arrival_rate, 20.0);
        // Five seconds of silence: the short horizon sees nothing, the
        // 10-second memory still 4/s.
        assert_eq!(o.snapshot(7.0)[0].arrival_rate, 4.0);
        // Past the memory the tier is idle.
        assert_eq!(o.snapshot(12.0)[0].arrival_rate, 0.0);
    }

    #[test]
    fn shape_of_steady_and_bursty_tiers() {
        let prior = TierStats::new(0.0, 512.0, 128.0);
        let mut o = ArrivalObserver::new(2, 2.0, 30.0, 1.0, prior);
        for k in 0..200 {
            // Tier 0: 10/s, evenly spread.
            o.record(0, f64::from(k) * 0.1, 100, 10);
        }
        for w in 0..20 {
            // Tier 1: 20 arrivals in every fifth window, none in between.
            if w % 5 == 0 {
                for k in 0..20 {
                    o.record(1, f64::from(w) + f64::from(k) * 0.01, 100, 10);
                }
            }
        }
        let s = o.snapshot(20.0);
        assert!(s[0].rate_shape.is_steady(), "{:?}", s[0].rate_shape);
        assert!(s[1].rate_shape.cv() > 1.5, "{:?}", s[1].rate_shape);
        // At its mean rate the bursty tier is served a fraction of it.
        let mean = s[1].arrival_rate;
        assert!(s[1].served(1.0, mean) < 0.5 * mean);
    }

    #[test]
    fn a_burst_is_read_with_the_rate_it_falls_back_to_and_how_long_it_lasts() {
        let mut o = ArrivalObserver::new(1, 2.0, 30.0, 1.0, TierStats::new(0.0, 512.0, 128.0));
        // 2/s for 20 s, with one burst of 40 in the last window.
        for k in 0..40 {
            o.record(0, f64::from(k) * 0.5, 100, 10);
        }
        for k in 0..40 {
            o.record(0, 19.0 + f64::from(k) * 0.025, 100, 10);
        }
        let s = o.snapshot(20.0)[0];
        assert_eq!(s.arrival_rate, 21.5, "the short horizon's 43 in 2 s");
        // 80 arrivals since the tier's first, 20 s ago (the memory is 30 s).
        assert_eq!(s.sustained_rate, 4.0);
        // One window of 42 above a mean of 4: bursts last a window.
        assert_eq!(s.burst_s, 1.0);
        // Over a 10 s horizon the burst's 17.5/s above the sustained rate
        // counts for one second of ten.
        assert!((s.rate_over(10.0) - 5.75).abs() < 1e-9, "{}", s.rate_over(10.0));
    }

    #[test]
    fn a_reading_persists_until_bursts_were_seen() {
        let mut o = ArrivalObserver::new(1, 2.0, 30.0, 1.0, TierStats::new(0.0, 512.0, 128.0));
        for k in 0..20 {
            o.record(0, 2.0 + f64::from(k) * 0.05, 100, 10);
        }
        // Three windows seen, fewer than a rate shape needs.
        let s = o.snapshot(3.0)[0];
        assert_eq!(s.burst_s, f64::INFINITY);
        assert_eq!(s.rate_over(10.0), s.arrival_rate);
        // A tier read as steady keeps its rate whatever the horizon.
        assert_eq!(TierStats::new(7.0, 100.0, 10.0).rate_over(10.0), 7.0);
    }
}
