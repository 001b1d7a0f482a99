//! `/openapi.json`: the gateway's OpenAPI 3.1 document, built from the types
//! it answers with (their `ToSchema` derives), the request rules its parser
//! enforces (`requests`) and the routes it serves (`paths`), for what this
//! gateway serves now (`Facts`), so that clients and fuzzers can trust it.

mod paths;
mod requests;
#[cfg(test)]
mod tests;

use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{ComponentsBuilder, InfoBuilder, OpenApi, OpenApiBuilder};
use utoipa::ToSchema;

use crate::error::ErrorBody;
use crate::openai::{ChatCompletion, ChatCompletionChunk, Completion, ModelList};

/// Where the document is served.
pub const PATH: &str = "/openapi.json";

/// The security scheme of the generation routes: a tier's API key.
pub const API_KEY_SCHEME: &str = "api_key";

/// What the document depends on besides the code: what this gateway serves.
pub struct Facts<'a> {
    /// The one model name requests must give.
    pub model: &'a str,
    /// The tier names the tier header may give.
    pub tiers: Vec<&'a str>,
    /// The model's context length, once the agents have reported it.
    pub max_model_len: Option<u32>,
    /// Whether the tokenizer turns an empty prompt into no tokens (then an
    /// empty prompt is refused, and the schema says so).
    pub empty_prompt_has_no_tokens: bool,
}

pub fn document(facts: &Facts) -> OpenApi {
    let api_key = HttpBuilder::new()
        .scheme(HttpAuthScheme::Bearer)
        .description(Some("A tier's API key, which picks the request's tier"))
        .build();
    let components = ComponentsBuilder::new()
        .security_scheme(API_KEY_SCHEME, SecurityScheme::Http(api_key))
        .schemas_from_iter(requests::schemas(facts));
    let components = with::<Completion>(components);
    let components = with::<ChatCompletion>(components);
    let components = with::<ChatCompletionChunk>(components);
    let components = with::<ModelList>(components);
    let components = with::<ErrorBody>(components);
    let info = InfoBuilder::new()
        .title("tiertp gateway")
        .version(env!("CARGO_PKG_VERSION"))
        .description(Some(
            "OpenAI-compatible API of the tiertp gateway: the API key picks the request's SLO tier",
        ))
        .build();
    OpenApiBuilder::new()
        .info(info)
        .paths(paths::all(facts))
        .components(Some(components.build()))
        .build()
}

/// `builder` with `T`'s schema and those it refers to.
fn with<T: ToSchema>(builder: ComponentsBuilder) -> ComponentsBuilder {
    let mut nested = Vec::new();
    T::schemas(&mut nested);
    builder.schema_from::<T>().schemas_from_iter(nested)
}
