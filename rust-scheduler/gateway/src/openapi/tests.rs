//! The document parses, documents every route the router serves and only
//! those, refers only to schemas it has, and states every error status the
//! generation routes can answer.

use std::collections::BTreeSet;

use serde_json::Value;

use super::{document, Facts};
use crate::error::ApiError;
use crate::server::routes;

fn facts() -> Facts<'static> {
    Facts {
        model: "tiny",
        tiers: vec!["chat", "batch"],
        max_model_len: Some(2048),
        empty_prompt_has_no_tokens: true,
    }
}

/// The document as a client reads it: serialized, then parsed.
fn doc() -> Value {
    let text = document(&facts()).to_json().expect("the document serializes");
    serde_json::from_str(&text).expect("the document is JSON")
}

#[test]
fn is_openapi_3_1_with_a_bearer_api_key() {
    let d = doc();
    assert!(d["openapi"].as_str().unwrap().starts_with("3.1"), "{}", d["openapi"]);
    let scheme = &d["components"]["securitySchemes"][super::API_KEY_SCHEME];
    assert_eq!((scheme["type"].as_str(), scheme["scheme"].as_str()), (Some("http"), Some("bearer")));
}

#[test]
fn documents_exactly_the_routes_served() {
    let d = doc();
    let documented: BTreeSet<(String, String)> = d["paths"]
        .as_object()
        .unwrap()
        .iter()
        .flat_map(|(path, item)| item.as_object().unwrap().keys().map(move |m| (path.clone(), m.clone())))
        .collect();
    let served: BTreeSet<(String, String)> = routes()
        .iter()
        .map(|r| (r.path.to_string(), r.method.as_str().to_lowercase()))
        .collect();
    assert_eq!(documented, served);
}

/// Every `$ref` in `v`.
fn refs(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(o) => {
            if let Some(Value::String(r)) = o.get("$ref") {
                out.push(r.clone());
            }
            o.values().for_each(|x| refs(x, out));
        }
        Value::Array(a) => a.iter().for_each(|x| refs(x, out)),
        _ => {}
    }
}

#[test]
fn every_referenced_schema_exists() {
    let d = doc();
    let mut all = Vec::new();
    refs(&d, &mut all);
    assert!(all.len() > 10, "{all:?}");
    let schemas = d["components"]["schemas"].as_object().unwrap();
    for r in all {
        let name = r
            .strip_prefix("#/components/schemas/")
            .unwrap_or_else(|| panic!("not a schema reference: {r}"));
        assert!(schemas.contains_key(name), "{r} is referenced but not defined");
    }
}

/// One error of every kind; the match makes a new kind a compile error
/// here until it is listed (and so documented).
fn every_error() -> Vec<ApiError> {
    let all = vec![
        ApiError::bad_param("n", "x"),
        ApiError::Unauthorized("x".into()),
        ApiError::Forbidden {
            message: "x".into(),
            param: None,
        },
        ApiError::ModelNotFound("x".into()),
        ApiError::BodyTooLarge { limit_bytes: 1 },
        ApiError::ContextLength {
            max_model_len: 1,
            prompt: 1,
            completion: None,
            param: "prompt",
        },
        ApiError::RateLimited {
            tier: "x".into(),
            reason: "x".into(),
            retry_after_s: 1,
        },
        ApiError::NoCapacity("x".into()),
        ApiError::Overloaded {
            message: "x".into(),
            retry_after_s: 1,
        },
        ApiError::Timeout("x".into()),
        ApiError::Worker("x".into()),
        ApiError::Internal("x".into()),
    ];
    for e in &all {
        match e {
            ApiError::BadRequest { .. }
            | ApiError::Unauthorized(_)
            | ApiError::Forbidden { .. }
            | ApiError::ModelNotFound(_)
            | ApiError::BodyTooLarge { .. }
            | ApiError::ContextLength { .. }
            | ApiError::RateLimited { .. }
            | ApiError::NoCapacity(_)
            | ApiError::Overloaded { .. }
            | ApiError::Timeout(_)
            | ApiError::Worker(_)
            | ApiError::Internal(_) => {}
        }
    }
    all
}

#[test]
fn generation_routes_document_every_error_status() {
    let d = doc();
    for path in ["/v1/completions", "/v1/chat/completions"] {
        let op = &d["paths"][path]["post"];
        let responses = op["responses"].as_object().unwrap();
        for e in every_error() {
            let status = e.status().as_u16().to_string();
            let r = responses
                .get(&status)
                .unwrap_or_else(|| panic!("{path}: {status} ({e:?}) is not documented"));
            assert_eq!(r["content"]["application/json"]["schema"]["$ref"], "#/components/schemas/Error");
        }
        assert!(responses["200"]["content"]["text/event-stream"].is_object(), "{path}: no stream");
        assert!(responses["429"]["headers"]["Retry-After"].is_object());
        assert_eq!(op["security"][0][super::API_KEY_SCHEME], serde_json::json!([]));
    }
}

#[test]
fn request_schemas_state_what_this_gateway_serves() {
    let d = doc();
    let completion = &d["components"]["schemas"]["CompletionRequest"];
    assert_eq!(completion["properties"]["model"]["enum"], serde_json::json!(["tiny"]));
    assert_eq!(completion["properties"]["max_tokens"]["maximum"], 2047);
    assert_eq!(completion["properties"]["temperature"]["maximum"], 2.0);
    let required: Vec<&str> = completion["required"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(required, ["model", "prompt"]);
    let tier = &d["paths"]["/v1/completions"]["post"]["parameters"][0];
    assert_eq!(tier["schema"]["enum"], serde_json::json!(["chat", "batch"]));
}
