//! Sampling defaults: the `temperature` and `top_p` a request gets when it
//! gives none. OpenAI's API defaults both to 1.0; SGLang and vLLM instead
//! take the model's own recommendation from its `generation_config.json`
//! (Hugging Face's format), which is what `tiertp serve` does unless told
//! `--sampling-defaults openai`.

use std::fmt;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};
use thiserror::Error;

/// The file of a model directory that holds its sampling recommendation.
pub const GENERATION_CONFIG: &str = "generation_config.json";

/// The range a request's `temperature` may take (and so a default's).
pub const TEMPERATURE_RANGE: (f64, f64) = (0.0, 2.0);
/// The range a request's `top_p` may take (and so a default's).
pub const TOP_P_RANGE: (f64, f64) = (0.0, 1.0);

#[derive(Debug, Error, PartialEq)]
pub enum SamplingError {
    #[error("{path}: {message}")]
    File { path: PathBuf, message: String },
    #[error("{path}: `{field}` {message}")]
    Field {
        path: PathBuf,
        field: &'static str,
        message: String,
    },
    #[error("sampling defaults {0:?}: must be one of {names}", names = SamplingSource::NAMES.join(", "))]
    UnknownSource(String),
}

/// The sampling parameters a request that omits them gets.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingDefaults {
    pub temperature: f64,
    pub top_p: f64,
}

impl Default for SamplingDefaults {
    fn default() -> Self {
        Self::OPENAI
    }
}

impl SamplingDefaults {
    /// OpenAI's API defaults.
    pub const OPENAI: Self = Self {
        temperature: 1.0,
        top_p: 1.0,
    };

    /// The defaults of the model in `dir`, from its `generation_config.json`
    /// (Hugging Face semantics): `temperature` and `top_p` where given, and
    /// `do_sample: false` means greedy (temperature 0). No file, or a field
    /// it does not give: OpenAI's value for that field. A file that is not
    /// a JSON object, or a value of the wrong type or out of the range a
    /// request could give, is an error naming the file and the field.
    pub fn from_model_dir(dir: &Path) -> Result<Self, SamplingError> {
        let path = dir.join(GENERATION_CONFIG);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Self::OPENAI),
            Err(e) => {
                return Err(SamplingError::File {
                    path,
                    message: format!("cannot read it: {e}"),
                })
            }
        };
        let obj = match serde_json::from_str::<Value>(&text) {
            Ok(Value::Object(o)) => o,
            Ok(_) => {
                return Err(SamplingError::File {
                    path,
                    message: "must be a JSON object".into(),
                })
            }
            Err(e) => {
                return Err(SamplingError::File {
                    path,
                    message: format!("not valid JSON: {e}"),
                })
            }
        };
        let field_err = |field: &'static str, message: String| SamplingError::Field {
            path: path.clone(),
            field,
            message,
        };
        let number = |field: &'static str, (lo, hi): (f64, f64), default: f64| match obj.get(field) {
            None | Some(Value::Null) => Ok(default),
            Some(v) => match v.as_f64() {
                Some(x) if (lo..=hi).contains(&x) => Ok(x),
                _ => Err(field_err(field, format!("must be a number from {lo} to {hi}, got {v}"))),
            },
        };
        let temperature = number("temperature", TEMPERATURE_RANGE, Self::OPENAI.temperature)?;
        let top_p = number("top_p", TOP_P_RANGE, Self::OPENAI.top_p)?;
        let do_sample = do_sample(&obj).map_err(|v| field_err("do_sample", format!("must be a boolean, got {v}")))?;
        Ok(Self {
            temperature: if do_sample == Some(false) { 0.0 } else { temperature },
            top_p,
        })
    }

    /// Whether both values lie in the ranges a request could give.
    pub fn check(&self) -> Result<(), String> {
        for (field, x, (lo, hi)) in [
            ("temperature", self.temperature, TEMPERATURE_RANGE),
            ("top_p", self.top_p, TOP_P_RANGE),
        ] {
            if !(lo..=hi).contains(&x) {
                return Err(format!("default {field} = {x}: must be from {lo} to {hi}"));
            }
        }
        Ok(())
    }

    /// The defaults `source` names, for the model in `model_dir`.
    pub fn load(source: SamplingSource, model_dir: &Path) -> Result<Self, SamplingError> {
        match source {
            SamplingSource::Model => Self::from_model_dir(model_dir),
            SamplingSource::OpenAi => Ok(Self::OPENAI),
        }
    }
}

fn do_sample(obj: &Map<String, Value>) -> Result<Option<bool>, &Value> {
    match obj.get("do_sample") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(v) => Err(v),
    }
}

/// Where the sampling defaults come from (`tiertp serve --sampling-defaults`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SamplingSource {
    /// The model's `generation_config.json` (as SGLang and vLLM do).
    #[default]
    Model,
    /// OpenAI's API defaults (temperature 1, top_p 1).
    OpenAi,
}

impl SamplingSource {
    /// The names `parse` accepts, in order.
    pub const NAMES: [&'static str; 2] = ["model", "openai"];

    pub fn parse(name: &str) -> Result<Self, SamplingError> {
        match name {
            "model" => Ok(Self::Model),
            "openai" => Ok(Self::OpenAi),
            _ => Err(SamplingError::UnknownSource(name.to_string())),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Model => Self::NAMES[0],
            Self::OpenAi => Self::NAMES[1],
        }
    }
}

impl fmt::Display for SamplingSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh directory under the system temp dir, removed on drop.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(name: &str) -> Self {
            let dir = std::env::temp_dir().join(format!("tiertp-sampling-{}-{name}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            Self(dir)
        }
        fn with_config(name: &str, text: &str) -> Self {
            let d = Self::new(name);
            std::fs::write(d.0.join(GENERATION_CONFIG), text).unwrap();
            d
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn load(name: &str, text: &str) -> Result<SamplingDefaults, SamplingError> {
        SamplingDefaults::from_model_dir(&TempDir::with_config(name, text).0)
    }

    fn field_of(e: SamplingError) -> &'static str {
        match e {
            SamplingError::Field { field, .. } => field,
            other => panic!("expected a field error, got {other}"),
        }
    }

    #[test]
    fn no_file_gives_openai_defaults() {
        let d = TempDir::new("none");
        assert_eq!(SamplingDefaults::from_model_dir(&d.0), Ok(SamplingDefaults::OPENAI));
        assert_eq!(SamplingDefaults::default(), SamplingDefaults::OPENAI);
        assert_eq!((SamplingDefaults::OPENAI.temperature, SamplingDefaults::OPENAI.top_p), (1.0, 1.0));
    }

    #[test]
    fn reads_the_models_recommendation() {
        let d = load(
            "full",
            r#"{"bos_token_id": 1, "eos_token_id": 2, "do_sample": true, "temperature": 0.2, "top_p": 0.9}"#,
        )
        .unwrap();
        assert_eq!(
            d,
            SamplingDefaults {
                temperature: 0.2,
                top_p: 0.9
            }
        );
    }

    #[test]
    fn absent_fields_take_openais_values() {
        assert_eq!(load("empty", "{}").unwrap(), SamplingDefaults::OPENAI);
        assert_eq!(
            load("temp", r#"{"temperature": 0.6}"#).unwrap(),
            SamplingDefaults {
                temperature: 0.6,
                top_p: 1.0
            }
        );
        assert_eq!(
            load("top_p", r#"{"top_p": 0.95, "temperature": null}"#).unwrap(),
            SamplingDefaults {
                temperature: 1.0,
                top_p: 0.95
            }
        );
        // Integers are numbers too.
        assert_eq!(load("ints", r#"{"temperature": 1, "top_p": 1}"#).unwrap(), SamplingDefaults::OPENAI);
    }

    #[test]
    fn do_sample_false_is_greedy() {
        assert_eq!(
            load("greedy", r#"{"do_sample": false, "temperature": 0.7, "top_p": 0.8}"#).unwrap(),
            SamplingDefaults {
                temperature: 0.0,
                top_p: 0.8
            }
        );
        assert_eq!(
            load("greedy2", r#"{"do_sample": false}"#).unwrap(),
            SamplingDefaults {
                temperature: 0.0,
                top_p: 1.0
            }
        );
    }

    #[test]
    fn bad_values_name_the_file_and_field() {
        for (name, text, field) in [
            ("hot", r#"{"temperature": 2.5}"#, "temperature"),
            ("neg", r#"{"temperature": -0.1}"#, "temperature"),
            ("str", r#"{"temperature": "0.2"}"#, "temperature"),
            ("top_p_high", r#"{"top_p": 1.5}"#, "top_p"),
            ("sample", r#"{"do_sample": "yes"}"#, "do_sample"),
        ] {
            let e = load(name, text).unwrap_err();
            let msg = e.to_string();
            assert!(msg.contains(GENERATION_CONFIG) && msg.contains(&format!("`{field}`")), "{msg}");
            assert_eq!(field_of(e), field, "{text}");
        }
    }

    #[test]
    fn malformed_json_names_the_file() {
        for (name, text) in [("broken", "{\"temperature\": "), ("array", "[0.2, 0.9]")] {
            let e = load(name, text).unwrap_err();
            assert!(matches!(e, SamplingError::File { .. }), "{e}");
            assert!(e.to_string().contains(GENERATION_CONFIG), "{e}");
        }
    }

    #[test]
    fn sources_parse_by_name() {
        assert_eq!(SamplingSource::parse("model"), Ok(SamplingSource::Model));
        assert_eq!(SamplingSource::parse("openai"), Ok(SamplingSource::OpenAi));
        assert_eq!(SamplingSource::default(), SamplingSource::Model);
        for s in [SamplingSource::Model, SamplingSource::OpenAi] {
            assert_eq!(SamplingSource::parse(s.name()), Ok(s));
        }
        let e = SamplingSource::parse("vllm").unwrap_err().to_string();
        assert!(e.contains("\"vllm\"") && e.contains("model, openai"), "{e}");
    }

    #[test]
    fn load_follows_the_source() {
        let d = TempDir::with_config("source", r#"{"temperature": 0.2, "top_p": 0.9}"#);
        assert_eq!(
            SamplingDefaults::load(SamplingSource::Model, &d.0),
            Ok(SamplingDefaults {
                temperature: 0.2,
                top_p: 0.9
            })
        );
        assert_eq!(SamplingDefaults::load(SamplingSource::OpenAi, &d.0), Ok(SamplingDefaults::OPENAI));
    }

    #[test]
    fn requests_take_the_defaults_only_where_they_omit_a_field() {
        use crate::openai::{parse, Endpoint};
        let model = SamplingDefaults {
            temperature: 0.2,
            top_p: 0.9,
        };
        let get = |body: &str| {
            let r = parse(body.as_bytes(), Endpoint::Completions, &model).unwrap();
            (r.temperature, r.top_p)
        };
        assert_eq!(get(r#"{"model":"m","prompt":"x"}"#), (0.2, 0.9));
        assert_eq!(get(r#"{"model":"m","prompt":"x","temperature":null}"#), (0.2, 0.9));
        assert_eq!(get(r#"{"model":"m","prompt":"x","temperature":1.3}"#), (1.3, 0.9));
        assert_eq!(get(r#"{"model":"m","prompt":"x","temperature":0,"top_p":1}"#), (0.0, 1.0));
        let r = parse(br#"{"model":"m","prompt":"x"}"#, Endpoint::Completions, &SamplingDefaults::OPENAI).unwrap();
        assert_eq!((r.temperature, r.top_p), (1.0, 1.0));
    }

    #[test]
    fn check_bounds_both_values() {
        assert_eq!(SamplingDefaults::OPENAI.check(), Ok(()));
        assert_eq!(
            SamplingDefaults {
                temperature: 0.0,
                top_p: 0.0
            }
            .check(),
            Ok(())
        );
        let e = SamplingDefaults {
            temperature: 3.0,
            top_p: 1.0,
        }
        .check()
        .unwrap_err();
        assert!(e.contains("temperature"), "{e}");
        let e = SamplingDefaults {
            temperature: 1.0,
            top_p: f64::NAN,
        }
        .check()
        .unwrap_err();
        assert!(e.contains("top_p"), "{e}");
    }
}
