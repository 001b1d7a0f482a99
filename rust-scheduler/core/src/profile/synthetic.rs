//! An analytic roofline profile of a Llama-3.1-8B-shaped model on an
//! H100-class GPU. It is not a measurement: tests, benchmarks and demos use
//! it where a real table (`tiertp profile`, or the shipped default tables)
//! is not at hand, because it has the shape the planner relies on (higher TP
//! cuts latency; all-reduce and fixed costs make it cost more per GPU).

use std::collections::BTreeMap;

use super::schema::{RawDecode, RawPrefill, RawProfile, RawTpLevel, FORMAT_NAME, FORMAT_VERSION};
use super::Profile;

const PARAMS: f64 = 8.0e9;
const LAYERS: f64 = 32.0;
const HIDDEN: f64 = 4096.0;
const KV_BYTES_PER_TOKEN: f64 = 131_072.0; // 32 layers x 8 KV heads x 128 dim x 2 (K,V) x 2 bytes
const HBM_BYTES_PER_S: f64 = 3.0e12;
const FLOPS: f64 = 4.0e14;
const GPU_MEMORY_BYTES: f64 = 80.0e9;
const STEP_OVERHEAD_MS: f64 = 0.6;
const ALLREDUCE_LATENCY_MS: f64 = 0.012;
const LINK_BYTES_PER_S: f64 = 1.5e11;

fn allreduce_ms(tp: f64, tokens: f64) -> f64 {
    if tp <= 1.0 {
        return 0.0;
    }
    let bytes = tokens * HIDDEN * 2.0 * 2.0 * (tp - 1.0) / tp;
    2.0 * LAYERS * (ALLREDUCE_LATENCY_MS + bytes / LINK_BYTES_PER_S * 1e3)
}

/// Prefill time of `tokens` prompt tokens in `prompts` equal prompts.
pub fn prefill_model_ms(tp: f64, tokens: f64, prompts: f64) -> f64 {
    let per_prompt = tokens / prompts.max(1.0);
    let linear = 2.0 * PARAMS * tokens / FLOPS;
    let attention = 4.0 * LAYERS * HIDDEN * per_prompt * per_prompt * prompts.max(1.0) / FLOPS;
    let weights = PARAMS * 2.0 / HBM_BYTES_PER_S;
    STEP_OVERHEAD_MS + ((linear + attention) / tp).max(weights / tp) * 1e3 + allreduce_ms(tp, tokens)
}

/// One decode step for `batch` requests of mean context `context`.
pub fn decode_model_ms(tp: f64, batch: f64, context: f64) -> f64 {
    let weights = PARAMS * 2.0 / HBM_BYTES_PER_S;
    let kv = batch * context * KV_BYTES_PER_TOKEN / HBM_BYTES_PER_S;
    let compute = 2.0 * PARAMS * batch / FLOPS;
    STEP_OVERHEAD_MS + ((weights + kv) / tp).max(compute / tp) * 1e3 + allreduce_ms(tp, batch)
}

pub fn raw_llama8b_like(tp_levels: &[u32]) -> RawProfile {
    let batch_tokens: Vec<f64> = (0..=15).map(|p| f64::from(1u32 << p)).collect();
    let prefill_sizes: Vec<f64> = (0..=6).map(|p| f64::from(1u32 << p)).collect();
    let decode_sizes: Vec<f64> = (0..=9).map(|p| f64::from(1u32 << p)).collect();
    let contexts: Vec<f64> = (7..=15).map(|p| f64::from(1u32 << p)).collect();
    let mut levels = BTreeMap::new();
    for &tp in tp_levels {
        let k = f64::from(tp);
        let prefill = batch_tokens
            .iter()
            .map(|&b| prefill_sizes.iter().map(|&s| prefill_model_ms(k, b, s.min(b))).collect())
            .collect();
        let decode = decode_sizes
            .iter()
            .map(|&b| contexts.iter().map(|&c| decode_model_ms(k, b, c)).collect())
            .collect();
        let free_bytes = k * GPU_MEMORY_BYTES * 0.9 - PARAMS * 2.0;
        levels.insert(
            tp.to_string(),
            RawTpLevel {
                prefill: RawPrefill {
                    batch_tokens: batch_tokens.clone(),
                    batch_size: prefill_sizes.clone(),
                    latency_ms: prefill,
                    spread_ms: None,
                },
                decode: RawDecode {
                    batch_size: decode_sizes.clone(),
                    context_len: contexts.clone(),
                    latency_ms: decode,
                    spread_ms: None,
                },
                kv_capacity_tokens: Some((free_bytes / KV_BYTES_PER_TOKEN) as u64),
            },
        );
    }
    RawProfile {
        format: FORMAT_NAME.to_string(),
        version: FORMAT_VERSION,
        gpu: "synthetic-h100".to_string(),
        model: "llama-8b-like".to_string(),
        dtype: "bfloat16".to_string(),
        kv_bytes_per_token: Some(KV_BYTES_PER_TOKEN as u64),
        provenance: serde_json::json!({
            "source": "analytic roofline model in tiertp-scheduler (profile::synthetic); not a measurement"
        }),
        tp_levels: levels,
    }
}

/// The analytic profile at TP 1/2/4/8.
pub fn llama8b_like() -> Profile {
    Profile::from_raw(raw_llama8b_like(&[1, 2, 4, 8]), "<synthetic llama-8b-like>").expect("the synthetic profile is valid")
}

/// Axes of a tabulated profile.
pub struct Axes<'a> {
    pub prefill_tokens: &'a [f64],
    pub prefill_sizes: &'a [f64],
    pub decode_sizes: &'a [f64],
    pub decode_contexts: &'a [f64],
}

/// Two points per axis: enough for latency functions linear along each,
/// which interpolate exactly (the hand-computed cases of the tests).
pub const LINEAR_AXES: Axes<'static> = Axes {
    prefill_tokens: &[100.0, 1000.0],
    prefill_sizes: &[1.0, 10.0],
    decode_sizes: &[1.0, 64.0],
    decode_contexts: &[100.0, 10_000.0],
};

/// Tabulates latency functions `prefill(tp, tokens, size)` and
/// `decode(tp, batch, context)` (ms) into a validated profile.
pub fn tabulate(
    tp_levels: &[u32],
    axes: &Axes,
    prefill: impl Fn(u32, f64, f64) -> f64,
    decode: impl Fn(u32, f64, f64) -> f64,
    kv_capacity_tokens: Option<u64>,
) -> Profile {
    let mut levels = BTreeMap::new();
    for &tp in tp_levels {
        levels.insert(
            tp.to_string(),
            RawTpLevel {
                prefill: RawPrefill {
                    batch_tokens: axes.prefill_tokens.to_vec(),
                    batch_size: axes.prefill_sizes.to_vec(),
                    latency_ms: axes
                        .prefill_tokens
                        .iter()
                        .map(|&b| axes.prefill_sizes.iter().map(|&s| prefill(tp, b, s)).collect())
                        .collect(),
                    spread_ms: None,
                },
                decode: RawDecode {
                    batch_size: axes.decode_sizes.to_vec(),
                    context_len: axes.decode_contexts.to_vec(),
                    latency_ms: axes
                        .decode_sizes
                        .iter()
                        .map(|&b| axes.decode_contexts.iter().map(|&c| decode(tp, b, c)).collect())
                        .collect(),
                    spread_ms: None,
                },
                kv_capacity_tokens,
            },
        );
    }
    let raw = RawProfile {
        format: FORMAT_NAME.to_string(),
        version: FORMAT_VERSION,
        gpu: "test".to_string(),
        model: "test".to_string(),
        dtype: "float32".to_string(),
        kv_bytes_per_token: None,
        provenance: serde_json::Value::Null,
        tp_levels: levels,
    };
    Profile::from_raw(raw, "<tabulated>").expect("tabulated profile is valid")
}
