//! Text ⇄ token ids in the gateway (workers only see ids): the model's
//! `tokenizer.json` through HF `tokenizers`, and its chat template
//! (`chat_template.jinja` or `tokenizer_config.json`'s `chat_template`)
//! rendered with minijinja.

use std::path::Path;

use serde::Serialize;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum TokenizerError {
    #[error("{path}: cannot read: {message}")]
    Io { path: String, message: String },
    #[error("{origin}: not a valid tokenizer: {message}")]
    Tokenizer { origin: String, message: String },
    #[error("{origin}: bad chat template: {message}")]
    Template { origin: String, message: String },
    #[error("cannot tokenize: {0}")]
    Encode(String),
}

/// ChatML, used when the model ships no template.
const DEFAULT_CHAT_TEMPLATE: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

pub struct TextCodec {
    tokenizer: tokenizers::Tokenizer,
    templates: minijinja::Environment<'static>,
    bos_token: String,
    eos_token: String,
    /// Ids that end generation (the EOS token), sent as `stop_token_ids`.
    pub stop_token_ids: Vec<u32>,
}

impl TextCodec {
    /// From a model directory holding `tokenizer.json` and, optionally,
    /// `tokenizer_config.json` / `chat_template.jinja`.
    pub fn from_dir(dir: &Path) -> Result<Self, TokenizerError> {
        let read = |name: &str| -> Result<Option<String>, TokenizerError> {
            let p = dir.join(name);
            match std::fs::read_to_string(&p) {
                Ok(s) => Ok(Some(s)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && name != "tokenizer.json" => Ok(None),
                Err(e) => Err(TokenizerError::Io {
                    path: p.display().to_string(),
                    message: e.to_string(),
                }),
            }
        };
        let json = read("tokenizer.json")?.unwrap_or_default();
        let config = read("tokenizer_config.json")?;
        let template = read("chat_template.jinja")?;
        Self::from_parts(&json, config.as_deref(), template.as_deref(), &dir.display().to_string())
    }

    /// `config` is `tokenizer_config.json`'s text; `template` overrides its
    /// `chat_template`.
    pub fn from_parts(tokenizer_json: &str, config: Option<&str>, template: Option<&str>, origin: &str) -> Result<Self, TokenizerError> {
        let tokenizer: tokenizers::Tokenizer = tokenizer_json.parse().map_err(|e: tokenizers::Error| TokenizerError::Tokenizer {
            origin: origin.to_string(),
            message: e.to_string(),
        })?;
        let config: serde_json::Value = match config {
            Some(text) => serde_json::from_str(text).map_err(|e| TokenizerError::Tokenizer {
                origin: format!("{origin}/tokenizer_config.json"),
                message: e.to_string(),
            })?,
            None => serde_json::Value::Null,
        };
        // A special token is a string or {"content": ...}.
        let special = |key: &str| -> String {
            match &config[key] {
                serde_json::Value::String(s) => s.clone(),
                v => v["content"].as_str().unwrap_or_default().to_string(),
            }
        };
        let (bos_token, eos_token) = (special("bos_token"), special("eos_token"));
        let source = template
            .map(str::to_string)
            .or_else(|| config["chat_template"].as_str().map(str::to_string))
            .unwrap_or_else(|| DEFAULT_CHAT_TEMPLATE.to_string());
        let mut templates = minijinja::Environment::new();
        templates.add_function("raise_exception", |msg: String| -> Result<String, minijinja::Error> {
            Err(minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, msg))
        });
        templates.add_template_owned("chat", source).map_err(|e| TokenizerError::Template {
            origin: origin.to_string(),
            message: e.to_string(),
        })?;
        let stop_token_ids = tokenizer.token_to_id(&eos_token).into_iter().collect();
        Ok(Self {
            tokenizer,
            templates,
            bos_token,
            eos_token,
            stop_token_ids,
        })
    }

    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, TokenizerError> {
        self.tokenizer
            .encode_fast(text, add_special_tokens)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| TokenizerError::Encode(e.to_string()))
    }

    pub fn decode(&self, ids: &[u32]) -> String {
        self.tokenizer.decode(ids, true).unwrap_or_default()
    }

    /// The chat prompt, ending with the assistant turn's opening.
    pub fn apply_chat_template(&self, messages: &[ChatMessage]) -> Result<String, TokenizerError> {
        let tmpl = self.templates.get_template("chat").expect("added at load");
        tmpl.render(minijinja::context! {
            messages => messages,
            add_generation_prompt => true,
            bos_token => &self.bos_token,
            eos_token => &self.eos_token,
        })
        .map_err(|e| TokenizerError::Template {
            origin: "chat template".into(),
            message: e.to_string(),
        })
    }

    /// A tiny word-level tokenizer (whitespace split, 32 words): self-contained
    /// tests and the bench use it instead of a downloaded model.
    pub fn tiny() -> Self {
        Self::from_parts(
            &tiny_tokenizer_json(),
            Some(r#"{"eos_token": "<eos>", "bos_token": "<bos>"}"#),
            None,
            "tiny",
        )
        .expect("the tiny tokenizer is valid")
    }
}

pub fn tiny_tokenizer_json() -> String {
    let words = [
        "<unk>",
        "<eos>",
        "<bos>",
        "<|im_start|>",
        "<|im_end|>",
        "hello",
        "world",
        "the",
        "quick",
        "brown",
        "fox",
        "jumps",
        "over",
        "lazy",
        "dog",
        "a",
        "b",
        "c",
        "d",
        "e",
        "user",
        "assistant",
        "system",
        "say",
        "hi",
        "one",
        "two",
        "three",
        "STOP",
        "end",
        ".",
        ",",
    ];
    let vocab: serde_json::Map<String, serde_json::Value> = words.iter().enumerate().map(|(i, w)| (w.to_string(), i.into())).collect();
    let added: Vec<serde_json::Value> = (1..5)
        .map(|i| serde_json::json!({"id": i, "content": words[i], "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}))
        .collect();
    serde_json::json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": null,
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiny_round_trip_and_chat_template() {
        let c = TextCodec::tiny();
        let ids = c.encode("hello world", false).unwrap();
        assert_eq!(ids, vec![5, 6]);
        assert_eq!(c.decode(&ids), "hello world");
        assert_eq!(c.stop_token_ids, vec![1]);
        let p = c
            .apply_chat_template(&[ChatMessage {
                role: "user".into(),
                content: "say hi".into(),
            }])
            .unwrap();
        assert_eq!(p, "<|im_start|>user\nsay hi<|im_end|>\n<|im_start|>assistant\n");
        assert_eq!(c.encode(&p, false).unwrap(), vec![3, 20, 23, 24, 4, 3, 21]);
    }

    #[test]
    fn smollm2_when_cached() {
        // The embedded model dir, when a previous `tiertp` run cached it.
        let Some(home) = std::env::var_os("HOME") else { return };
        let dir = Path::new(&home).join(".cache/tiertp/models/smollm2-135m-v1");
        if !dir.join("tokenizer.json").exists() {
            return;
        }
        let c = TextCodec::from_dir(&dir).unwrap();
        let ids = c.encode("Hello, world!", false).unwrap();
        assert_eq!(c.decode(&ids), "Hello, world!");
        let p = c
            .apply_chat_template(&[ChatMessage {
                role: "user".into(),
                content: "Hi".into(),
            }])
            .unwrap();
        assert!(
            p.starts_with("<|im_start|>system\n") && p.ends_with("<|im_start|>assistant\n"),
            "{p}"
        );
        assert_eq!(c.stop_token_ids.len(), 1);
    }
}
