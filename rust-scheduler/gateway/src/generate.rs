//! One request's life after admission: place it, submit it, follow its token
//! stream, re-dispatch it when its worker or device dies before the first
//! token (reporting the failure to the control loop), report its first token
//! (the control loop hands it off; a wait for a decode slot may be shed,
//! which ends the stream with 503 `overloaded`), and turn token ids into
//! text with stop strings. Dropping a `Running` (client gone, error,
//! timeout) cancels it on the worker and returns its bandwidth.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tiertp_scheduler::dispatcher::DispatchClass;
use tiertp_scheduler::plan::GroupKey;
use tiertp_scheduler::tiers::TierId;
use tokio::sync::oneshot;

use crate::admission::Permit;
use crate::control::Control;
use crate::error::ApiError;
use crate::protocol::codes;
use crate::tokenize::TextCodec;
use crate::worker::{Submit, TokenEvent, TokenStream, WorkerClient, WorkerError};

/// Everything a finished request reports.
#[derive(Debug, Clone, PartialEq)]
pub struct Finish {
    pub reason: &'static str,
    pub completion_tokens: u32,
}

/// A piece of output: new text, and the finish when it is the last.
#[derive(Debug, Clone, PartialEq)]
pub struct Piece {
    pub text: String,
    pub finish: Option<Finish>,
}

pub struct Running {
    control: Arc<Control>,
    codec: Arc<TextCodec>,
    request: Submit,
    tier: TierId,
    worker: Arc<dyn WorkerClient>,
    /// The group the request runs on now.
    group: GroupKey,
    rx: TokenStream,
    /// While it waits for a decode slot: the control loop's word if the
    /// wait is shed (it is then already cancelled at its worker).
    shed: Option<oneshot::Receiver<ApiError>>,
    /// Groups tried so far (one per attempt).
    tried: Vec<GroupKey>,
    max_attempts: u32,
    timeout: Duration,
    arrival: Instant,
    first_token: Option<Instant>,
    tokens: Vec<u32>,
    stop: Vec<String>,
    /// Bytes of decoded text already handed out.
    emitted: usize,
    done: bool,
    _permit: Permit,
}

impl Drop for Running {
    fn drop(&mut self) {
        if !self.done {
            self.worker.cancel(self.request.id);
            self.control.metrics.tiers[self.tier].errors.fetch_add(1, Ordering::Relaxed);
        }
        self.control.complete(self.request.id);
    }
}

pub struct Start {
    pub tier: TierId,
    pub input_ids: Vec<u32>,
    pub sampling: crate::protocol::Sampling,
    pub stop: Vec<String>,
    pub permit: Permit,
    pub arrival: Instant,
}

impl Running {
    /// Places and submits; tries another worker when one is down.
    pub fn start(control: Arc<Control>, codec: Arc<TextCodec>, s: Start, max_attempts: u32, timeout: Duration) -> Result<Self, ApiError> {
        let id = control.new_request_id();
        let request = Submit {
            id,
            tier: control.tiers().tiers()[s.tier].name.clone(),
            input_ids: s.input_ids,
            sampling: s.sampling,
            class: DispatchClass::Feasible,
            group: None,
            start_within_s: None,
        };
        let mut tried = Vec::new();
        let (worker, group, rx) = submit(&control, &request, s.tier, s.arrival, &mut tried, max_attempts)?;
        Ok(Self {
            control,
            codec,
            request,
            tier: s.tier,
            worker,
            group,
            rx,
            shed: None,
            tried,
            max_attempts,
            timeout,
            arrival: s.arrival,
            first_token: None,
            tokens: Vec::new(),
            stop: s.stop,
            emitted: 0,
            done: false,
            _permit: s.permit,
        })
    }

    /// The gateway's id of the request (also the worker protocol's `id`).
    pub fn id(&self) -> u64 {
        self.request.id
    }

    pub fn prompt_tokens(&self) -> u32 {
        self.request.input_ids.len() as u32
    }

    /// The next piece of output; `decode_each` false leaves all text to the
    /// final piece (non-streaming without stop strings: one decode).
    pub async fn next(&mut self, decode_each: bool) -> Result<Piece, ApiError> {
        loop {
            // A shed comes first: the control loop cancels the request at its
            // worker right after telling it, which closes the stream.
            let received = tokio::select! {
                biased;
                e = shed_notice(&mut self.shed) => Err(e),
                r = tokio::time::timeout(self.timeout, self.rx.recv()) => Ok(r),
            };
            let received = match received {
                Ok(r) => r,
                Err(shed) => {
                    // Counted as shed by the control loop, not as an error.
                    self.done = true;
                    return Err(shed);
                }
            };
            let event = match received {
                Ok(Some(e)) => e,
                Ok(None) => TokenEvent::Failed(crate::worker::WorkerError::Died {
                    worker: self.worker.name().to_string(),
                    reason: "stream closed".into(),
                }),
                Err(_) => {
                    let seconds = self.timeout.as_secs_f64();
                    log::warn!(
                        "request {}: worker {} sent nothing for {seconds} s",
                        self.request.id,
                        self.worker.name()
                    );
                    return Err(ApiError::Timeout(format!("the worker sent nothing for {seconds} s")));
                }
            };
            match event {
                TokenEvent::Failed(e) if e.retriable() && self.tokens.is_empty() && (self.tried.len() as u32) < self.max_attempts => {
                    log::info!("request {}: {e}; re-dispatching", self.request.id);
                    report(&self.control, self.group, &e);
                    self.control.complete(self.request.id);
                    self.control.metrics.redispatches.fetch_add(1, Ordering::Relaxed);
                    let (w, group, rx) = submit(
                        &self.control,
                        &self.request,
                        self.tier,
                        self.arrival,
                        &mut self.tried,
                        self.max_attempts,
                    )?;
                    self.worker = w;
                    self.group = group;
                    self.rx = rx;
                }
                TokenEvent::Failed(e) => {
                    report(&self.control, self.group, &e);
                    return Err(client_error(self.request.id, e));
                }
                TokenEvent::Tokens {
                    tokens,
                    finished,
                    finish_reason,
                    ..
                } => {
                    if !tokens.is_empty() && self.first_token.is_none() {
                        self.first_token = Some(Instant::now());
                        if let Some(p) = self.control.first_token(self.request.id) {
                            self.shed = p.shed;
                        }
                    }
                    self.tokens.extend_from_slice(&tokens);
                    if !finished && !decode_each && self.stop.is_empty() {
                        continue;
                    }
                    let reason = match finish_reason.as_deref() {
                        Some("stop") => "stop",
                        _ => "length",
                    };
                    let piece = self.text_piece(finished.then_some(reason));
                    if piece.finish.is_some() {
                        self.finish();
                    }
                    if piece.finish.is_some() || !piece.text.is_empty() {
                        return Ok(piece);
                    }
                }
            }
        }
    }

    /// New text since the last piece: cut at a stop string, and holding back
    /// a tail that may still become one (or an incomplete UTF-8 character).
    fn text_piece(&mut self, finish: Option<&'static str>) -> Piece {
        let text = self.codec.decode(&self.tokens);
        let start = self.emitted.min(text.len());
        let start = (0..=start).rev().find(|&i| text.is_char_boundary(i)).unwrap_or(0);
        let longest = self.stop.iter().map(String::len).max().unwrap_or(0);
        let search_from = (0..=start.saturating_sub(longest))
            .rev()
            .find(|&i| text.is_char_boundary(i))
            .unwrap_or(0);
        let hit = self
            .stop
            .iter()
            .filter_map(|s| text[search_from..].find(s.as_str()).map(|p| p + search_from))
            .min();
        let (end, finish) = match (hit, finish) {
            (Some(p), _) => (p.max(start), Some("stop")),
            (None, Some(f)) => (text.len(), Some(f)),
            (None, None) => {
                let mut end = text.len();
                for s in &self.stop {
                    for k in (1..s.len()).rev() {
                        if s.is_char_boundary(k) && text.ends_with(&s[..k]) {
                            end = end.min(text.len() - k);
                            break;
                        }
                    }
                }
                if text.ends_with('\u{FFFD}') {
                    end = end.min(text.len() - '\u{FFFD}'.len_utf8());
                }
                (end.max(start), None)
            }
        };
        self.emitted = end;
        Piece {
            text: text[start..end].to_string(),
            finish: finish.map(|reason| Finish {
                reason,
                completion_tokens: self.tokens.len() as u32,
            }),
        }
    }

    fn finish(&mut self) {
        if !self.done && self.worker_still_running() {
            // Stopped by a stop string: the worker is still generating.
            self.worker.cancel(self.request.id);
        }
        self.done = true;
        let m = &self.control.metrics.tiers[self.tier];
        m.completions.fetch_add(1, Ordering::Relaxed);
        let now = Instant::now();
        let first = self.first_token.unwrap_or(now);
        let ttft = first.duration_since(self.arrival).as_secs_f64();
        let n = self.tokens.len();
        let tpot = if n > 1 {
            now.duration_since(first).as_secs_f64() / (n - 1) as f64
        } else {
            0.0
        };
        m.ttft.observe(ttft);
        if n > 1 {
            m.tpot.observe(tpot);
        }
        let tier = &self.control.tiers().tiers()[self.tier];
        let met = |slo: Option<f64>, v: f64| slo.is_none_or(|ms| v * 1e3 <= ms);
        if met(tier.ttft_ms, ttft) && met(tier.tpot_ms, tpot) {
            m.goodput.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Whether the worker may still send for this request (it has not sent
    /// its terminal item): the channel is open.
    fn worker_still_running(&self) -> bool {
        !self.rx.is_closed()
    }
}

/// The error of a request whose wait for a decode slot the control loop
/// shed; never ready for a request that does not wait (or was granted one).
async fn shed_notice(rx: &mut Option<oneshot::Receiver<ApiError>>) -> ApiError {
    if let Some(r) = rx.as_mut() {
        let got = r.await;
        // A finished receiver must not be polled again.
        *rx = None;
        if let Ok(e) = got {
            return e;
        }
    }
    std::future::pending().await
}

/// A worker's failure as its client sees it; the full error, which names
/// the worker's internal endpoint, goes to the log only.
fn client_error(id: u64, e: WorkerError) -> ApiError {
    log::warn!("request {id}: {e}");
    e.into()
}

/// Tells the control loop about a failure that says a GPU or worker is down.
fn report(control: &Control, group: GroupKey, e: &WorkerError) {
    match e {
        WorkerError::Rejected { code, .. } if code == codes::WORKER_DIED => control.report_dead_group(group),
        WorkerError::Died { .. } | WorkerError::Connect { .. } => control.report_lost_worker(),
        _ => {}
    }
}

fn submit(
    control: &Arc<Control>,
    request: &Submit,
    tier: TierId,
    arrival: Instant,
    tried: &mut Vec<GroupKey>,
    max_attempts: u32,
) -> Result<(Arc<dyn WorkerClient>, GroupKey, TokenStream), ApiError> {
    loop {
        let prompt = request.input_ids.len() as u32;
        let first = tried.is_empty();
        let p = control.place(request.id, tier, prompt, request.sampling.max_tokens, tried, first)?;
        tried.push(p.key);
        let worker = control.workers[p.worker].clone();
        let mut r = request.clone();
        r.class = p.class;
        r.group = p.group;
        r.start_within_s = control.start_within_s(tier, arrival);
        match worker.submit(r) {
            Ok(rx) => return Ok((worker, p.key, rx)),
            Err(e) => {
                report(control, p.key, &e);
                control.complete(request.id);
                if !e.retriable() || tried.len() as u32 >= max_attempts {
                    return Err(client_error(request.id, e));
                }
            }
        }
    }
}
