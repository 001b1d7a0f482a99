//! Who may send what: API key → tier, the optional lower-tier header, and
//! per-tier admission limits (concurrency, rate).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::http::HeaderMap;
use rustc_hash::FxHashMap;
use tiertp_scheduler::tiers::{Tier, TierId, TierSet};

use crate::config::TierLimits;
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

struct Bucket {
    tokens: f64,
    last: Instant,
}

struct TierGate {
    limits: TierLimits,
    in_flight: AtomicU32,
    bucket: Mutex<Bucket>,
}

pub struct Admission {
    tiers: TierSet,
    keys: FxHashMap<String, TierId>,
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
    pub fn new(tiers: &TierSet, limits: &FxHashMap<String, TierLimits>) -> Self {
        let keys = tiers
            .tiers()
            .iter()
            .enumerate()
            .flat_map(|(id, t)| t.api_keys.iter().map(move |k| (k.clone(), id)))
            .collect();
        let now = Instant::now();
        let gates = tiers
            .tiers()
            .iter()
            .map(|t| {
                let l = limits.get(&t.name).copied().unwrap_or_default();
                Arc::new(TierGate {
                    limits: l,
                    in_flight: AtomicU32::new(0),
                    bucket: Mutex::new(Bucket {
                        tokens: l.max_rps.unwrap_or(0.0).max(1.0),
                        last: now,
                    }),
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
        let own = *self
            .keys
            .get(key)
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

    /// Admits one request of `tier` or says when to retry (429).
    pub fn admit(&self, tier: TierId) -> Result<Permit, ApiError> {
        let gate = &self.gates[tier];
        let name = || self.tiers.tiers()[tier].name.clone();
        if let Some(max) = gate.limits.max_concurrent {
            let n = gate.in_flight.fetch_add(1, Ordering::AcqRel);
            if n >= max {
                gate.in_flight.fetch_sub(1, Ordering::AcqRel);
                return Err(ApiError::RateLimited {
                    tier: name(),
                    reason: format!("{max} requests in flight (max_concurrent)"),
                    retry_after_s: 1,
                });
            }
        } else {
            gate.in_flight.fetch_add(1, Ordering::AcqRel);
        }
        let permit = Permit(gate.clone());
        if let Some(rps) = gate.limits.max_rps {
            let mut b = gate.bucket.lock().unwrap();
            let now = Instant::now();
            b.tokens = (b.tokens + now.duration_since(b.last).as_secs_f64() * rps).min(rps.max(1.0));
            b.last = now;
            if b.tokens < 1.0 {
                let wait = ((1.0 - b.tokens) / rps).ceil() as u64;
                return Err(ApiError::RateLimited {
                    tier: name(),
                    reason: format!("over {rps} requests/s (max_rps)"),
                    retry_after_s: wait,
                });
            }
            b.tokens -= 1.0;
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
        let a = Admission::new(&tiers(), &FxHashMap::default());
        assert_eq!(a.tier_of(&headers("kf", None)), Ok(0));
        assert_eq!(a.tier_of(&headers("kf", Some("slow"))), Ok(1));
        assert_eq!(a.tier_of(&headers("ks", Some("bg"))), Ok(2));
        assert!(matches!(a.tier_of(&headers("ks", Some("fast"))), Err(ApiError::Forbidden { .. })));
        assert!(matches!(a.tier_of(&headers("kb", Some("slow"))), Err(ApiError::Forbidden { .. })));
        assert!(matches!(a.tier_of(&headers("nope", None)), Err(ApiError::Unauthorized(_))));
        assert!(matches!(a.tier_of(&headers("kf", Some("zz"))), Err(ApiError::BadRequest { .. })));
    }

    #[test]
    fn concurrency_limit_then_release() {
        let mut limits = FxHashMap::default();
        limits.insert(
            "fast".to_string(),
            TierLimits {
                max_concurrent: Some(1),
                max_rps: None,
            },
        );
        let a = Admission::new(&tiers(), &limits);
        let p = a.admit(0).unwrap();
        assert!(matches!(a.admit(0), Err(ApiError::RateLimited { .. })));
        drop(p);
        assert!(a.admit(0).is_ok());
    }
}
