//! SLO tiers, from TOML:
//!
//! ```toml
//! [[tier]]
//! name = "chat"
//! ttft_ms = 500
//! tpot_ms = 50
//! weight = 2.0          # optional, default 1.0
//! api_keys = ["sk-chat"] # optional
//! max_concurrent_requests = 64    # optional admission limit (gateway: 429)
//! max_requests_per_minute = 600   # optional admission limit (gateway: 429)
//!
//! [[tier]]
//! name = "batch"
//! background = true     # no SLOs: takes leftover capacity
//! ```

use serde::Deserialize;
use thiserror::Error;

/// Index of a tier in its [`TierSet`] (the order of the config file).
pub type TierId = usize;

#[derive(Debug, Error, PartialEq)]
pub enum TierConfigError {
    #[error("{file}: cannot read tier config: {message}")]
    Io { file: String, message: String },
    #[error("{file}: not a valid tier config: {message}")]
    Parse { file: String, message: String },
    #[error("{file}: tier {tier:?}: field `{field}` = {value}: {reason}")]
    Invalid {
        file: String,
        tier: String,
        field: String,
        value: String,
        reason: String,
    },
    #[error("{file}: {reason}")]
    Set { file: String, reason: String },
}

/// Admission limits of a tier, enforced by the gateway per tier (all keys of
/// the tier together): a request over either gets 429 with Retry-After.
/// `None` means no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TierLimits {
    /// Requests of the tier in flight at once.
    pub max_concurrent_requests: Option<u32>,
    /// Requests admitted per minute (OpenAI's RPM), as a token bucket that
    /// refills continuously and holds one second's worth (at least one).
    pub max_requests_per_minute: Option<f64>,
}

#[derive(Clone, PartialEq)]
pub struct Tier {
    pub name: String,
    /// `None` for background tiers, which have no SLO.
    pub ttft_ms: Option<f64>,
    pub tpot_ms: Option<f64>,
    pub background: bool,
    pub weight: f64,
    pub api_keys: Vec<String>,
    pub limits: TierLimits,
}

/// Written out so that the API keys never show: a tier may be printed
/// (a config's `Debug`, a test's failure) where keys must not be.
impl std::fmt::Debug for Tier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tier")
            .field("name", &self.name)
            .field("ttft_ms", &self.ttft_ms)
            .field("tpot_ms", &self.tpot_ms)
            .field("background", &self.background)
            .field("weight", &self.weight)
            .field("api_keys", &format_args!("<{} redacted>", self.api_keys.len()))
            .field("limits", &self.limits)
            .finish()
    }
}

impl Tier {
    /// When a request arriving at `arrival_s` must start prefilling to meet
    /// the TTFT (infinite without one): the batch policy's deadline.
    pub fn ttft_deadline(&self, arrival_s: f64) -> f64 {
        self.ttft_ms.map_or(f64::INFINITY, |ms| arrival_s + ms / 1e3)
    }

    /// Whether `other`'s requests served under this tier's SLO meet their
    /// own: neither target looser (a background tier has none).
    pub fn meets_slo_of(&self, other: &Tier) -> bool {
        let le = |mine: Option<f64>, theirs: Option<f64>| match (mine, theirs) {
            (_, None) => true,
            (None, Some(_)) => false,
            (Some(a), Some(b)) => a <= b,
        };
        le(self.ttft_ms, other.ttft_ms) && le(self.tpot_ms, other.tpot_ms)
    }

    /// Whether this tier's groups may take `borrower`'s requests when the
    /// borrower's own are full: served here they meet their own SLO, and
    /// they are worth at least as much as this tier's, whose room they take.
    pub fn lends_to(&self, borrower: &Tier) -> bool {
        self.meets_slo_of(borrower) && self.weight <= borrower.weight
    }

    pub fn slo_tier(name: &str, ttft_ms: f64, tpot_ms: f64, weight: f64) -> Self {
        Self {
            name: name.to_string(),
            ttft_ms: Some(ttft_ms),
            tpot_ms: Some(tpot_ms),
            background: false,
            weight,
            api_keys: Vec::new(),
            limits: TierLimits::default(),
        }
    }

    pub fn background_tier(name: &str, weight: f64) -> Self {
        Self {
            name: name.to_string(),
            ttft_ms: None,
            tpot_ms: None,
            background: true,
            weight,
            api_keys: Vec::new(),
            limits: TierLimits::default(),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct TierSet {
    tiers: Vec<Tier>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTierFile {
    tier: Vec<RawTier>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTier {
    name: String,
    ttft_ms: Option<f64>,
    tpot_ms: Option<f64>,
    #[serde(default)]
    background: bool,
    #[serde(default = "default_weight")]
    weight: f64,
    #[serde(default)]
    api_keys: Vec<String>,
    /// Read wide so that 0 or a negative count is reported naming the field.
    max_concurrent_requests: Option<i64>,
    max_requests_per_minute: Option<f64>,
}

fn default_weight() -> f64 {
    1.0
}

impl TierSet {
    pub fn load(path: &str) -> Result<Self, TierConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| TierConfigError::Io {
            file: path.to_string(),
            message: e.to_string(),
        })?;
        Self::from_toml(&text, path)
    }

    pub fn from_toml(text: &str, origin: &str) -> Result<Self, TierConfigError> {
        let raw: RawTierFile = toml::from_str(text).map_err(|e| TierConfigError::Parse {
            file: origin.to_string(),
            message: e.to_string().trim_end().to_string(),
        })?;
        let mut tiers = Vec::with_capacity(raw.tier.len());
        for t in raw.tier {
            let max_concurrent_requests = match t.max_concurrent_requests {
                Some(n) if !(1..=i64::from(u32::MAX)).contains(&n) => {
                    return Err(TierConfigError::Invalid {
                        file: origin.to_string(),
                        tier: t.name,
                        field: "max_concurrent_requests".into(),
                        value: n.to_string(),
                        reason: "must be an integer >= 1 (leave it out for no limit)".into(),
                    })
                }
                n => n.map(|n| n as u32),
            };
            tiers.push(Tier {
                name: t.name,
                ttft_ms: t.ttft_ms,
                tpot_ms: t.tpot_ms,
                background: t.background,
                weight: t.weight,
                api_keys: t.api_keys,
                limits: TierLimits {
                    max_concurrent_requests,
                    max_requests_per_minute: t.max_requests_per_minute,
                },
            });
        }
        Self::new(tiers, origin)
    }

    /// Validates a tier list; `origin` names it in errors.
    pub fn new(tiers: Vec<Tier>, origin: &str) -> Result<Self, TierConfigError> {
        let set_err = |reason: String| TierConfigError::Set {
            file: origin.to_string(),
            reason,
        };
        if tiers.is_empty() {
            return Err(set_err("no tiers: define at least one [[tier]]".into()));
        }
        for (i, t) in tiers.iter().enumerate() {
            let bad = |field: &str, value: String, reason: &str| TierConfigError::Invalid {
                file: origin.to_string(),
                tier: t.name.clone(),
                field: field.to_string(),
                value,
                reason: reason.to_string(),
            };
            let name_ok = !t.name.is_empty() && t.name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
            if !name_ok {
                return Err(bad(
                    "name",
                    format!("{:?}", t.name),
                    "must be non-empty ASCII letters, digits, '-' or '_'",
                ));
            }
            if tiers[..i].iter().any(|o| o.name == t.name) {
                return Err(bad("name", format!("{:?}", t.name), "duplicate tier name"));
            }
            if !(t.weight.is_finite() && t.weight > 0.0) {
                return Err(bad("weight", t.weight.to_string(), "must be a finite number > 0"));
            }
            for (field, v) in [("ttft_ms", t.ttft_ms), ("tpot_ms", t.tpot_ms)] {
                match (t.background, v) {
                    (true, Some(v)) => {
                        return Err(bad(
                            field,
                            v.to_string(),
                            "a background tier has no SLO; remove it or set background = false",
                        ))
                    }
                    (false, None) => return Err(bad(field, "missing".into(), "required for a tier that is not background")),
                    (false, Some(v)) if !(v.is_finite() && v > 0.0) => {
                        return Err(bad(field, v.to_string(), "must be a finite number of milliseconds > 0"))
                    }
                    _ => {}
                }
            }
            if let Some(rpm) = t.limits.max_requests_per_minute {
                if !(rpm.is_finite() && rpm > 0.0) {
                    return Err(bad(
                        "max_requests_per_minute",
                        rpm.to_string(),
                        "must be a finite number > 0 (leave it out for no limit)",
                    ));
                }
            }
            if t.limits.max_concurrent_requests == Some(0) {
                return Err(bad(
                    "max_concurrent_requests",
                    "0".into(),
                    "must be an integer >= 1 (leave it out for no limit)",
                ));
            }
            for key in &t.api_keys {
                if key.trim().is_empty() {
                    return Err(bad("api_keys", format!("{key:?}"), "an API key must not be empty"));
                }
                if let Some(other) = tiers[..=i].iter().find(|o| {
                    let n = o.api_keys.iter().filter(|k| *k == key).count();
                    (o.name == t.name && n > 1) || (o.name != t.name && n > 0)
                }) {
                    // The key itself is not named: the error may end up in a log.
                    return Err(bad(
                        "api_keys",
                        "<redacted>".into(),
                        &format!("key already used by tier {:?}", other.name),
                    ));
                }
            }
        }
        Ok(Self { tiers })
    }

    pub fn tiers(&self) -> &[Tier] {
        &self.tiers
    }

    pub fn len(&self) -> usize {
        self.tiers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tiers.is_empty()
    }

    pub fn get(&self, id: TierId) -> Option<&Tier> {
        self.tiers.get(id)
    }

    /// The tier's id, or an error listing the valid names.
    pub fn id_of(&self, name: &str) -> Result<TierId, String> {
        self.tiers.iter().position(|t| t.name == name).ok_or_else(|| {
            let names: Vec<&str> = self.tiers.iter().map(|t| t.name.as_str()).collect();
            format!("unknown tier {name:?}; valid tiers: {names:?}")
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
        [[tier]]
        name = "chat"
        ttft_ms = 500
        tpot_ms = 50
        weight = 2.0
        api_keys = ["k1"]

        [[tier]]
        name = "batch"
        background = true
    "#;

    #[test]
    fn parses_a_valid_file() {
        let set = TierSet::from_toml(GOOD, "t.toml").unwrap();
        assert_eq!(set.len(), 2);
        assert_eq!(set.tiers()[0].ttft_ms, Some(500.0));
        assert_eq!(set.tiers()[1].weight, 1.0);
        assert!(set.tiers()[1].background);
        assert_eq!(set.id_of("batch"), Ok(1));
        assert!(set.id_of("nope").unwrap_err().contains("valid tiers"));
        assert_eq!(set.tiers()[0].limits, TierLimits::default());
    }

    #[test]
    fn parses_limits() {
        let set = TierSet::from_toml(
            "[[tier]]\nname='a'\nttft_ms=1\ntpot_ms=1\nmax_concurrent_requests=8\nmax_requests_per_minute=90\n",
            "t.toml",
        )
        .unwrap();
        assert_eq!(
            set.tiers()[0].limits,
            TierLimits {
                max_concurrent_requests: Some(8),
                max_requests_per_minute: Some(90.0),
            }
        );
    }

    #[test]
    fn rejects_bad_limits_naming_the_field() {
        let e = err("[[tier]]\nname='a'\nbackground=true\nmax_concurrent_requests=0\n");
        assert!(e.contains("`max_concurrent_requests` = 0") && e.contains("\"a\""), "{e}");
        let e = err("[[tier]]\nname='a'\nbackground=true\nmax_concurrent_requests=-3\n");
        assert!(e.contains("`max_concurrent_requests` = -3"), "{e}");
        let e = err("[[tier]]\nname='a'\nbackground=true\nmax_requests_per_minute=0\n");
        assert!(e.contains("`max_requests_per_minute` = 0"), "{e}");
        let e = err("[[tier]]\nname='a'\nbackground=true\nmax_requests_per_minute=-1.5\n");
        assert!(e.contains("`max_requests_per_minute` = -1.5"), "{e}");
        let e = err("[[tier]]\nname='a'\nbackground=true\nmax_rps=3\n");
        assert!(e.contains("unknown field") && e.contains("max_rps"), "{e}");
    }

    fn err(text: &str) -> String {
        TierSet::from_toml(text, "t.toml").unwrap_err().to_string()
    }

    #[test]
    fn rejects_unknown_fields() {
        let e = err("[[tier]]\nname='a'\nttft_ms=1\ntpot_ms=1\nttft=3\n");
        assert!(e.contains("unknown field") && e.contains("ttft"), "{e}");
    }

    #[test]
    fn rejects_impossible_values_naming_the_field() {
        let e = err("[[tier]]\nname='a'\nttft_ms=-5\ntpot_ms=1\n");
        assert!(e.contains("`ttft_ms` = -5") && e.contains("\"a\""), "{e}");
        let e = err("[[tier]]\nname='a'\nttft_ms=5\ntpot_ms=1\nweight=0\n");
        assert!(e.contains("`weight` = 0"), "{e}");
        let e = err("[[tier]]\nname='a'\ntpot_ms=1\n");
        assert!(e.contains("`ttft_ms` = missing"), "{e}");
        let e = err("[[tier]]\nname='a'\nbackground=true\nttft_ms=3\n");
        assert!(e.contains("background tier has no SLO"), "{e}");
        let e = err("[[tier]]\nname='a b'\nbackground=true\n");
        assert!(e.contains("`name`"), "{e}");
    }

    #[test]
    fn rejects_duplicates() {
        let e = err("[[tier]]\nname='a'\nbackground=true\n[[tier]]\nname='a'\nbackground=true\n");
        assert!(e.contains("duplicate tier name"), "{e}");
        let e = err("[[tier]]\nname='a'\nbackground=true\napi_keys=['sk-dup']\n[[tier]]\nname='b'\nbackground=true\napi_keys=['sk-dup']\n");
        assert!(e.contains("already used by tier \"a\"") && !e.contains("sk-dup"), "{e}");
        let e = err("tier = []\n");
        assert!(e.contains("no tiers"), "{e}");
    }

    #[test]
    fn api_keys_never_show_in_debug_output() {
        let t = TierSet::from_toml("[[tier]]\nname='a'\nbackground=true\napi_keys=['sk-secret', 'sk-other']\n", "t").unwrap();
        let shown = format!("{t:?}");
        assert!(!shown.contains("sk-") && shown.contains("<2 redacted>"), "{shown}");
    }
}
