//! Every HTTP error body comes from here, in OpenAI's shape:
//! `{"error": {"message", "type", "param", "code"}}`.

use axum::extract::rejection::BytesRejection;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use thiserror::Error;
use utoipa::ToSchema;

use crate::protocol::codes;
use crate::worker::WorkerError;

#[derive(Debug, Error, Clone, PartialEq)]
pub enum ApiError {
    /// Malformed body or a bad parameter; `param` names the field.
    #[error("{message}")]
    BadRequest { message: String, param: Option<String> },
    #[error("{0}")]
    Unauthorized(String),
    #[error("{message}")]
    Forbidden { message: String, param: Option<String> },
    #[error("The model `{0}` does not exist")]
    ModelNotFound(String),
    /// The body is over the gateway's size limit (`max_body_bytes`).
    #[error("The request body is larger than this server's limit of {limit_bytes} bytes")]
    BodyTooLarge { limit_bytes: usize },
    /// The prompt and the completion do not fit in the model's context, in
    /// vLLM's words (clients match on them); `completion` is `None` when the
    /// request gave no `max_tokens` and the prompt alone fills the context.
    #[error("{}", context_message(*max_model_len, *prompt, *completion))]
    ContextLength {
        max_model_len: u32,
        prompt: u32,
        completion: Option<u32>,
        param: &'static str,
    },
    #[error("tier {tier:?} is over its limit: {reason}")]
    RateLimited { tier: String, reason: String, retry_after_s: u64 },
    #[error("no worker capacity: {0}")]
    NoCapacity(String),
    /// Shed: the tier's planned capacity cannot serve it within its SLO
    /// now (it would only delay requests that still can).
    #[error("overloaded: {message}")]
    Overloaded { message: String, retry_after_s: u64 },
    #[error("worker timeout: {0}")]
    Timeout(String),
    #[error("worker failed: {0}")]
    Worker(String),
    #[error("{0}")]
    Internal(String),
}

impl ApiError {
    pub fn bad_param(param: &str, message: impl Into<String>) -> Self {
        ApiError::BadRequest {
            message: message.into(),
            param: Some(param.to_string()),
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest { .. } => StatusCode::BAD_REQUEST,
            ApiError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden { .. } => StatusCode::FORBIDDEN,
            ApiError::ModelNotFound(_) => StatusCode::NOT_FOUND,
            ApiError::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::ContextLength { .. } => StatusCode::BAD_REQUEST,
            ApiError::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::NoCapacity(_) | ApiError::Overloaded { .. } => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Timeout(_) => StatusCode::GATEWAY_TIMEOUT,
            ApiError::Worker(_) => StatusCode::BAD_GATEWAY,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// OpenAI's (`type`, `code`) for this error.
    fn kind(&self) -> (&'static str, Option<&'static str>) {
        match self {
            ApiError::BadRequest { .. } => ("invalid_request_error", None),
            ApiError::Unauthorized(_) => ("invalid_request_error", Some("invalid_api_key")),
            ApiError::Forbidden { .. } => ("invalid_request_error", Some("tier_not_allowed")),
            ApiError::ModelNotFound(_) => ("invalid_request_error", Some("model_not_found")),
            ApiError::BodyTooLarge { .. } => ("invalid_request_error", Some("request_too_large")),
            ApiError::ContextLength { .. } => ("invalid_request_error", Some("context_length_exceeded")),
            ApiError::RateLimited { .. } => ("requests", Some("rate_limit_exceeded")),
            ApiError::NoCapacity(_) => ("server_error", Some("no_capacity")),
            ApiError::Overloaded { .. } => ("server_error", Some("overloaded")),
            ApiError::Timeout(_) => ("server_error", Some("timeout")),
            ApiError::Worker(_) => ("server_error", Some("worker_error")),
            ApiError::Internal(_) => ("server_error", None),
        }
    }

    fn param(&self) -> Option<&str> {
        match self {
            ApiError::BadRequest { param, .. } | ApiError::Forbidden { param, .. } => param.as_deref(),
            ApiError::ModelNotFound(_) => Some("model"),
            ApiError::ContextLength { param, .. } => Some(param),
            _ => None,
        }
    }

    /// A body the `Bytes` extractor could not read: over `limit_bytes`
    /// (axum's own answer would be a plain-text 413), or cut off.
    pub fn unread_body(rejection: &BytesRejection, limit_bytes: usize) -> Self {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::BodyTooLarge { limit_bytes }
        } else {
            ApiError::BadRequest {
                message: format!("We could not read the body of your request: {}", rejection.body_text()),
                param: None,
            }
        }
    }

    /// The JSON body (also sent as an SSE event when a stream fails midway).
    pub fn body(&self) -> serde_json::Value {
        let (kind, code) = self.kind();
        let body = ErrorBody {
            error: ErrorDetail {
                message: self.to_string(),
                kind,
                param: self.param(),
                code,
            },
        };
        serde_json::to_value(body).expect("error bodies serialize")
    }
}

/// The body of every error answer, in OpenAI's shape (its `ToSchema` is
/// the `Error` schema of `/openapi.json`).
#[derive(Serialize, ToSchema)]
#[schema(as = Error)]
pub struct ErrorBody<'a> {
    error: ErrorDetail<'a>,
}

#[derive(Serialize, ToSchema)]
struct ErrorDetail<'a> {
    message: String,
    /// OpenAI's error type: `invalid_request_error`, `requests` (a rate
    /// limit) or `server_error`.
    #[serde(rename = "type")]
    kind: &'static str,
    /// The request field (or header) at fault, when one is.
    #[schema(required = true)]
    param: Option<&'a str>,
    /// A machine-readable code, e.g. `invalid_api_key`, `model_not_found`,
    /// `context_length_exceeded`, `rate_limit_exceeded`, `overloaded`.
    #[schema(required = true)]
    code: Option<&'static str>,
}

fn context_message(max_model_len: u32, prompt: u32, completion: Option<u32>) -> String {
    match completion {
        Some(k) => format!(
            "This model's maximum context length is {max_model_len} tokens. However, you requested {} tokens \
             ({prompt} in the messages, {k} in the completion). Please reduce the length of the messages or completion.",
            u64::from(prompt) + u64::from(k)
        ),
        None => format!(
            "This model's maximum context length is {max_model_len} tokens. However, you requested {prompt} tokens \
             in the messages. Please reduce the length of the messages."
        ),
    }
}

/// What the client is told of a worker's failure: the worker's endpoint is
/// internal, so it stays out (the caller logs the full error).
impl From<WorkerError> for ApiError {
    fn from(e: WorkerError) -> Self {
        match e {
            WorkerError::Timeout { seconds, .. } => ApiError::Timeout(format!("the worker did not answer within {seconds} s")),
            WorkerError::Rejected { code, message, .. } => {
                let message = format!("the worker rejected the request ({code}): {message}");
                match code.as_str() {
                    codes::BAD_REQUEST => ApiError::BadRequest { message, param: None },
                    codes::OVERLOADED => ApiError::NoCapacity(message),
                    codes::SLO_UNATTAINABLE => ApiError::Overloaded { message, retry_after_s: 1 },
                    _ => ApiError::Worker(message),
                }
            }
            WorkerError::Died { reason, .. } => ApiError::Worker(format!("the worker serving the request is gone: {reason}")),
            // The reason may name the endpoint.
            WorkerError::Connect { .. } => ApiError::Worker("the worker serving the request cannot be reached".into()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut resp = (self.status(), axum::Json(self.body())).into_response();
        if let ApiError::RateLimited { retry_after_s, .. } | ApiError::Overloaded { retry_after_s, .. } = self {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(retry_after_s.max(1)));
        }
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openai_shape() {
        let e = ApiError::bad_param("max_tokens", "`max_tokens` must be a positive integer");
        assert_eq!(e.status(), StatusCode::BAD_REQUEST);
        let b = e.body();
        assert_eq!(b["error"]["param"], "max_tokens");
        assert_eq!(b["error"]["type"], "invalid_request_error");
        let r = ApiError::RateLimited {
            tier: "chat".into(),
            reason: "x".into(),
            retry_after_s: 0,
        }
        .into_response();
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(r.headers()[header::RETRY_AFTER], "1");
    }

    #[test]
    fn context_length_in_vllms_words() {
        let e = ApiError::ContextLength {
            max_model_len: 32,
            prompt: 5,
            completion: Some(40),
            param: "max_tokens",
        };
        assert_eq!(e.status(), StatusCode::BAD_REQUEST);
        let b = e.body();
        assert_eq!(
            b["error"]["message"],
            "This model's maximum context length is 32 tokens. However, you requested 45 tokens (5 in the messages, \
             40 in the completion). Please reduce the length of the messages or completion."
        );
        assert_eq!(
            (b["error"]["param"].as_str(), b["error"]["code"].as_str()),
            (Some("max_tokens"), Some("context_length_exceeded"))
        );
        let body = ApiError::BodyTooLarge { limit_bytes: 1024 }.body();
        assert!(body["error"]["message"].as_str().unwrap().contains("1024 bytes"), "{body}");
    }

    #[test]
    fn worker_errors_do_not_name_the_worker() {
        let worker = "tcp://10.0.0.7:7100".to_string();
        for e in [
            WorkerError::Rejected {
                worker: worker.clone(),
                code: codes::BAD_REQUEST.into(),
                message: "token id 99 is out of the vocabulary".into(),
            },
            WorkerError::Rejected {
                worker: worker.clone(),
                code: codes::SLO_UNATTAINABLE.into(),
                message: "not started in time".into(),
            },
            WorkerError::Died {
                worker: worker.clone(),
                reason: "stream closed".into(),
            },
            WorkerError::Connect {
                worker: worker.clone(),
                reason: format!("connect to {worker} refused"),
            },
            WorkerError::Timeout {
                worker: worker.clone(),
                seconds: 2.0,
            },
        ] {
            let api = ApiError::from(e.clone());
            let text = api.body().to_string();
            assert!(!text.contains("10.0.0.7"), "{e:?} -> {text}");
        }
        let api = ApiError::from(WorkerError::Rejected {
            worker,
            code: codes::BAD_REQUEST.into(),
            message: "token id 99 is out of the vocabulary".into(),
        });
        assert_eq!(api.status(), StatusCode::BAD_REQUEST);
        assert!(api.to_string().contains("token id 99"), "{api}");
    }
}
