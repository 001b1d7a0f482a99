//! TP performance profiles: per TP level, prefill latency by (batch tokens,
//! batch size) and decode step latency by (batch size, context length).
//!
//! Loaded once, validated at the boundary (every error names the file, field
//! and value), interpolated bilinearly, clamped outside the profiled range.
//! A clamp above an axis is logged as a warning once per (TP level, table,
//! axis): the edge's value stands for a larger query, which usually costs
//! more, so the estimate may be optimistic. One below an axis is
//! logged at debug level only: a query below an axis is less work than the
//! edge (fewer tokens, requests or context), so the edge's value bounds it
//! from above and the estimate stays on the safe side (the planner probes a
//! one-token prompt, below any grid).

mod error;
mod grid;
pub mod schema;
pub mod synthetic;
mod validate;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

pub use error::ProfileError;
pub use grid::{Clamp, Grid2};
use schema::RawProfile;

/// A profile may hold any TP level up to a node's 8 GPUs (a model with 9
/// heads, like SmolLM2-135M, runs at TP 3). The planner uses the power-of-two
/// levels among them, the only ones that form aligned groups.
pub const MAX_TP_LEVEL: u32 = 8;

#[derive(Debug)]
pub struct TpTable {
    pub tp: u32,
    /// x = batch tokens, y = batch size; milliseconds.
    pub prefill: Grid2,
    /// x = batch size, y = context length; milliseconds.
    pub decode: Grid2,
    pub kv_capacity_tokens: Option<u64>,
    /// One flag per (table, axis, edge) so each clamp is logged once.
    warned: [AtomicBool; 8],
}

/// SGLang's default `chunked_prefill_size`.
pub const SGLANG_CHUNKED_PREFILL_TOKENS: f64 = 8192.0;

#[derive(Debug)]
pub struct Profile {
    pub name: String,
    pub gpu: String,
    pub model: String,
    pub dtype: String,
    pub kv_bytes_per_token: Option<u64>,
    tables: Vec<TpTable>,
    raw: RawProfile,
    clamped_queries: AtomicU64,
}

#[derive(Clone, Copy)]
enum Table {
    Prefill = 0,
    Decode = 1,
}

impl Profile {
    /// Reads and validates a profile file.
    pub fn load(path: &str) -> Result<Self, ProfileError> {
        let text = std::fs::read_to_string(path).map_err(|e| ProfileError::Io {
            file: path.to_string(),
            message: e.to_string(),
        })?;
        Self::from_json(&text, path)
    }

    /// Parses and validates profile JSON; `origin` names it in errors.
    pub fn from_json(text: &str, origin: &str) -> Result<Self, ProfileError> {
        let raw: RawProfile = serde_json::from_str(text).map_err(|e| ProfileError::Parse {
            file: origin.to_string(),
            message: e.to_string(),
        })?;
        Self::from_raw(raw, origin)
    }

    pub fn from_raw(raw: RawProfile, origin: &str) -> Result<Self, ProfileError> {
        let tables = validate::validate(&raw, origin)?
            .into_iter()
            .map(|(tp, prefill, decode, kv)| TpTable {
                tp,
                prefill,
                decode,
                kv_capacity_tokens: kv,
                warned: Default::default(),
            })
            .collect();
        Ok(Self {
            name: format!("{}/{}/{}", raw.gpu, raw.model, raw.dtype),
            gpu: raw.gpu.clone(),
            model: raw.model.clone(),
            dtype: raw.dtype.clone(),
            kv_bytes_per_token: raw.kv_bytes_per_token,
            tables,
            raw,
            clamped_queries: AtomicU64::new(0),
        })
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(&self.raw).expect("a validated profile serializes")
    }

    /// TP levels present, ascending.
    /// Caps of an SLO-agnostic engine at `tp`: the largest batch the profile
    /// covers and SGLang's default chunked-prefill size (8192 tokens),
    /// within the profile. Also what a group that cannot meet its tier's
    /// SLO runs with (best effort at full throughput).
    pub fn throughput_caps(&self, tp: u32) -> Result<(u32, u32), ProfileError> {
        let t = self.table(tp)?;
        let batch = *t.decode.x().last().expect("validated axis") as u32;
        let tokens = (*t.prefill.x().last().expect("validated axis")).min(SGLANG_CHUNKED_PREFILL_TOKENS) as u32;
        Ok((batch.max(1), tokens.max(1)))
    }

    pub fn tp_levels(&self) -> Vec<u32> {
        self.tables.iter().map(|t| t.tp).collect()
    }

    pub fn table(&self, tp: u32) -> Result<&TpTable, ProfileError> {
        self.tables.iter().find(|t| t.tp == tp).ok_or_else(|| ProfileError::MissingTp {
            profile: self.name.clone(),
            tp,
            available: self.tp_levels(),
        })
    }

    /// Queries that fell outside the profiled range so far.
    pub fn clamped_queries(&self) -> u64 {
        self.clamped_queries.load(Ordering::Relaxed)
    }

    /// Prefill batch time in ms at `tp` for `batch_tokens` tokens over
    /// `batch_size` prompts. Panics if `tp` is not in the profile: callers
    /// enumerate `tp_levels()`.
    pub fn prefill_ms(&self, tp: u32, batch_tokens: f64, batch_size: f64) -> f64 {
        let t = self.expect_table(tp);
        let hit = t.prefill.at(batch_tokens, batch_size);
        self.note_clamp(t, Table::Prefill, hit.x_clamp, hit.y_clamp, batch_tokens, batch_size);
        hit.value
    }

    /// Decode step time in ms at `tp` for `batch_size` requests of mean
    /// context `context_len`.
    pub fn decode_ms(&self, tp: u32, batch_size: f64, context_len: f64) -> f64 {
        let t = self.expect_table(tp);
        let hit = t.decode.at(batch_size, context_len);
        self.note_clamp(t, Table::Decode, hit.x_clamp, hit.y_clamp, batch_size, context_len);
        hit.value
    }

    fn expect_table(&self, tp: u32) -> &TpTable {
        match self.table(tp) {
            Ok(t) => t,
            Err(e) => panic!("{e}"),
        }
    }

    fn note_clamp(&self, t: &TpTable, table: Table, xc: Clamp, yc: Clamp, x: f64, y: f64) {
        if xc == Clamp::Inside && yc == Clamp::Inside {
            return;
        }
        self.clamped_queries.fetch_add(1, Ordering::Relaxed);
        let (grid, names) = match table {
            Table::Prefill => (&t.prefill, ["batch_tokens", "batch_size"]),
            Table::Decode => (&t.decode, ["batch_size", "context_len"]),
        };
        for (axis, (clamp, q, values)) in [(xc, x, grid.x()), (yc, y, grid.y())].into_iter().enumerate() {
            let edge = match clamp {
                Clamp::Inside => continue,
                Clamp::Below => 0,
                Clamp::Above => 1,
            };
            let flag = &t.warned[(table as usize) * 4 + axis * 2 + edge];
            if !flag.swap(true, Ordering::Relaxed) {
                let level = if clamp == Clamp::Above {
                    log::Level::Warn
                } else {
                    log::Level::Debug
                };
                log::log!(
                    level,
                    "profile {}: TP{} {} {}={} outside the profiled range [{}, {}]; clamped \
                     (further clamps on this axis are not logged)",
                    self.name,
                    t.tp,
                    match table {
                        Table::Prefill => "prefill",
                        Table::Decode => "decode",
                    },
                    names[axis],
                    q,
                    values[0],
                    values[values.len() - 1],
                );
            }
        }
    }
}
