//! Who may send what: API key → tier, the optional lower-tier header, and
//! the tiers' admission limits (`max_concurrent_requests`,
//! `max_requests_per_minute` in the tier file): over either, 429 with
//! Retry-After. Keys are looked up in constant time (`api_keys`).

mod api_keys;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use api_keys::ApiKeys;
use axum::http::HeaderMap;
use tiertp_scheduler::tiers::{Tier, TierId, TierLimits, TierSet};

use crate::error::ApiError;

/// The header a client uses to ask for a lower tier than its key's.
pub const TIER_HEADER: &str = "x-tiertp-tier";

/// Whether `to` is the same tier as `from` or a lower one: a background tier
/// is lowest; among SLO tiers, lower means no tighter TTFT and TPOT.
pub fn is_same_or_lower(from: &Tier, to: &Tier) -> bool {
    if from.name == to.name || to.background {
        return true;
    }
    if from.background {
        return false;
    }
    let looser = |a: Option<f64>, b: Option<f64>| b.unwrap_or(f64::INFINITY) >= a.unwrap_or(f64::INFINITY);
    looser(from.ttft_ms, to.ttft_ms) && looser(from.tpot_ms, to.tpot_ms)
}

/// A token bucket: refills at `per_s`, holds one second's worth (at least
/// one request), starts full.
struct Bucket {
    per_s: f64,
    capacity: f64,
    tokens: f64,
    last: Instant,
}

impl Bucket {
    fn new(per_minute: f64, now: Instant) -> Self {
        let per_s = per_minute / 60.0;
        let capacity = per_s.max(1.0);
        Self {
            per_s,
            capacity,
            tokens: capacity,
            last: now,
        }
    }

    /// Takes one token, or says in how many seconds one will be there.
    fn take(&mut self, now: Instant) -> Result<(), f64> {
        self.tokens = (self.tokens + now.saturating_duration_since(self.last).as_secs_f64() * self.per_s).min(self.capacity);
        self.last = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err((1.0 - self.tokens) / self.per_s)
        }
    }
}

struct TierGate {
    limits: TierLimits,
    in_flight: AtomicU32,
    bucket: Option<Mutex<Bucket>>,
}

pub struct Admission {
    tiers: TierSet,
    keys: ApiKeys,
    gates: Vec<Arc<TierGate>>,
}

/// Holds one concurrency slot of a tier until dropped.
pub struct Permit(Arc<TierGate>);

impl Drop for Permit {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Admission {
    pub fn new(tiers: &TierSet) -> Self {
        let keys = ApiKeys::new(tiers);
        let now = Instant::now();
        let gates = tiers
            .tiers()
            .iter()
            .map(|t| {
                Arc::new(TierGate {
                    limits: t.limits,
                    in_flight: AtomicU32::new(0),
                    bucket: t.limits.max_requests_per_minute.map(|rpm| Mutex::new(Bucket::new(rpm, now))),
                })
            })
            .collect();
        Self {
            tiers: tiers.clone(),
            keys,
            gates,
        }
    }

    /// The tier of a request: its key's, or the lower one its header asks for.
    pub fn tier_of(&self, headers: &HeaderMap) -> Result<TierId, ApiError> {
        let auth = headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let key = auth.strip_prefix("Bearer ").map(str::trim).unwrap_or("");
        if key.is_empty() {
            return Err(ApiError::Unauthorized(
                "You didn't provide an API key. Send it as `Authorization: Bearer KEY`.".into(),
            ));
        }
        let own = self
            .keys
            .tier_of(key)
            .ok_or_else(|| ApiError::Unauthorized("Incorrect API key provided.".into()))?;
        let Some(asked) = headers.get(TIER_HEADER) else {
            return Ok(own);
        };
        let name = asked.to_str().unwrap_or("");
        let id = self.tiers.id_of(name).map_err(|e| ApiError::BadRequest {
            message: e,
            param: Some(TIER_HEADER.into()),
        })?;
        let (from, to) = (&self.tiers.tiers()[own], &self.tiers.tiers()[id]);
        if !is_same_or_lower(from, to) {
            return Err(ApiError::Forbidden {
                message: format!(
                    "tier {:?} is higher than this key's tier {:?}; a request may only ask for a lower tier",
                    to.name, from.name
                ),
                param: Some(TIER_HEADER.into()),
            });
        }
        Ok(id)
    }

    /// Admits one request of `tier` or says when to retry (429). The
    /// returned permit holds a concurrency slot until dropped.
    pub fn admit(&self, tier: TierId) -> Result<Permit, ApiError> {
        let gate = &self.gates[tier];
        let refused = |reason: String, retry_after_s: f64| ApiError::RateLimited {
            tier: self.tiers.tiers()[tier].name.clone(),
            reason,
            retry_after_s: retry_after_s.ceil().max(1.0) as u64,
        };
        let n = gate.in_flight.fetch_add(1, Ordering::AcqRel);
        // From here on, dropping the permit gives the slot back.
        let permit = Permit(gate.clone());
        if let Some(max) = gate.limits.max_concurrent_requests {
            if n >= max {
                // A slot frees when a request finishes: seconds on this
                // hardware, so one second is the honest hint.
                return Err(refused(format!("{max} requests in flight (max_concurrent_requests)"), 1.0));
            }
        }
        if let Some(bucket) = &gate.bucket {
            if let Err(wait_s) = bucket.lock().unwrap().take(Instant::now()) {
                let rpm = gate.limits.max_requests_per_minute.unwrap_or_default();
                return Err(refused(format!("over {rpm} requests per minute (max_requests_per_minute)"), wait_s));
            }
        }
        Ok(permit)
    }

    pub fn in_flight(&self, tier: TierId) -> u32 {
        self.gates[tier].in_flight.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn tiers() -> TierSet {
        TierSet::from_toml(
            "[[tier]]\nname='fast'\nttft_ms=200\ntpot_ms=20\napi_keys=['kf']\n[[tier]]\nname='slow'\nttft_ms=2000\ntpot_ms=100\napi_keys=['ks']\n[[tier]]\nname='bg'\nbackground=true\napi_keys=['kb']\n",
            "t",
        )
        .unwrap()
    }

    fn headers(key: &str, tier: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("authorization", HeaderValue::from_str(&format!("Bearer {key}")).unwrap());
        if let Some(t) = tier {
            h.insert(TIER_HEADER, HeaderValue::from_str(t).unwrap());
        }
        h
    }

    #[test]
    fn keys_and_lower_tiers_only() {
        let a = Admission::new(&tiers());
        assert_eq!(a.tier_of(&headers("kf", None)), Ok(0));
        assert_eq!(a.tier_of(&headers("kf", Some("slow"))), Ok(1));
        assert_eq!(a.tier_of(&headers("ks", Some("bg"))), Ok(2));
        assert!(matches!(a.tier_of(&headers("ks", Some("fast"))), Err(ApiError::Forbidden { .. })));
        assert!(matches!(a.tier_of(&headers("kb", Some("slow"))), Err(ApiError::Forbidden { .. })));
        assert!(matches!(a.tier_of(&headers("nope", None)), Err(ApiError::Unauthorized(_))));
        assert!(matches!(a.tier_of(&headers("kf", Some("zz"))), Err(ApiError::BadRequest { .. })));
    }

    fn limited(extra: &str) -> Admission {
        let text = format!("[[tier]]\nname='fast'\nttft_ms=200\ntpot_ms=20\napi_keys=['kf']\n{extra}\n");
        Admission::new(&TierSet::from_toml(&text, "t").unwrap())
    }

    #[test]
    fn concurrency_limit_then_release() {
        let a = limited("max_concurrent_requests = 1");
        let p = a.admit(0).unwrap();
        let Err(ApiError::RateLimited { retry_after_s, reason, .. }) = a.admit(0) else {
            panic!("the second request must be refused")
        };
        assert!(retry_after_s >= 1 && reason.contains("max_concurrent_requests"), "{reason}");
        assert_eq!(a.in_flight(0), 1, "a refused request holds no slot");
        drop(p);
        assert!(a.admit(0).is_ok());
    }

    #[test]
    fn rate_limit_says_when_to_retry() {
        // One request per minute: a bucket of one, refilled in 60 s.
        let a = limited("max_requests_per_minute = 1");
        drop(a.admit(0).unwrap());
        let Err(ApiError::RateLimited { retry_after_s, reason, .. }) = a.admit(0) else {
            panic!("the second request in the minute must be refused")
        };
        assert!((1..=60).contains(&retry_after_s), "{retry_after_s}");
        assert!(reason.contains("max_requests_per_minute"), "{reason}");
        assert_eq!(a.in_flight(0), 0);
    }

    #[test]
    fn bucket_refills_and_holds_one_seconds_worth() {
        let t0 = Instant::now();
        let mut b = Bucket::new(600.0, t0); // 10/s, burst 10
        for _ in 0..10 {
            assert!(b.take(t0).is_ok());
        }
        let wait = b.take(t0).unwrap_err();
        assert!((wait - 0.1).abs() < 1e-9, "{wait}");
        assert!(b.take(t0 + std::time::Duration::from_millis(100)).is_ok());
        // Idle for long: still only one second's worth.
        let later = t0 + std::time::Duration::from_secs(100);
        for _ in 0..10 {
            assert!(b.take(later).is_ok());
        }
        assert!(b.take(later).is_err());
    }
}
