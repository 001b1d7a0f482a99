//! The on-disk profile format (JSON), exactly as written. `validate` turns it
//! into the checked, interpolation-ready [`super::Profile`].
//!
//! ```json
//! { "format": "tiertp-profile", "version": 1,
//!   "gpu": "h100_sxm", "model": "llama-3.1-8b", "dtype": "bfloat16",
//!   "kv_bytes_per_token": 131072,            // optional: all layers, all KV heads
//!   "provenance": { ... },                   // optional, free-form
//!   "tp_levels": {
//!     "1": { "prefill": { "batch_tokens": [..], "batch_size": [..],
//!                         "latency_ms": [[..batch_size..] per batch_tokens],
//!                         "spread_ms": [[..]] },          // optional
//!            "decode":  { "batch_size": [..], "context_len": [..],
//!                         "latency_ms": [[..context_len..] per batch_size],
//!                         "spread_ms": [[..]] },          // optional
//!            "kv_capacity_tokens": 500000 } } }        // optional, per group
//! ```

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub const FORMAT_NAME: &str = "tiertp-profile";
pub const FORMAT_VERSION: u32 = 1;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawProfile {
    pub format: String,
    pub version: u32,
    pub gpu: String,
    pub model: String,
    pub dtype: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_bytes_per_token: Option<u64>,
    #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
    pub provenance: serde_json::Value,
    pub tp_levels: BTreeMap<String, RawTpLevel>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTpLevel {
    pub prefill: RawPrefill,
    pub decode: RawDecode,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_capacity_tokens: Option<u64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPrefill {
    pub batch_tokens: Vec<f64>,
    pub batch_size: Vec<f64>,
    pub latency_ms: Vec<Vec<f64>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spread_ms: Option<Vec<Vec<f64>>>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDecode {
    pub batch_size: Vec<f64>,
    pub context_len: Vec<f64>,
    pub latency_ms: Vec<Vec<f64>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spread_ms: Option<Vec<Vec<f64>>>,
}
