//! One TP group as an engine: FCFS queues (the production `BatchPolicy`),
//! a running batch, KV capacity, and iterations timed from the profile.
//!
//! An iteration decodes one token for every running request that finished
//! its prompt (up to the batch cap) and prefills up to `token_cap` prompt
//! tokens (chunked prefill). Its time is decode_ms(batch, mean context) +
//! prefill_ms(chunk tokens, chunks): the estimator's colocated model.

use tiertp_scheduler::batch_policy::BatchPolicy;
use tiertp_scheduler::dispatcher::DispatchClass;
use tiertp_scheduler::plan::Role;
use tiertp_scheduler::profile::Profile;
use tiertp_scheduler::tiers::TierId;

use crate::request::{kv_reservation, Progress, TraceRequest};

/// What a group is: where, which role, for which tier (None = every tier),
/// and its batch caps.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GroupSpec {
    pub first_gpu: u32,
    pub tp: u32,
    pub role: Role,
    pub tier: Option<TierId>,
    pub batch_cap: u32,
    /// Prompt tokens per iteration (chunk size); 0: no limit, as in the
    /// worker (a decode group's: it prefills only what an earlier role of
    /// its GPUs left it).
    pub token_cap: u32,
}

impl GroupSpec {
    pub fn key(&self) -> (u32, u32) {
        (self.first_gpu, self.tp)
    }

    /// Same GPUs at the same TP: the group survives a plan change, its
    /// requests with it, whatever its new role and tier (in production the
    /// same process runs on, told only its new caps).
    pub fn same_place(&self, other: &GroupSpec) -> bool {
        self.key() == other.key()
    }

    /// Same place, role and tier: the same layout, whatever the caps.
    pub fn same_assignment(&self, other: &GroupSpec) -> bool {
        self.same_place(other) && self.role == other.role && self.tier == other.tier
    }
}

/// What finishing an iteration did to a request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Outcome {
    Finished(u32),
    /// Prompt done on a prefill group: the request needs a decode group.
    PrefillDone(u32),
    /// Prompt done on a group that keeps decoding it.
    FirstToken(u32),
}

#[derive(Debug)]
pub struct GroupSim {
    /// Unique for the whole simulation (events name groups by it).
    pub id: u64,
    pub spec: GroupSpec,
    pub queue: BatchPolicy,
    pub running: Vec<u32>,
    pub kv_capacity: u64,
    pub kv_used: u64,
    /// Prompt tokens still to prefill, over queued requests.
    pub queued_tokens: u64,
    pub busy: bool,
    pub busy_until: f64,
    pub iteration_start: f64,
    /// Paused (TP switch) until then.
    pub available_at: f64,
    pub wake_pending: bool,
    pub retiring: bool,
    decode_now: Vec<u32>,
    prefill_now: Vec<(u32, u32)>,
    /// Whether the last finished iteration prefilled any prompt tokens.
    prefilled_last: bool,
}

impl GroupSim {
    pub fn new(id: u64, spec: GroupSpec, kv_capacity: u64, available_at: f64) -> Self {
        Self {
            id,
            spec,
            // The group fills by its own token budget (chunking), so the
            // policy's token cap stays off here.
            queue: BatchPolicy::new(spec.batch_cap, 0),
            running: Vec::new(),
            kv_capacity,
            kv_used: 0,
            queued_tokens: 0,
            busy: false,
            busy_until: f64::NEG_INFINITY,
            iteration_start: 0.0,
            available_at,
            wake_pending: false,
            retiring: false,
            decode_now: Vec::new(),
            prefill_now: Vec::new(),
            prefilled_last: false,
        }
    }

    pub fn set_spec(&mut self, spec: GroupSpec) {
        self.spec = spec;
        self.queue.set_caps(spec.batch_cap, 0);
    }

    pub fn waiting(&self) -> usize {
        self.queue.len()
    }

    /// Whether the iteration that just ended prefilled any prompt tokens.
    pub fn prefilled_last_iteration(&self) -> bool {
        self.prefilled_last
    }

    /// Outstanding work in requests (queued + running): least-load routing.
    pub fn outstanding(&self) -> usize {
        self.queue.len() + self.running.len()
    }

    /// Queues a request; `deadline` is when it must start to meet its TTFT.
    pub fn enqueue(&mut self, i: u32, class: DispatchClass, deadline: f64, reqs: &[TraceRequest], progress: &[Progress]) {
        let left = reqs[i as usize].prompt_tokens - progress[i as usize].prefilled;
        self.queued_tokens += u64::from(left);
        self.queue.enqueue_with_deadline(u64::from(i), class, left, deadline);
    }

    /// Plans and times the next iteration at `now`; None if there is
    /// nothing to do.
    /// Removes the queued requests whose deadline passed (to be shed).
    pub fn take_expired(&mut self, now: f64, reqs: &[TraceRequest], progress: &[Progress]) -> Vec<u32> {
        let expired = self.queue.take_expired(now);
        for &id in &expired {
            let (r, p) = (&reqs[id as usize], &progress[id as usize]);
            self.queued_tokens -= u64::from(r.prompt_tokens - p.prefilled);
        }
        expired.into_iter().map(|id| id as u32).collect()
    }

    pub fn start_iteration(&mut self, _now: f64, profile: &Profile, reqs: &[TraceRequest], progress: &[Progress]) -> Option<f64> {
        let mut budget = if self.spec.token_cap == 0 { u32::MAX } else { self.spec.token_cap };
        self.decode_now.clear();
        self.prefill_now.clear();
        let cap = self.spec.batch_cap as usize;
        for &i in &self.running {
            let (r, p) = (&reqs[i as usize], &progress[i as usize]);
            if p.prefilled < r.prompt_tokens {
                if budget > 0 {
                    let c = (r.prompt_tokens - p.prefilled).min(budget);
                    budget -= c;
                    self.prefill_now.push((i, c));
                }
            } else if self.decode_now.len() < cap {
                self.decode_now.push(i);
            }
        }
        let Self {
            queue,
            kv_used,
            kv_capacity,
            decode_now,
            prefill_now,
            queued_tokens,
            running,
            ..
        } = self;
        let admitted = queue.next_batch_where(running.len() as u32, |id, _| {
            let (r, p) = (&reqs[id as usize], &progress[id as usize]);
            let needs_prefill = p.prefilled < r.prompt_tokens;
            if (needs_prefill && budget == 0) || *kv_used + kv_reservation(r) > *kv_capacity {
                return false;
            }
            *kv_used += kv_reservation(r);
            *queued_tokens -= u64::from(r.prompt_tokens - p.prefilled);
            if needs_prefill {
                let c = (r.prompt_tokens - p.prefilled).min(budget);
                budget -= c;
                prefill_now.push((id as u32, c));
            } else if decode_now.len() < cap {
                decode_now.push(id as u32);
            }
            true
        });
        running.extend(admitted.into_iter().map(|id| id as u32));
        let tp = self.spec.tp;
        let mut ms = 0.0;
        if !self.decode_now.is_empty() {
            let ctx: f64 = self
                .decode_now
                .iter()
                .map(|&i| f64::from(reqs[i as usize].prompt_tokens + progress[i as usize].generated))
                .sum::<f64>()
                / self.decode_now.len() as f64;
            ms += profile.decode_ms(tp, self.decode_now.len() as f64, ctx);
        }
        if !self.prefill_now.is_empty() {
            let tokens: u32 = self.prefill_now.iter().map(|&(_, c)| c).sum();
            ms += profile.prefill_ms(tp, f64::from(tokens), self.prefill_now.len() as f64);
        }
        (ms > 0.0).then_some(ms)
    }

    /// Applies the finished iteration at time `now`.
    pub fn finish_iteration(&mut self, now: f64, reqs: &[TraceRequest], progress: &mut [Progress]) -> Vec<Outcome> {
        let mut out = Vec::new();
        for &i in &self.decode_now {
            let p = &mut progress[i as usize];
            p.generated += 1;
            if p.generated >= reqs[i as usize].output_tokens {
                p.finish_s = now;
                out.push(Outcome::Finished(i));
            }
        }
        for &(i, c) in &self.prefill_now {
            let r = &reqs[i as usize];
            let p = &mut progress[i as usize];
            p.prefilled += c;
            if p.prefilled == r.prompt_tokens {
                p.first_token_s = now;
                p.generated = 1;
                if r.output_tokens <= 1 {
                    p.finish_s = now;
                    out.push(Outcome::Finished(i));
                } else if self.spec.role == Role::Prefill {
                    out.push(Outcome::PrefillDone(i));
                } else {
                    out.push(Outcome::FirstToken(i));
                }
            }
        }
        for o in &out {
            if let Outcome::Finished(i) | Outcome::PrefillDone(i) = *o {
                self.release(i, reqs);
            }
        }
        self.decode_now.clear();
        self.prefilled_last = !self.prefill_now.is_empty();
        self.prefill_now.clear();
        out
    }

    /// Removes a running request and frees its KV.
    pub fn release(&mut self, i: u32, reqs: &[TraceRequest]) {
        if let Some(pos) = self.running.iter().position(|&r| r == i) {
            self.running.swap_remove(pos);
            self.kv_used -= kv_reservation(&reqs[i as usize]);
        }
    }

    /// Takes a request that just finished its prompt here back into the
    /// running batch (no decode group to hand it to).
    pub fn keep_decoding(&mut self, i: u32, reqs: &[TraceRequest]) {
        self.kv_used += kv_reservation(&reqs[i as usize]);
        self.running.push(i);
    }

    /// Everything the group holds, for migration when it stops: running
    /// requests (with KV) and queued ones (metadata only).
    pub fn drain(&mut self) -> (Vec<u32>, Vec<(u32, DispatchClass)>) {
        let running = std::mem::take(&mut self.running);
        self.kv_used = 0;
        let queued = self.queue.drain().into_iter().map(|(id, c)| (id as u32, c)).collect();
        self.queued_tokens = 0;
        (running, queued)
    }
}
