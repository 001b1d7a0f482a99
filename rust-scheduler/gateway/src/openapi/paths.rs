//! The operations of `/openapi.json`, one per route of `server::routes`,
//! each with every status its handler can answer (the generation routes'
//! errors are `ApiError::status`'s, each said once here).

use axum::http::Method;
use serde_json::{json, Value};
use utoipa::openapi::extensions::Extensions;
use utoipa::openapi::path::{HttpMethod, Operation, OperationBuilder, ParameterBuilder, ParameterIn};
use utoipa::openapi::request_body::RequestBodyBuilder;
use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};
use utoipa::openapi::security::SecurityRequirement;
use utoipa::openapi::{Content, Header, Paths, Ref, RefOr, Required, ResponseBuilder, ResponsesBuilder};
use utoipa::ToSchema;

use super::{requests, Facts, API_KEY_SCHEME};
use crate::admission::TIER_HEADER;
use crate::error::ErrorBody;
use crate::openai::{ChatCompletion, ChatCompletionChunk, Completion, ModelList};
use crate::server::routes;

const JSON: &str = "application/json";
const SSE: &str = "text/event-stream";

/// What each error status of a generation route means (`ApiError::status`).
const GENERATION_ERRORS: [(u16, &str); 10] = [
    (
        400,
        "A body that is not a JSON object, a bad field (`param` names it), a prompt and `max_tokens` over the \
         model's context length (`context_length_exceeded`), a prompt of no tokens, an unknown tier header, \
         or a request the worker refused",
    ),
    (401, "No API key, or one no tier has"),
    (403, "The tier header asks for a higher tier than the key's"),
    (404, "The model is not the one served"),
    (413, "The body is over the gateway's size limit"),
    (
        429,
        "The key's tier is over its concurrency or rate limit; Retry-After says when to retry",
    ),
    (500, "The control loop could not admit the request"),
    (502, "The worker serving the request failed or went away"),
    (
        503,
        "No worker can take the request, or it was shed: the tier's planned capacity cannot serve it within \
         its SLO now (then with Retry-After)",
    ),
    (504, "The worker sent nothing within the gateway's worker timeout"),
];

/// Statuses that come with Retry-After (always for 429, when shed for 503).
const RETRY_AFTER: [u16; 2] = [429, 503];

/// Every route `server::routes` serves, documented.
pub fn all(facts: &Facts) -> Paths {
    let mut paths = Paths::new();
    for route in routes() {
        let op = operation(route.path, facts);
        paths.add_path_operation(route.path, vec![http_method(&route.method)], op);
    }
    paths
}

fn http_method(m: &Method) -> HttpMethod {
    match *m {
        Method::POST => HttpMethod::Post,
        Method::GET => HttpMethod::Get,
        ref other => panic!("no route is served with {other}"),
    }
}

fn schema_ref<T: ToSchema>() -> RefOr<Schema> {
    Ref::from_schema_name(T::name()).into()
}

fn json(description: &str, schema: impl Into<RefOr<Schema>>) -> ResponseBuilder {
    ResponseBuilder::new()
        .description(description)
        .content(JSON, Content::new(Some(schema)))
}

fn get(id: &str, summary: &str, responses: ResponsesBuilder) -> Operation {
    OperationBuilder::new()
        .operation_id(Some(id))
        .summary(Some(summary))
        .responses(responses)
        .build()
}

/// The documentation of the route at `path`.
fn operation(path: &str, facts: &Facts) -> Operation {
    match path {
        "/v1/completions" => generation(
            "createCompletion",
            "Completes a prompt",
            requests::COMPLETION,
            schema_ref::<Completion>(),
            Completion::name().as_ref(),
            facts,
        ),
        "/v1/chat/completions" => generation(
            "createChatCompletion",
            "Answers a conversation",
            requests::CHAT,
            schema_ref::<ChatCompletion>(),
            ChatCompletionChunk::name().as_ref(),
            facts,
        ),
        "/v1/models" => get(
            "listModels",
            "The model served",
            ResponsesBuilder::new().response("200", json("The one model", schema_ref::<ModelList>())),
        ),
        "/v1/plan" => get(
            "getPlan",
            "The control loop's current plan",
            ResponsesBuilder::new().response(
                "200",
                json(
                    "The plan: its id, groups (tier, role, TP, GPUs, capacity), per-tier capacity and served share, each pool \
                     member's host tier, GPUs down and the worker nodes",
                    ObjectBuilder::new().schema_type(Type::Object),
                ),
            ),
        ),
        "/health" => {
            let health = || {
                ObjectBuilder::new()
                    .property(
                        "status",
                        ObjectBuilder::new()
                            .schema_type(Type::String)
                            .enum_values(Some(["ok", "no_capacity"])),
                    )
                    .required("status")
            };
            get(
                "getHealth",
                "Whether a worker and a GPU are up",
                ResponsesBuilder::new()
                    .response("200", json("At least one worker and one GPU are up", health()))
                    .response("503", json("No worker or no GPU is up", health())),
            )
        }
        "/metrics" => get(
            "getMetrics",
            "Prometheus metrics",
            ResponsesBuilder::new().response(
                "200",
                ResponseBuilder::new()
                    .description("Prometheus' text format")
                    .content("text/plain", Content::new(Some(ObjectBuilder::new().schema_type(Type::String)))),
            ),
        ),
        super::PATH => get(
            "getOpenApi",
            "This document",
            ResponsesBuilder::new().response("200", json("The OpenAPI document", ObjectBuilder::new().schema_type(Type::Object))),
        ),
        other => panic!("route {other} is served but not documented"),
    }
}

/// The last event of a stream.
const DONE: &str = "[DONE]";

fn ref_of(name: &str) -> Value {
    json!({ "$ref": Ref::from_schema_name(name).ref_location })
}

/// One event of a generation stream (OpenAPI 3.1 states an event stream by
/// its events): its `data` is a chunk's JSON, or an error's when the
/// request fails after the stream started, or `[DONE]` last. utoipa has no
/// `if`, `else` or `contentSchema`; its extensions map is written flat
/// into the schema, so these keywords go there.
fn event(chunk: &str) -> ObjectBuilder {
    let json_body = json!({
        "contentMediaType": JSON,
        "contentSchema": {"oneOf": [ref_of(chunk), ref_of(&ErrorBody::name())]},
    });
    let mut keywords = Extensions::default();
    keywords.insert("if".into(), json!({ "const": DONE }));
    keywords.insert("else".into(), json_body);
    let data = ObjectBuilder::new()
        .schema_type(Type::String)
        .description(Some(format!(
            "A `{chunk}` (the last, with `stream_options.include_usage`, has only `usage`), an `{}` when the \
             request fails after the stream started, or `{DONE}` at the end",
            ErrorBody::name()
        )))
        .extensions(Some(keywords));
    ObjectBuilder::new().property("data", data).required("data")
}

/// A generation route: JSON in, JSON or Server-Sent Events out, with the
/// API key and the optional tier header.
fn generation(id: &str, summary: &str, request: &str, answer: RefOr<Schema>, chunk: &str, facts: &Facts) -> Operation {
    let body = RequestBodyBuilder::new()
        .required(Some(Required::True))
        .content(JSON, Content::new(Some(Ref::from_schema_name(request))))
        .build();
    let tier = ParameterBuilder::new()
        .name(TIER_HEADER)
        .parameter_in(ParameterIn::Header)
        .required(Required::False)
        .description(Some(
            "A tier to be served in instead of the key's: the same or a lower one (a higher one: 403)",
        ))
        .schema(Some(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .enum_values(Some(facts.tiers.iter().copied())),
        ));
    let ok =
        json("The answer: one JSON body, or with `stream: true` Server-Sent Events", answer).content(SSE, Content::new(Some(event(chunk))));
    let mut responses = ResponsesBuilder::new().response("200", ok);
    for (status, description) in GENERATION_ERRORS {
        let mut r = json(description, schema_ref::<ErrorBody>());
        if RETRY_AFTER.contains(&status) {
            let seconds = ObjectBuilder::new().schema_type(Type::Integer).minimum(Some(1));
            let mut h = Header::new(seconds);
            h.description = Some("Seconds to wait before retrying".into());
            r = r.header("Retry-After", h);
        }
        responses = responses.response(status.to_string(), r);
    }
    OperationBuilder::new()
        .operation_id(Some(id))
        .summary(Some(summary))
        .request_body(Some(body))
        .parameter(tier)
        .responses(responses)
        .security(SecurityRequirement::new(API_KEY_SCHEME, Vec::<String>::new()))
        .build()
}
