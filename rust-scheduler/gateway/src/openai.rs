//! OpenAI request parsing (every bad field is named in the 400) and response
//! bodies (`response`) for `/v1/completions` and `/v1/chat/completions`.
//! The request schemas of `/openapi.json` (`openapi::requests`) state the
//! rules `parse` enforces, from the constants here.

mod models;
mod response;

use std::ops::RangeInclusive;

pub use models::ModelList;
pub use response::{ChatCompletion, ChatCompletionChunk, Completion, Envelope, FinishReason, Usage};
use serde_json::{Map, Value};

use crate::error::ApiError;
use crate::sampling::{SamplingDefaults, TEMPERATURE_RANGE, TOP_P_RANGE};
use crate::tokenize::ChatMessage;

/// OpenAI allows at most this many stop strings.
pub const MAX_STOP_STRINGS: usize = 4;

/// The roles a chat message may have.
pub const ROLES: [&str; 5] = ["system", "developer", "user", "assistant", "tool"];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Completions,
    Chat,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    Text(String),
    Ids(Vec<u32>),
    Chat(Vec<ChatMessage>),
}

#[derive(Debug, Clone, PartialEq)]
pub struct GenRequest {
    pub model: String,
    pub prompt: Prompt,
    pub max_tokens: Option<u32>,
    /// The field `max_tokens` came from (a context-length error names it).
    pub max_tokens_param: &'static str,
    pub temperature: f64,
    pub top_p: f64,
    pub seed: Option<u64>,
    pub stop: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
}

fn bad(param: &str, msg: String) -> ApiError {
    ApiError::bad_param(param, msg)
}

fn opt<'a>(obj: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    obj.get(key).filter(|v| !v.is_null())
}

fn number(obj: &Map<String, Value>, key: &str, (lo, hi): (f64, f64), default: f64) -> Result<f64, ApiError> {
    match opt(obj, key) {
        None => Ok(default),
        Some(v) => match v.as_f64() {
            Some(x) if (lo..=hi).contains(&x) => Ok(x),
            _ => Err(bad(key, format!("`{key}` must be a number from {lo} to {hi}, got {v}"))),
        },
    }
}

fn boolean(obj: &Map<String, Value>, key: &str) -> Result<bool, ApiError> {
    match opt(obj, key) {
        None => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(v) => Err(bad(key, format!("`{key}` must be a boolean, got {v}"))),
    }
}

/// Integers a float holds exactly: a larger one may have been rounded on
/// parsing (`-9223372036854775809` reads as `i64::MIN`).
const EXACT_IN_FLOAT: f64 = 9_007_199_254_740_992.0;

/// A JSON number without a fractional part, as JSON Schema's `integer`
/// (which `2.0` is too, so the request schemas hold for what is parsed).
fn integer(v: &Value) -> Option<i128> {
    let Value::Number(n) = v else { return None };
    n.as_i64().map(i128::from).or_else(|| n.as_u64().map(i128::from)).or_else(|| {
        n.as_f64()
            .filter(|x| x.fract() == 0.0 && x.abs() < EXACT_IN_FLOAT)
            .map(|x| x as i128)
    })
}

/// `v` as an integer in `range`.
fn integer_in<T: TryFrom<i128> + PartialOrd>(v: &Value, range: RangeInclusive<T>) -> Option<T> {
    integer(v).and_then(|n| T::try_from(n).ok()).filter(|n| range.contains(n))
}

fn positive_int(obj: &Map<String, Value>, key: &str) -> Result<Option<u32>, ApiError> {
    match opt(obj, key) {
        None => Ok(None),
        Some(v) => match integer_in(v, 1..=u32::MAX) {
            Some(n) => Ok(Some(n)),
            None => Err(bad(key, format!("`{key}` must be an integer from 1 to {}, got {v}", u32::MAX))),
        },
    }
}

/// Log probabilities are not computed by the workers: a request asking for
/// them is refused rather than answered without them. Asking is
/// `logprobs` > 0 or true (completions: a count), `logprobs: true` or
/// `top_logprobs` > 0 (chat); false, 0 and null ask for nothing.
fn no_logprobs(obj: &Map<String, Value>, endpoint: Endpoint) -> Result<(), ApiError> {
    let fields: &[&str] = match endpoint {
        Endpoint::Completions => &["logprobs"],
        Endpoint::Chat => &["logprobs", "top_logprobs"],
    };
    for &key in fields {
        let asked = match opt(obj, key) {
            None | Some(Value::Bool(false)) => false,
            Some(Value::Bool(true)) => true,
            Some(v) => match integer(v) {
                Some(n) if n >= 0 => n > 0,
                _ => return Err(bad(key, format!("`{key}` must be a boolean or a non-negative integer, got {v}"))),
            },
        };
        if asked {
            return Err(bad(
                key,
                format!("`{key}`: logprobs are not supported by this server (its workers do not compute token log probabilities)"),
            ));
        }
    }
    Ok(())
}

fn string_content(v: &Value, param: &str) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        // Content parts: only text parts are served.
        Value::Array(parts) => parts
            .iter()
            .map(
                |p| match (p.get("type").and_then(Value::as_str), p.get("text").and_then(Value::as_str)) {
                    (Some("text"), Some(t)) => Ok(t.to_string()),
                    _ => Err(bad(param, format!("`{param}`: only text content parts are supported"))),
                },
            )
            .collect(),
        _ => Err(bad(param, format!("`{param}` must be a string"))),
    }
}

/// Parses and checks a request body; `temperature` and `top_p` it omits
/// take `defaults`.
pub fn parse(body: &[u8], endpoint: Endpoint, defaults: &SamplingDefaults) -> Result<GenRequest, ApiError> {
    let v: Value = serde_json::from_slice(body).map_err(|e| ApiError::BadRequest {
        message: format!("We could not parse the JSON body of your request: {e}"),
        param: None,
    })?;
    let Value::Object(obj) = v else {
        return Err(ApiError::BadRequest {
            message: "The request body must be a JSON object".into(),
            param: None,
        });
    };
    let model = match opt(&obj, "model") {
        Some(Value::String(s)) => s.clone(),
        Some(v) => return Err(bad("model", format!("`model` must be a string, got {v}"))),
        None => return Err(bad("model", "you must provide a model parameter".into())),
    };
    let prompt = match endpoint {
        Endpoint::Completions => match opt(&obj, "prompt") {
            Some(Value::String(s)) => Prompt::Text(s.clone()),
            Some(Value::Array(a)) if a.len() == 1 && a[0].is_string() => Prompt::Text(a[0].as_str().unwrap_or_default().to_string()),
            Some(Value::Array(a)) if !a.is_empty() && a.iter().all(|x| integer_in(x, 0..=u32::MAX).is_some()) => {
                Prompt::Ids(a.iter().filter_map(|x| integer_in(x, 0..=u32::MAX)).collect())
            }
            Some(v) => {
                return Err(bad(
                    "prompt",
                    format!("`prompt` must be a string, a list of one string or a list of token ids, got {v}"),
                ))
            }
            None => return Err(bad("prompt", "you must provide a prompt parameter".into())),
        },
        Endpoint::Chat => {
            let Some(Value::Array(msgs)) = opt(&obj, "messages") else {
                return Err(bad("messages", "`messages` must be a non-empty list of messages".into()));
            };
            if msgs.is_empty() {
                return Err(bad("messages", "`messages` must be a non-empty list of messages".into()));
            }
            let mut out = Vec::with_capacity(msgs.len());
            for (i, m) in msgs.iter().enumerate() {
                let role = m.get("role").and_then(Value::as_str);
                let role = match role {
                    Some(r) if ROLES.contains(&r) => r.to_string(),
                    _ => {
                        return Err(bad(
                            &format!("messages[{i}].role"),
                            format!("`messages[{i}].role` must be one of {}", ROLES.join(", ")),
                        ))
                    }
                };
                let param = format!("messages[{i}].content");
                let content = match m.get("content") {
                    Some(c) if !c.is_null() => string_content(c, &param)?,
                    _ => return Err(bad(&param, format!("`{param}` is required"))),
                };
                out.push(ChatMessage { role, content });
            }
            Prompt::Chat(out)
        }
    };
    // Chat's `max_completion_tokens` replaces the deprecated `max_tokens`;
    // both are checked, and the new one wins when both are given.
    let mut max_tokens = (positive_int(&obj, "max_tokens")?, "max_tokens");
    if endpoint == Endpoint::Chat {
        if let Some(n) = positive_int(&obj, "max_completion_tokens")? {
            max_tokens = (Some(n), "max_completion_tokens");
        }
    }
    if let Some(n) = positive_int(&obj, "n")? {
        if n != 1 {
            return Err(bad("n", format!("`n` = {n}: only n = 1 is supported")));
        }
    }
    let stop = match opt(&obj, "stop") {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) if a.len() <= MAX_STOP_STRINGS && a.iter().all(Value::is_string) => {
            a.iter().filter_map(Value::as_str).map(str::to_string).collect()
        }
        Some(v) => {
            return Err(bad(
                "stop",
                format!("`stop` must be a string or a list of up to {MAX_STOP_STRINGS} strings, got {v}"),
            ))
        }
    };
    if stop.iter().any(String::is_empty) {
        return Err(bad("stop", "`stop` strings must not be empty".into()));
    }
    let seed = match opt(&obj, "seed") {
        None => None,
        Some(v) => Some(
            integer_in(v, i64::MIN..=i64::MAX)
                .map(|s| s as u64)
                .ok_or_else(|| bad("seed", format!("`seed` must be a 64-bit signed integer, got {v}")))?,
        ),
    };
    no_logprobs(&obj, endpoint)?;
    let stream = boolean(&obj, "stream")?;
    let include_usage = match opt(&obj, "stream_options") {
        None => false,
        Some(Value::Object(o)) => boolean(o, "include_usage").map_err(|_| {
            bad(
                "stream_options.include_usage",
                "`stream_options.include_usage` must be a boolean".into(),
            )
        })?,
        Some(v) => return Err(bad("stream_options", format!("`stream_options` must be an object, got {v}"))),
    };
    Ok(GenRequest {
        model,
        prompt,
        max_tokens: max_tokens.0,
        max_tokens_param: max_tokens.1,
        temperature: number(&obj, "temperature", TEMPERATURE_RANGE, defaults.temperature)?,
        top_p: number(&obj, "top_p", TOP_P_RANGE, defaults.top_p)?,
        seed,
        stop,
        stream,
        include_usage,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `super::parse` with OpenAI's sampling defaults.
    fn parse(body: &[u8], endpoint: Endpoint) -> Result<GenRequest, ApiError> {
        super::parse(body, endpoint, &SamplingDefaults::OPENAI)
    }

    fn param_of(body: &str, e: Endpoint) -> Option<String> {
        match parse(body.as_bytes(), e) {
            Err(ApiError::BadRequest { param, .. }) => param,
            other => panic!("expected a 400, got {other:?}"),
        }
    }

    #[test]
    fn bad_fields_are_named() {
        let c = Endpoint::Completions;
        assert_eq!(
            param_of(r#"{"model":"m","prompt":"x","max_tokens":"ten"}"#, c).as_deref(),
            Some("max_tokens")
        );
        assert_eq!(
            param_of(r#"{"model":"m","prompt":"x","temperature":5}"#, c).as_deref(),
            Some("temperature")
        );
        assert_eq!(param_of(r#"{"model":"m"}"#, c).as_deref(), Some("prompt"));
        assert_eq!(param_of(r#"{"model":"m","prompt":"x","stop":[1]}"#, c).as_deref(), Some("stop"));
        assert_eq!(
            param_of(r#"{"model":"m","messages":[{"role":"x","content":"a"}]}"#, Endpoint::Chat).as_deref(),
            Some("messages[0].role")
        );
        assert_eq!(param_of("{not json", c), None);
    }

    #[test]
    fn logprobs_are_refused_when_asked_for() {
        let (c, chat) = (Endpoint::Completions, Endpoint::Chat);
        for (body, e, param) in [
            (r#"{"model":"m","prompt":"x","logprobs":1}"#, c, "logprobs"),
            (r#"{"model":"m","prompt":"x","logprobs":true}"#, c, "logprobs"),
            (
                r#"{"model":"m","messages":[{"role":"user","content":"a"}],"logprobs":true}"#,
                chat,
                "logprobs",
            ),
            (
                r#"{"model":"m","messages":[{"role":"user","content":"a"}],"top_logprobs":2}"#,
                chat,
                "top_logprobs",
            ),
        ] {
            match parse(body.as_bytes(), e) {
                Err(ApiError::BadRequest { message, param: p }) => {
                    assert_eq!(p.as_deref(), Some(param), "{body}");
                    assert!(message.contains("not supported"), "{message}");
                }
                other => panic!("{body}: expected a 400, got {other:?}"),
            }
        }
        // Not asking is fine, however it is said.
        for v in ["false", "0", "null"] {
            parse(format!(r#"{{"model":"m","prompt":"x","logprobs":{v}}}"#).as_bytes(), c).unwrap();
            parse(
                format!(r#"{{"model":"m","messages":[{{"role":"user","content":"a"}}],"logprobs":{v},"top_logprobs":{v}}}"#).as_bytes(),
                chat,
            )
            .unwrap();
        }
        assert_eq!(
            param_of(r#"{"model":"m","prompt":"x","logprobs":"yes"}"#, c).as_deref(),
            Some("logprobs")
        );
    }

    #[test]
    fn integers_are_json_schema_integers() {
        let c = Endpoint::Completions;
        // `2.0` is an integer to JSON Schema, so to the request schemas.
        let r = parse(br#"{"model":"m","prompt":[5.0, 6],"max_tokens":3.0,"seed":-7.0,"n":1.0}"#, c).unwrap();
        assert_eq!(
            (r.prompt, r.max_tokens, r.seed),
            (Prompt::Ids(vec![5, 6]), Some(3), Some(-7i64 as u64))
        );
        for (body, param) in [
            (r#"{"model":"m","prompt":"x","max_tokens":2.5}"#, "max_tokens"),
            (r#"{"model":"m","prompt":"x","max_tokens":4294967296}"#, "max_tokens"),
            // Past i64, a float that may have been rounded to i64::MIN.
            (r#"{"model":"m","prompt":"x","seed":-9223372036854775809}"#, "seed"),
            (r#"{"model":"m","prompt":"x","seed":9223372036854775808}"#, "seed"),
            (r#"{"model":"m","prompt":"x","logprobs":-1}"#, "logprobs"),
        ] {
            assert_eq!(param_of(body, c).as_deref(), Some(param), "{body}");
        }
        let r = parse(br#"{"model":"m","prompt":"x","seed":1874761995294523.0,"logprobs":0.0}"#, c).unwrap();
        assert_eq!(r.seed, Some(1_874_761_995_294_523));
    }

    #[test]
    fn chat_checks_both_limits_and_names_the_one_used() {
        let chat = Endpoint::Chat;
        let m = r#""model":"m","messages":[{"role":"user","content":"a"}]"#;
        let r = parse(format!("{{{m},\"max_tokens\":9,\"max_completion_tokens\":4}}").as_bytes(), chat).unwrap();
        assert_eq!((r.max_tokens, r.max_tokens_param), (Some(4), "max_completion_tokens"));
        let r = parse(format!("{{{m},\"max_tokens\":9}}").as_bytes(), chat).unwrap();
        assert_eq!((r.max_tokens, r.max_tokens_param), (Some(9), "max_tokens"));
        let bad = format!("{{{m},\"max_tokens\":0,\"max_completion_tokens\":4}}");
        assert_eq!(param_of(&bad, chat).as_deref(), Some("max_tokens"));
    }

    #[test]
    fn parses_a_full_request() {
        let r = parse(
            br#"{"model":"m","prompt":["hi"],"max_tokens":3,"temperature":0,"top_p":0.5,"seed":7,"stop":"x","stream":true,"stream_options":{"include_usage":true}}"#,
            Endpoint::Completions,
        )
        .unwrap();
        assert_eq!(r.prompt, Prompt::Text("hi".into()));
        assert_eq!((r.max_tokens, r.temperature, r.top_p, r.seed), (Some(3), 0.0, 0.5, Some(7)));
        assert!(r.stream && r.include_usage);
        assert_eq!(r.stop, vec!["x".to_string()]);
    }
}
