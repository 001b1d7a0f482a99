//! Checks a parsed profile and builds its interpolation grids.

use super::grid::Grid2;
use super::schema::{RawProfile, FORMAT_NAME, FORMAT_VERSION};
use super::{ProfileError, MAX_TP_LEVEL};

type Level = (u32, Grid2, Grid2, Option<u64>);

struct Ctx<'a> {
    file: &'a str,
}

impl Ctx<'_> {
    fn err(&self, field: impl Into<String>, value: impl ToString, reason: impl Into<String>) -> ProfileError {
        ProfileError::Invalid {
            file: self.file.to_string(),
            field: field.into(),
            value: value.to_string(),
            reason: reason.into(),
        }
    }

    fn axis(&self, field: &str, axis: &[f64]) -> Result<(), ProfileError> {
        if axis.is_empty() {
            return Err(self.err(field, "[]", "axis is empty"));
        }
        for (i, &v) in axis.iter().enumerate() {
            if !v.is_finite() || v <= 0.0 {
                return Err(self.err(format!("{field}[{i}]"), v, "must be a finite number > 0"));
            }
            if i > 0 && v <= axis[i - 1] {
                return Err(self.err(
                    format!("{field}[{i}]"),
                    v,
                    format!("axis must be strictly increasing (previous value {})", axis[i - 1]),
                ));
            }
        }
        Ok(())
    }

    /// `allow_zero`: spreads may be 0 (a perfectly repeatable measurement);
    /// latencies may not.
    fn matrix(&self, field: &str, m: &[Vec<f64>], rows: usize, cols: usize, allow_zero: bool) -> Result<(), ProfileError> {
        if m.len() != rows {
            return Err(self.err(
                field,
                format!("{} rows", m.len()),
                format!("expected {rows} rows, one per x-axis value"),
            ));
        }
        for (i, row) in m.iter().enumerate() {
            if row.len() != cols {
                return Err(self.err(
                    format!("{field}[{i}]"),
                    format!("{} values", row.len()),
                    format!("expected {cols} values, one per y-axis value"),
                ));
            }
            for (j, &v) in row.iter().enumerate() {
                let ok = v.is_finite() && (v > 0.0 || (allow_zero && v == 0.0));
                if !ok {
                    let bound = if allow_zero { ">= 0" } else { "> 0" };
                    return Err(self.err(format!("{field}[{i}][{j}]"), v, format!("must be a finite number {bound}")));
                }
            }
        }
        Ok(())
    }
}

pub(super) fn validate(raw: &RawProfile, file: &str) -> Result<Vec<Level>, ProfileError> {
    let c = Ctx { file };
    if raw.format != FORMAT_NAME {
        return Err(c.err("format", format!("{:?}", raw.format), format!("expected \"{FORMAT_NAME}\"")));
    }
    if raw.version != FORMAT_VERSION {
        return Err(c.err(
            "version",
            raw.version,
            format!("unsupported version; this build reads version {FORMAT_VERSION}"),
        ));
    }
    for (field, v) in [("gpu", &raw.gpu), ("model", &raw.model), ("dtype", &raw.dtype)] {
        if v.trim().is_empty() {
            return Err(c.err(field, "\"\"", "must not be empty"));
        }
    }
    if raw.kv_bytes_per_token == Some(0) {
        return Err(c.err("kv_bytes_per_token", 0, "must be > 0"));
    }
    if raw.tp_levels.is_empty() {
        return Err(c.err("tp_levels", "{}", "no TP levels; at least TP 1 is needed"));
    }
    let mut levels = Vec::with_capacity(raw.tp_levels.len());
    for (key, level) in &raw.tp_levels {
        let tp: u32 = key.parse().ok().filter(|tp| (1..=MAX_TP_LEVEL).contains(tp)).ok_or_else(|| {
            c.err(
                format!("tp_levels.{key}"),
                format!("{key:?}"),
                format!("TP level must be an integer from 1 to {MAX_TP_LEVEL}"),
            )
        })?;
        let p = &level.prefill;
        let base = format!("tp_levels.{key}.prefill");
        c.axis(&format!("{base}.batch_tokens"), &p.batch_tokens)?;
        c.axis(&format!("{base}.batch_size"), &p.batch_size)?;
        c.matrix(
            &format!("{base}.latency_ms"),
            &p.latency_ms,
            p.batch_tokens.len(),
            p.batch_size.len(),
            false,
        )?;
        if let Some(s) = &p.spread_ms {
            c.matrix(&format!("{base}.spread_ms"), s, p.batch_tokens.len(), p.batch_size.len(), true)?;
        }
        let d = &level.decode;
        let base = format!("tp_levels.{key}.decode");
        c.axis(&format!("{base}.batch_size"), &d.batch_size)?;
        c.axis(&format!("{base}.context_len"), &d.context_len)?;
        c.matrix(
            &format!("{base}.latency_ms"),
            &d.latency_ms,
            d.batch_size.len(),
            d.context_len.len(),
            false,
        )?;
        if let Some(s) = &d.spread_ms {
            c.matrix(&format!("{base}.spread_ms"), s, d.batch_size.len(), d.context_len.len(), true)?;
        }
        if level.kv_capacity_tokens == Some(0) {
            return Err(c.err(format!("tp_levels.{key}.kv_capacity_tokens"), 0, "must be > 0"));
        }
        levels.push((
            tp,
            Grid2::new(p.batch_tokens.clone(), p.batch_size.clone(), &p.latency_ms),
            Grid2::new(d.batch_size.clone(), d.context_len.clone(), &d.latency_ms),
            level.kv_capacity_tokens,
        ));
    }
    levels.sort_by_key(|l| l.0);
    Ok(levels)
}
