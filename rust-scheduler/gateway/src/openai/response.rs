//! The response bodies of `/v1/completions` and `/v1/chat/completions`:
//! whole answers and stream chunks. Each is one serde type whose
//! `ToSchema` derive is its schema in `/openapi.json`, so the document and
//! what is sent cannot drift apart.

use serde::Serialize;
use utoipa::openapi::schema::{ObjectBuilder, Type};
use utoipa::ToSchema;

use super::Endpoint;

#[derive(Debug, Clone, Copy, Serialize, PartialEq, ToSchema)]
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

/// Why generation ended: a stop string or the model's end token (`stop`),
/// or `max_tokens` (`length`). The schema of the `finish_reason` strings
/// `generate::Finish` carries.
#[derive(ToSchema)]
#[schema(rename_all = "lowercase")]
pub enum FinishReason {
    Stop,
    Length,
}

/// `logprobs` is always null: the workers compute no log probabilities
/// (a request asking for them is refused).
fn always_null() -> utoipa::openapi::Object {
    ObjectBuilder::new()
        .schema_type(Type::Null)
        .description(Some("Always null: log probabilities are not computed"))
        .build()
}

/// `object` of a completion and of each chunk of its stream.
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
enum TextCompletionObject {
    #[serde(rename = "text_completion")]
    TextCompletion,
}

#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
enum ChatCompletionObject {
    #[serde(rename = "chat.completion")]
    ChatCompletion,
}

#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
enum ChatChunkObject {
    #[serde(rename = "chat.completion.chunk")]
    ChatCompletionChunk,
}

#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
enum AssistantRole {
    #[serde(rename = "assistant")]
    Assistant,
}

/// A `/v1/completions` answer, or one chunk of its stream (the last chunk
/// of a stream with `stream_options.include_usage` has no choices, only
/// `usage`; a whole answer always has `usage`).
#[derive(Serialize, ToSchema)]
pub struct Completion<'a> {
    id: &'a str,
    object: TextCompletionObject,
    created: u64,
    model: &'a str,
    choices: Vec<CompletionChoice<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<Usage>,
}

#[derive(Serialize, ToSchema)]
struct CompletionChoice<'a> {
    index: u32,
    text: &'a str,
    #[schema(schema_with = always_null, required = true)]
    logprobs: Option<()>,
    /// Null until the last chunk of a stream.
    #[schema(value_type = Option<FinishReason>, required = true)]
    finish_reason: Option<&'a str>,
}

/// A whole `/v1/chat/completions` answer.
#[derive(Serialize, ToSchema)]
pub struct ChatCompletion<'a> {
    id: &'a str,
    object: ChatCompletionObject,
    created: u64,
    model: &'a str,
    choices: Vec<ChatChoice<'a>>,
    usage: Usage,
}

#[derive(Serialize, ToSchema)]
struct ChatChoice<'a> {
    index: u32,
    message: AssistantMessage<'a>,
    #[schema(schema_with = always_null, required = true)]
    logprobs: Option<()>,
    #[schema(value_type = FinishReason)]
    finish_reason: &'a str,
}

#[derive(Serialize, ToSchema)]
struct AssistantMessage<'a> {
    role: AssistantRole,
    content: &'a str,
}

/// One chunk of a `/v1/chat/completions` stream (the last chunk of a
/// stream with `stream_options.include_usage` has no choices, only `usage`).
#[derive(Serialize, ToSchema)]
pub struct ChatCompletionChunk<'a> {
    id: &'a str,
    object: ChatChunkObject,
    created: u64,
    model: &'a str,
    choices: Vec<ChatChunkChoice<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<Usage>,
}

#[derive(Serialize, ToSchema)]
struct ChatChunkChoice<'a> {
    index: u32,
    delta: Delta<'a>,
    #[schema(schema_with = always_null, required = true)]
    logprobs: Option<()>,
    /// Null until the last chunk.
    #[schema(value_type = Option<FinishReason>, required = true)]
    finish_reason: Option<&'a str>,
}

/// New text of a chat stream: the first chunk carries the role, the last
/// may carry no text.
#[derive(Serialize, ToSchema)]
struct Delta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<AssistantRole>,
    #[serde(skip_serializing_if = "Option::is_none")]
    content: Option<&'a str>,
}

/// The fields every response and chunk of one request share.
pub struct Envelope<'a> {
    pub endpoint: Endpoint,
    pub id: &'a str,
    pub created: u64,
    pub model: &'a str,
}

fn to_json(body: &impl Serialize) -> String {
    serde_json::to_string(body).expect("response bodies serialize")
}

impl<'a> Envelope<'a> {
    fn completion(&self, choices: Vec<CompletionChoice<'a>>, usage: Option<Usage>) -> String {
        to_json(&Completion {
            id: self.id,
            object: TextCompletionObject::TextCompletion,
            created: self.created,
            model: self.model,
            choices,
            usage,
        })
    }

    fn chat_chunk(&self, choices: Vec<ChatChunkChoice<'a>>, usage: Option<Usage>) -> String {
        to_json(&ChatCompletionChunk {
            id: self.id,
            object: ChatChunkObject::ChatCompletionChunk,
            created: self.created,
            model: self.model,
            choices,
            usage,
        })
    }

    /// A complete (non-streaming) response.
    pub fn full(&self, text: &'a str, finish_reason: &'a str, usage: Usage) -> String {
        match self.endpoint {
            Endpoint::Completions => self.completion(vec![completion_choice(text, Some(finish_reason))], Some(usage)),
            Endpoint::Chat => to_json(&ChatCompletion {
                id: self.id,
                object: ChatCompletionObject::ChatCompletion,
                created: self.created,
                model: self.model,
                choices: vec![ChatChoice {
                    index: 0,
                    message: AssistantMessage {
                        role: AssistantRole::Assistant,
                        content: text,
                    },
                    logprobs: None,
                    finish_reason,
                }],
                usage,
            }),
        }
    }

    /// One streamed chunk; the first chat chunk carries the role.
    pub fn chunk(&self, text: &'a str, first: bool, finish_reason: Option<&'a str>) -> String {
        match self.endpoint {
            Endpoint::Completions => self.completion(vec![completion_choice(text, finish_reason)], None),
            Endpoint::Chat => {
                // The role opens the stream; a finishing chunk may be empty.
                let delta = Delta {
                    role: first.then_some(AssistantRole::Assistant),
                    content: (first || !text.is_empty()).then_some(text),
                };
                let choice = ChatChunkChoice {
                    index: 0,
                    delta,
                    logprobs: None,
                    finish_reason,
                };
                self.chat_chunk(vec![choice], None)
            }
        }
    }

    /// The final usage chunk (`stream_options.include_usage`).
    pub fn usage_chunk(&self, usage: Usage) -> String {
        match self.endpoint {
            Endpoint::Completions => self.completion(Vec::new(), Some(usage)),
            Endpoint::Chat => self.chat_chunk(Vec::new(), Some(usage)),
        }
    }
}

fn completion_choice<'a>(text: &'a str, finish_reason: Option<&'a str>) -> CompletionChoice<'a> {
    CompletionChoice {
        index: 0,
        text,
        logprobs: None,
        finish_reason,
    }
}
