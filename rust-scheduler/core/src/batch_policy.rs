//! The local batch policy (DESIGN.md §1): per GPU group, three FCFS queues
//! (feasible, best-effort, background); each iteration the batch is filled
//! from them in that order, up to the plan's batch cap and token cap. A
//! waiting request whose TTFT deadline passed can no longer count as
//! goodput: `take_expired` hands it back to the caller to shed, so it never
//! takes a batch slot from one that still can. The worker calls it through
//! the bindings and the simulator calls it directly.

use std::collections::VecDeque;

use rustc_hash::FxHashSet;

use crate::dispatcher::DispatchClass;

#[derive(Debug, Clone, Copy, PartialEq)]
struct Waiting {
    id: u64,
    tokens: u32,
    /// Time by which the request must start to meet its TTFT (seconds, on
    /// the caller's clock); infinite when it has none.
    deadline: f64,
}

#[derive(Debug, Clone)]
pub struct BatchPolicy {
    batch_cap: u32,
    /// Prompt tokens per iteration; 0 means no token limit.
    token_cap: u32,
    /// Feasible, best-effort, background.
    queues: [VecDeque<Waiting>; 3],
    queued: FxHashSet<u64>,
}

fn queue_index(class: DispatchClass) -> usize {
    match class {
        DispatchClass::Feasible => 0,
        DispatchClass::BestEffort => 1,
        DispatchClass::Background => 2,
    }
}

impl BatchPolicy {
    pub fn new(batch_cap: u32, token_cap: u32) -> Self {
        Self {
            batch_cap: batch_cap.max(1),
            token_cap,
            queues: Default::default(),
            queued: FxHashSet::default(),
        }
    }

    /// New caps from a new plan; queued requests stay queued.
    pub fn set_caps(&mut self, batch_cap: u32, token_cap: u32) {
        self.batch_cap = batch_cap.max(1);
        self.token_cap = token_cap;
    }

    pub fn batch_cap(&self) -> u32 {
        self.batch_cap
    }

    pub fn token_cap(&self) -> u32 {
        self.token_cap
    }

    /// Queues a request; false if it is already queued.
    pub fn enqueue(&mut self, id: u64, class: DispatchClass, tokens: u32) -> bool {
        self.enqueue_with_deadline(id, class, tokens, f64::INFINITY)
    }

    /// Queues a request that can only meet its SLO if it starts by
    /// `deadline` (see `take_expired`).
    pub fn enqueue_with_deadline(&mut self, id: u64, class: DispatchClass, tokens: u32, deadline: f64) -> bool {
        if !self.queued.insert(id) {
            return false;
        }
        self.queues[queue_index(class)].push_back(Waiting { id, tokens, deadline });
        true
    }

    /// Removes and returns the waiting requests whose deadline has passed
    /// (`deadline <= now`), in queue order: the caller sheds them. Every
    /// waiting request is checked, so one queued out of deadline order is
    /// caught too.
    pub fn take_expired(&mut self, now: f64) -> Vec<u64> {
        let mut out = Vec::new();
        for q in &mut self.queues {
            if q.iter().all(|w| w.deadline > now) {
                continue;
            }
            q.retain(|w| {
                let keep = w.deadline > now;
                if !keep {
                    out.push(w.id);
                }
                keep
            });
        }
        for id in &out {
            self.queued.remove(id);
        }
        out
    }

    /// Removes a waiting request (cancel); false if it was not waiting.
    pub fn remove(&mut self, id: u64) -> bool {
        if !self.queued.remove(&id) {
            return false;
        }
        for q in &mut self.queues {
            if let Some(pos) = q.iter().position(|w| w.id == id) {
                q.remove(pos);
                break;
            }
        }
        true
    }

    /// Requests to add this iteration, given `running` already in the batch.
    /// FCFS within each queue; a request whose tokens do not fit the token
    /// cap stops the fill (no overtaking), except that an empty batch always
    /// admits one request so an oversized prompt cannot block forever.
    pub fn next_batch(&mut self, running: u32) -> Vec<u64> {
        self.next_batch_where(running, |_, _| true)
    }

    /// Like `next_batch`, but each candidate must also pass `admit` (e.g. a
    /// KV-space check); the first refusal stops the fill (FCFS, no
    /// overtaking) and the refused request stays at the head of its queue.
    pub fn next_batch_where(&mut self, running: u32, mut admit: impl FnMut(u64, u32) -> bool) -> Vec<u64> {
        let mut slots = self.batch_cap.saturating_sub(running);
        let mut tokens_left = if self.token_cap == 0 { u64::MAX } else { u64::from(self.token_cap) };
        let mut out = Vec::new();
        'queues: for q in &mut self.queues {
            while slots > 0 {
                let Some(&head) = q.front() else { break };
                let empty = running == 0 && out.is_empty();
                if (u64::from(head.tokens) > tokens_left && !empty) || !admit(head.id, head.tokens) {
                    break 'queues;
                }
                q.pop_front();
                self.queued.remove(&head.id);
                tokens_left = tokens_left.saturating_sub(u64::from(head.tokens));
                slots -= 1;
                out.push(head.id);
            }
        }
        out
    }

    /// Empties every queue, in fill order (feasible, best-effort,
    /// background; FCFS within each), each request with the class it was
    /// queued under: what a group hands over when it stops.
    pub fn drain(&mut self) -> Vec<(u64, DispatchClass)> {
        self.queued.clear();
        let mut out = Vec::new();
        for (q, class) in self.queues.iter_mut().zip(DispatchClass::ALL) {
            out.extend(q.drain(..).map(|w| (w.id, class)));
        }
        out
    }

    /// Waiting requests per queue: [feasible, best_effort, background].
    pub fn queue_lengths(&self) -> [usize; 3] {
        [self.queues[0].len(), self.queues[1].len(), self.queues[2].len()]
    }

    pub fn len(&self) -> usize {
        self.queued.len()
    }

    pub fn is_empty(&self) -> bool {
        self.queued.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use DispatchClass::*;

    #[test]
    fn fills_feasible_then_best_effort_then_background() {
        let mut p = BatchPolicy::new(4, 0);
        p.enqueue(1, Background, 10);
        p.enqueue(2, BestEffort, 10);
        p.enqueue(3, Feasible, 10);
        p.enqueue(4, Feasible, 10);
        p.enqueue(5, Background, 10);
        assert_eq!(p.next_batch(1), vec![3, 4, 2]);
        assert_eq!(p.queue_lengths(), [0, 0, 2]);
        assert_eq!(p.next_batch(0), vec![1, 5]);
        assert!(p.is_empty());
    }

    #[test]
    fn respects_token_cap_without_overtaking() {
        let mut p = BatchPolicy::new(8, 100);
        p.enqueue(1, Feasible, 60);
        p.enqueue(2, Feasible, 60);
        p.enqueue(3, Background, 10);
        assert_eq!(p.next_batch(0), vec![1]);
        assert_eq!(p.next_batch(0), vec![2, 3]);
    }

    #[test]
    fn oversized_prompt_runs_alone() {
        let mut p = BatchPolicy::new(8, 100);
        p.enqueue(1, Feasible, 500);
        p.enqueue(2, Feasible, 5);
        assert_eq!(p.next_batch(0), vec![1]);
        p.enqueue(3, Feasible, 500);
        assert_eq!(p.next_batch(1), vec![2]);
    }

    #[test]
    fn admission_check_stops_the_fill_in_order() {
        let mut p = BatchPolicy::new(8, 0);
        for id in 1..=4 {
            p.enqueue(id, Feasible, 10 * id as u32);
        }
        let mut budget = 35;
        let got = p.next_batch_where(0, |_, tokens| {
            let ok = tokens <= budget;
            budget = budget.saturating_sub(tokens);
            ok
        });
        // 10 + 20 fit; 30 does not, and 40 may not overtake it.
        assert_eq!(got, vec![1, 2]);
        assert_eq!(p.next_batch(0), vec![3, 4]);
    }

    #[test]
    fn expired_requests_are_handed_back_and_never_batched() {
        let mut p = BatchPolicy::new(2, 0);
        p.enqueue_with_deadline(1, Feasible, 10, 1.0);
        p.enqueue_with_deadline(2, Feasible, 10, 5.0);
        p.enqueue(3, BestEffort, 10);
        p.enqueue_with_deadline(4, Feasible, 10, 6.0);
        p.enqueue(5, Background, 10);
        assert!(p.take_expired(0.5).is_empty());
        assert_eq!(p.take_expired(2.0), vec![1]);
        assert_eq!(p.queue_lengths(), [2, 1, 1]);
        assert_eq!(p.next_batch(0), vec![2, 4]);
        assert_eq!(p.next_batch(0), vec![3, 5]);
        // Out of deadline order: still caught.
        p.enqueue_with_deadline(6, Feasible, 10, 9.0);
        p.enqueue_with_deadline(7, Feasible, 10, 3.0);
        assert_eq!(p.take_expired(4.0), vec![7]);
        assert_eq!(p.drain(), vec![(6, Feasible)]);
        assert!(!p.remove(7));
    }

    #[test]
    fn remove_and_duplicates() {
        let mut p = BatchPolicy::new(8, 0);
        assert!(p.enqueue(1, Feasible, 5));
        assert!(!p.enqueue(1, BestEffort, 5));
        assert!(p.enqueue(2, BestEffort, 5));
        assert!(p.remove(1));
        assert!(!p.remove(1));
        assert_eq!(p.next_batch(0), vec![2]);
        p.set_caps(0, 0);
        assert_eq!(p.batch_cap(), 1);
        p.enqueue(7, Background, 1);
        p.enqueue(8, Feasible, 1);
        assert_eq!(p.drain(), vec![(8, Feasible), (7, Background)]);
        assert!(p.is_empty());
    }
}
