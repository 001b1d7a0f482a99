//! OpenAI request parsing (every bad field is named in the 400) and response
//! bodies for `/v1/completions` and `/v1/chat/completions`.

use serde::Serialize;
use serde_json::{Map, Value};

use crate::error::ApiError;
use crate::sampling::SamplingDefaults;
use crate::tokenize::ChatMessage;

/// OpenAI allows at most this many stop strings.
const MAX_STOP_STRINGS: usize = 4;

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

fn number(obj: &Map<String, Value>, key: &str, lo: f64, hi: f64, default: f64) -> Result<f64, ApiError> {
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

fn positive_int(obj: &Map<String, Value>, key: &str) -> Result<Option<u32>, ApiError> {
    match opt(obj, key) {
        None => Ok(None),
        Some(v) => match v.as_u64() {
            Some(n) if n >= 1 && n <= u64::from(u32::MAX) => Ok(Some(n as u32)),
            _ => Err(bad(key, format!("`{key}` must be an integer >= 1, got {v}"))),
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
            Some(Value::Number(n)) if n.as_u64().is_some() => n.as_u64() != Some(0),
            Some(v) => return Err(bad(key, format!("`{key}` must be a boolean or a non-negative integer, got {v}"))),
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
            Some(Value::Array(a)) if !a.is_empty() && a.iter().all(|x| x.as_u64().is_some_and(|n| n <= u64::from(u32::MAX))) => {
                Prompt::Ids(a.iter().filter_map(Value::as_u64).map(|n| n as u32).collect())
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
                    Some(r @ ("system" | "developer" | "user" | "assistant" | "tool")) => r.to_string(),
                    _ => {
                        return Err(bad(
                            &format!("messages[{i}].role"),
                            format!("`messages[{i}].role` must be one of system, developer, user, assistant, tool"),
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
    let max_tokens = match endpoint {
        Endpoint::Chat if opt(&obj, "max_completion_tokens").is_some() => positive_int(&obj, "max_completion_tokens")?,
        _ => positive_int(&obj, "max_tokens")?,
    };
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
            v.as_i64()
                .map(|s| s as u64)
                .ok_or_else(|| bad("seed", format!("`seed` must be an integer, got {v}")))?,
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
        max_tokens,
        temperature: number(&obj, "temperature", 0.0, 2.0, defaults.temperature)?,
        top_p: number(&obj, "top_p", 0.0, 1.0, defaults.top_p)?,
        seed,
        stop,
        stream,
        include_usage,
    })
}

#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Usage {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    pub total_tokens: u32,
}

impl Usage {
    pub fn new(prompt: u32, completion: u32) -> Self {
        Self {
            prompt_tokens: prompt,
            completion_tokens: completion,
            total_tokens: prompt + completion,
        }
    }
}

#[derive(Serialize)]
struct Message<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    content: Option<&'a str>,
}

#[derive(Serialize)]
struct Choice<'a> {
    index: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    text: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<Message<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    delta: Option<Message<'a>>,
    logprobs: Option<()>,
    finish_reason: Option<&'a str>,
}

#[derive(Serialize)]
struct Body<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: Vec<Choice<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<Usage>,
}

/// The fields every response and chunk of one request share.
pub struct Envelope<'a> {
    pub endpoint: Endpoint,
    pub id: &'a str,
    pub created: u64,
    pub model: &'a str,
}

impl Envelope<'_> {
    fn body<'b>(&'b self, object: &'static str, choices: Vec<Choice<'b>>, usage: Option<Usage>) -> String {
        serde_json::to_string(&Body {
            id: self.id,
            object,
            created: self.created,
            model: self.model,
            choices,
            usage,
        })
        .expect("response bodies serialize")
    }

    /// A complete (non-streaming) response.
    pub fn full(&self, text: &str, finish_reason: &str, usage: Usage) -> String {
        let (object, choice) = match self.endpoint {
            Endpoint::Completions => ("text_completion", choice(Some(text), None, None, Some(finish_reason))),
            Endpoint::Chat => (
                "chat.completion",
                choice(
                    None,
                    Some(Message {
                        role: Some("assistant"),
                        content: Some(text),
                    }),
                    None,
                    Some(finish_reason),
                ),
            ),
        };
        self.body(object, vec![choice], Some(usage))
    }

    /// One streamed chunk; the first chat chunk carries the role.
    pub fn chunk(&self, text: &str, first: bool, finish_reason: Option<&str>) -> String {
        match self.endpoint {
            Endpoint::Completions => self.body("text_completion", vec![choice(Some(text), None, None, finish_reason)], None),
            Endpoint::Chat => {
                // The role opens the stream; a finishing chunk may be empty.
                let delta = Message {
                    role: first.then_some("assistant"),
                    content: (first || !text.is_empty()).then_some(text),
                };
                self.body("chat.completion.chunk", vec![choice(None, None, Some(delta), finish_reason)], None)
            }
        }
    }

    /// The final usage chunk (`stream_options.include_usage`).
    pub fn usage_chunk(&self, usage: Usage) -> String {
        let object = match self.endpoint {
            Endpoint::Completions => "text_completion",
            Endpoint::Chat => "chat.completion.chunk",
        };
        self.body(object, Vec::new(), Some(usage))
    }
}

fn choice<'a>(
    text: Option<&'a str>,
    message: Option<Message<'a>>,
    delta: Option<Message<'a>>,
    finish_reason: Option<&'a str>,
) -> Choice<'a> {
    Choice {
        index: 0,
        text,
        message,
        delta,
        logprobs: None,
        finish_reason,
    }
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
