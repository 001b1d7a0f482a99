//! Answering a running request: one JSON body, or Server-Sent Events with
//! one chunk per piece of text, then the usage chunk when asked for, then
//! `[DONE]`. An error after the stream started goes out as one more event
//! (the status line is already sent), followed by `[DONE]`.

use std::convert::Infallible;

use axum::http::header;
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;
use crate::generate::Running;
use crate::openai::{Endpoint, Envelope, Usage};

/// What every answer of one request carries besides its text.
#[derive(Debug, Clone)]
pub struct Reply {
    pub endpoint: Endpoint,
    pub id: String,
    pub created: u64,
    pub model: String,
    pub stream: bool,
    /// `stream_options.include_usage`: a last chunk with the token counts.
    pub include_usage: bool,
}

impl Reply {
    fn envelope(&self) -> Envelope<'_> {
        Envelope {
            endpoint: self.endpoint,
            id: &self.id,
            created: self.created,
            model: &self.model,
        }
    }
}

/// The answer to `run`, streamed or whole as `reply` asks.
pub async fn respond(run: Running, reply: Reply) -> Result<Response, ApiError> {
    if reply.stream {
        Ok(sse(run, reply))
    } else {
        whole(run, reply).await
    }
}

/// Waits for all the text, then answers with one JSON body.
async fn whole(mut run: Running, reply: Reply) -> Result<Response, ApiError> {
    let mut text = String::new();
    let finish = loop {
        let piece = run.next(false).await?;
        text.push_str(&piece.text);
        if let Some(f) = piece.finish {
            break f;
        }
    };
    let usage = Usage::new(run.prompt_tokens(), finish.completion_tokens);
    let body = reply.envelope().full(&text, finish.reason, usage);
    Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
}

/// The stream owns `run`: a client that goes away drops it, which cancels
/// the request on its worker.
fn sse(run: Running, reply: Reply) -> Response {
    let state = SseState {
        run,
        reply,
        first: true,
        tail: Vec::new(),
        over: false,
    };
    let events = futures_util::stream::unfold(state, |mut s| async move {
        let data = s.next_data().await?;
        Some((Ok::<_, Infallible>(Event::default().data(data)), s))
    });
    Sse::new(events).into_response()
}

struct SseState {
    run: Running,
    reply: Reply,
    /// No chunk sent yet (the first chat chunk carries the role).
    first: bool,
    /// Events still to send after the last piece, in reverse order (`pop`).
    tail: Vec<String>,
    /// The request ended: only `tail` is left.
    over: bool,
}

impl SseState {
    /// The next event's data; `None` ends the stream.
    async fn next_data(&mut self) -> Option<String> {
        if let Some(data) = self.tail.pop() {
            return Some(data);
        }
        if self.over {
            return None;
        }
        let data = match self.run.next(true).await {
            Ok(piece) => {
                let env = self.reply.envelope();
                let chunk = env.chunk(&piece.text, self.first, piece.finish.as_ref().map(|f| f.reason));
                if let Some(f) = piece.finish {
                    self.over = true;
                    self.tail.push("[DONE]".into());
                    if self.reply.include_usage {
                        self.tail
                            .push(env.usage_chunk(Usage::new(self.run.prompt_tokens(), f.completion_tokens)));
                    }
                }
                chunk
            }
            Err(e) => {
                self.over = true;
                self.tail.push("[DONE]".into());
                e.body().to_string()
            }
        };
        self.first = false;
        Some(data)
    }
}
