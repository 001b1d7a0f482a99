//! API key → tier, found in constant time: a lookup whose time depended on
//! how much of a guess matched a real key (a hash map's probe, a
//! byte-by-byte `==`) would let a client find a key one byte at a time.
//! Every key is kept as its SHA-256 digest; a presented key is hashed (time
//! depends only on its length, which is no secret) and compared with every
//! digest, each comparison constant-time and none skipped.

use std::fmt;

use sha2::{Digest, Sha256};
use subtle::{ConditionallySelectable, ConstantTimeEq};
use tiertp_scheduler::tiers::{TierId, TierSet};

pub struct ApiKeys {
    digests: Vec<([u8; 32], TierId)>,
}

fn digest(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

impl ApiKeys {
    pub fn new(tiers: &TierSet) -> Self {
        let digests = tiers
            .tiers()
            .iter()
            .enumerate()
            .flat_map(|(id, t)| t.api_keys.iter().map(move |k| (digest(k), id)))
            .collect();
        Self { digests }
    }

    /// The tier whose key `key` is, if any.
    pub fn tier_of(&self, key: &str) -> Option<TierId> {
        let presented = digest(key);
        let mut found = subtle::Choice::from(0);
        let mut tier = 0u64;
        for (d, id) in &self.digests {
            let hit = d.ct_eq(&presented);
            tier.conditional_assign(&(*id as u64), hit);
            found |= hit;
        }
        bool::from(found).then_some(tier as TierId)
    }
}

/// Digests only, but still not for printing.
impl fmt::Debug for ApiKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ApiKeys(<{} redacted>)", self.digests.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_finds_its_tier_and_near_misses_find_none() {
        let tiers = TierSet::from_toml(
            "[[tier]]\nname='a'\nbackground=true\napi_keys=['sk-alpha', 'sk-alpha-2']\n\
             [[tier]]\nname='b'\nbackground=true\napi_keys=['sk-beta']\n[[tier]]\nname='c'\nbackground=true\n",
            "t",
        )
        .unwrap();
        let keys = ApiKeys::new(&tiers);
        assert_eq!(
            ["sk-alpha", "sk-alpha-2", "sk-beta"].map(|k| keys.tier_of(k)),
            [Some(0), Some(0), Some(1)]
        );
        for miss in ["", "sk-alph", "sk-alpha ", "sk-alpha-", "SK-ALPHA", "sk-beta\0", "sk-gamma"] {
            assert_eq!(keys.tier_of(miss), None, "{miss:?}");
        }
        assert_eq!(format!("{keys:?}"), "ApiKeys(<3 redacted>)");
    }
}
