//! Every HTTP error body comes from here, in OpenAI's shape:
//! `{"error": {"message", "type", "param", "code"}}`.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use thiserror::Error;

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
            _ => None,
        }
    }

    /// The JSON body (also sent as an SSE event when a stream fails midway).
    pub fn body(&self) -> serde_json::Value {
        let (kind, code) = self.kind();
        serde_json::json!({"error": {
            "message": self.to_string(),
            "type": kind,
            "param": self.param(),
            "code": code,
        }})
    }
}

impl From<WorkerError> for ApiError {
    fn from(e: WorkerError) -> Self {
        match e {
            WorkerError::Timeout { .. } => ApiError::Timeout(e.to_string()),
            WorkerError::Rejected { ref code, .. } if code == crate::protocol::codes::BAD_REQUEST => ApiError::BadRequest {
                message: e.to_string(),
                param: None,
            },
            WorkerError::Rejected { ref code, .. } if code == crate::protocol::codes::OVERLOADED => ApiError::NoCapacity(e.to_string()),
            WorkerError::Rejected { ref code, .. } if code == crate::protocol::codes::SLO_UNATTAINABLE => ApiError::Overloaded {
                message: e.to_string(),
                retry_after_s: 1,
            },
            _ => ApiError::Worker(e.to_string()),
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
}
