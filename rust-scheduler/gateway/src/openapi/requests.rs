//! The request schemas of `/openapi.json`: the rules `openai::parse` and
//! `App::start` enforce, built from the same constants and from what this
//! gateway serves (`Facts`), so that a request built to the schema is one
//! the gateway takes and one that breaks it is refused with a 400. The
//! parser reads the raw JSON (to name the field at fault), so these
//! schemas are written here rather than derived from a serde type.

use serde_json::{json, Value};
use utoipa::openapi::schema::{ArrayBuilder, ArrayItems, ObjectBuilder, OneOfBuilder, Schema, SchemaType, Type};
use utoipa::openapi::{Deprecated, Ref, RefOr};

use super::Facts;
use crate::openai::{MAX_STOP_STRINGS, ROLES};
use crate::sampling::{TEMPERATURE_RANGE, TOP_P_RANGE};

pub const COMPLETION: &str = "CompletionRequest";
pub const CHAT: &str = "ChatCompletionRequest";
const MESSAGE: &str = "ChatMessage";
const TEXT_PART: &str = "TextContentPart";

/// Every request schema, by name.
pub fn schemas(facts: &Facts) -> Vec<(&'static str, RefOr<Schema>)> {
    vec![
        (COMPLETION, completion(facts).into()),
        (CHAT, chat(facts).into()),
        (MESSAGE, message().into()),
        (TEXT_PART, text_part().into()),
    ]
}

/// `t` or null: the parser takes null as an absent field.
fn or_null(t: Type) -> SchemaType {
    SchemaType::from_iter([t, Type::Null])
}

fn typed(t: impl Into<SchemaType>, description: &str) -> ObjectBuilder {
    ObjectBuilder::new().schema_type(t).description(Some(description))
}

fn string(min_length: usize) -> ObjectBuilder {
    ObjectBuilder::new().schema_type(Type::String).min_length(Some(min_length))
}

fn array(items: impl Into<ArrayItems>, min: usize, max: Option<usize>) -> ArrayBuilder {
    ArrayBuilder::new().items(items).min_items(Some(min)).max_items(max)
}

fn number(range: (f64, f64), description: &str) -> ObjectBuilder {
    typed(or_null(Type::Number), description)
        .minimum(Some(range.0))
        .maximum(Some(range.1))
}

fn integer(lo: i64, hi: i64, description: &str) -> ObjectBuilder {
    typed(or_null(Type::Integer), description)
        .minimum(Some(lo as isize))
        .maximum(Some(hi as isize))
}

/// The most tokens to generate: at least 1 and, as the prompt holds at
/// least one token, below the model's context length when the agents
/// report one (`None`: a field the context does not bound).
fn max_tokens(facts: Option<&Facts>) -> ObjectBuilder {
    let max = facts.and_then(|f| f.max_model_len).map_or(u32::MAX, |n| n.saturating_sub(1).max(1));
    integer(
        1,
        i64::from(max),
        "The most tokens to generate. The prompt's tokens plus these must fit in the model's context length \
         (else 400 `context_length_exceeded`); absent: the gateway's default, cut to what fits.",
    )
}

/// `logprobs`, `top_logprobs`: only not asking is accepted (the workers
/// compute no log probabilities; asking is a 400).
fn no_logprobs(description: &str) -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(SchemaType::AnyValue)
        .enum_values(Some([json!(false), json!(0), Value::Null]))
        .description(Some(description))
}

/// The fields both endpoints take.
fn common(facts: &Facts) -> ObjectBuilder {
    let stop = OneOfBuilder::new()
        .item(string(1))
        .item(array(string(1), 0, Some(MAX_STOP_STRINGS)))
        .item(ObjectBuilder::new().schema_type(Type::Null))
        .description(Some(
            "Text at which generation stops (not included in the output); non-empty strings",
        ));
    let stream_options = typed(or_null(Type::Object), "Only read with `stream: true`").property(
        "include_usage",
        typed(or_null(Type::Boolean), "Send a last chunk with the token counts"),
    );
    ObjectBuilder::new()
        .property(
            "model",
            ObjectBuilder::new()
                .schema_type(Type::String)
                .enum_values(Some([facts.model]))
                .description(Some("The model served (`/v1/models`); another: 404 `model_not_found`")),
        )
        .required("model")
        .property(
            "temperature",
            number(
                TEMPERATURE_RANGE,
                "Absent: the server's sampling default (the model's recommendation, or 1)",
            ),
        )
        .property(
            "top_p",
            number(
                TOP_P_RANGE,
                "Absent: the server's sampling default (the model's recommendation, or 1)",
            ),
        )
        .property("n", integer(1, 1, "Only one choice is generated"))
        .property("stop", stop)
        .property("seed", integer(i64::MIN, i64::MAX, "Seeds the sampler"))
        .property(
            "stream",
            typed(
                or_null(Type::Boolean),
                "Answer with Server-Sent Events, one chunk per piece of text",
            ),
        )
        .property("stream_options", stream_options)
}

fn completion(facts: &Facts) -> ObjectBuilder {
    let ids = ObjectBuilder::new()
        .schema_type(Type::Integer)
        .minimum(Some(0))
        .maximum(Some(u32::MAX as usize));
    let prompt = OneOfBuilder::new()
        .item(string(usize::from(facts.empty_prompt_has_no_tokens)))
        .item(array(string(usize::from(facts.empty_prompt_has_no_tokens)), 1, Some(1)))
        .item(array(ids, 1, None).description(Some("Token ids (ones out of the model's vocabulary: 400)")))
        .description(Some(
            "The prompt: text, a list of one text, or token ids; it must come to at least one token",
        ));
    common(facts)
        .description(Some("A `/v1/completions` request"))
        .property("prompt", prompt)
        .required("prompt")
        .property("max_tokens", max_tokens(Some(facts)))
        .property("logprobs", no_logprobs("Not supported: only false, 0 or null"))
}

fn chat(facts: &Facts) -> ObjectBuilder {
    let messages = array(Ref::from_schema_name(MESSAGE), 1, None).description(Some("The conversation so far"));
    common(facts)
        .description(Some("A `/v1/chat/completions` request"))
        .property("messages", messages)
        .required("messages")
        .property("max_completion_tokens", max_tokens(Some(facts)))
        .property(
            "max_tokens",
            max_tokens(None).deprecated(Some(Deprecated::True)).description(Some(
                "Replaced by `max_completion_tokens`: ignored when that is given, else read as it \
                     (so the context length bounds it too)",
            )),
        )
        .property("logprobs", no_logprobs("Not supported: only false, 0 or null"))
        .property("top_logprobs", no_logprobs("Not supported: only false, 0 or null"))
}

fn message() -> ObjectBuilder {
    let content = OneOfBuilder::new()
        .item(ObjectBuilder::new().schema_type(Type::String))
        .item(array(Ref::from_schema_name(TEXT_PART), 0, None))
        .description(Some("Text, or text content parts"));
    ObjectBuilder::new()
        .property("role", ObjectBuilder::new().schema_type(Type::String).enum_values(Some(ROLES)))
        .required("role")
        .property("content", content)
        .required("content")
}

fn text_part() -> ObjectBuilder {
    ObjectBuilder::new()
        .description(Some("A text content part (no other kind is served)"))
        .property("type", ObjectBuilder::new().schema_type(Type::String).enum_values(Some(["text"])))
        .required("type")
        .property("text", ObjectBuilder::new().schema_type(Type::String))
        .required("text")
}
