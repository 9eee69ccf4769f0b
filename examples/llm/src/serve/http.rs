//! Rank 0's HTTP side (axum): the routes, the bounded queue in front of the worker, and
//! answers as one JSON body or as server-sent events.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError};
use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::extract::{Path, Request, State};
use axum::http::{header, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::{json, Value};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use super::api::{self, ApiError, Endpoint, Head, Input, Piece};
use super::chat::ChatTemplate;
use super::engine::{Event, Job, JobParams};
use crate::tokenizer::Tokenizer;

/// Largest request body accepted.
const BODY_LIMIT: usize = 16 << 20;

/// What every handler shares.
pub struct Shared {
    /// The model's id in the API.
    pub model_id: String,
    /// When the server started (Unix seconds): the model's `created`.
    pub created: u64,
    /// Largest prompt + generation, in tokens.
    pub context: usize,
    /// The tokenizer.
    pub tok: Arc<Tokenizer>,
    /// The chat template, or why there is none.
    pub template: Result<ChatTemplate, String>,
    /// The queue in front of the worker (bounded).
    pub jobs: SyncSender<Job>,
    /// Set when the cluster has failed: every request is refused with it.
    pub fatal: Mutex<Option<String>>,
    /// Numbers the responses.
    pub next_id: AtomicU64,
    /// Newcomers' requests to join, to the worker (bounded: one at a time).
    pub joins: SyncSender<super::join::Request>,
    /// What a newcomer must send to join ([`super::join::proof`]), or `None` when the server
    /// runs without a group and a job key.
    pub join_proof: Option<String>,
}

/// The routes.
pub fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/v1/models", get(models))
        .route("/v1/models/{id}", get(model))
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat))
        .route("/health", get(health))
        .route("/boltccl/join", post(join))
        .fallback(not_found)
        .method_not_allowed_fallback(not_allowed)
        .with_state(shared)
}

fn json_response(status: StatusCode, v: &Value) -> Response {
    (status, [(header::CONTENT_TYPE, "application/json")], v.to_string()).into_response()
}

fn error(e: ApiError) -> Response {
    json_response(StatusCode::from_u16(e.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR), &e.to_json())
}

async fn health(State(s): State<Arc<Shared>>) -> Response {
    match s.fatal.lock().unwrap().clone() {
        None => json_response(StatusCode::OK, &json!({"status": "ok"})),
        Some(why) => error(ApiError::server(503, "cluster_failed", why)),
    }
}

/// A replacement rank asks to join ([`super::join`]): answered with its ticket once rank 0's
/// worker has taken the request (between two generations).
async fn join(State(s): State<Arc<Shared>>, body: Bytes) -> Response {
    let Some(want) = &s.join_proof else {
        return error(ApiError::invalid("this server runs without a boltccl group and job key: nothing to join"));
    };
    let proof = serde_json::from_slice::<Value>(&body).ok().and_then(|v| v["proof"].as_str().map(str::to_string));
    if proof.as_deref() != Some(want.as_str()) {
        let e = ApiError::invalid(
            "the join proof does not match this job: start the newcomer with the job's BOLTCCL_JOB_KEY",
        );
        return error(e.with_status(403).with_code("join_refused"));
    }
    let (reply, answer) = tokio::sync::oneshot::channel();
    if let Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) = s.joins.try_send(super::join::Request { reply })
    {
        return error(ApiError::server(429, "join_busy", "another rank is joining: try again when it has"));
    }
    match tokio::time::timeout(super::join::ANSWER_WITHIN, answer).await {
        Ok(Ok(Ok(ticket))) => json_response(StatusCode::OK, &json!(ticket)),
        Ok(Ok(Err(why))) => error(ApiError::server(503, "join_failed", why)),
        _ => error(ApiError::server(503, "join_failed", "rank 0 did not take the join in time")),
    }
}

async fn models(State(s): State<Arc<Shared>>) -> Response {
    json_response(StatusCode::OK, &json!({"object": "list", "data": [api::model_entry(&s.model_id, s.created)]}))
}

async fn model(State(s): State<Arc<Shared>>, Path(id): Path<String>) -> Response {
    if id == s.model_id {
        json_response(StatusCode::OK, &api::model_entry(&s.model_id, s.created))
    } else {
        error(unknown_model(&s, &id))
    }
}

fn unknown_model(s: &Shared, id: &str) -> ApiError {
    ApiError::bad("model", format!("the model `{id}` does not exist; this server has `{}`", s.model_id))
        .with_status(404)
        .with_code("model_not_found")
}

async fn not_found(method: Method, uri: Uri) -> Response {
    let e = ApiError::invalid(format!(
        "no route for {method} {}: this server has GET /v1/models, POST /v1/completions and POST /v1/chat/completions",
        uri.path()
    ));
    error(e.with_status(404).with_code("not_found"))
}

async fn not_allowed(method: Method, uri: Uri) -> Response {
    let e = ApiError::invalid(format!("{method} is not allowed on {}", uri.path()));
    error(e.with_status(405).with_code("method_not_allowed"))
}

async fn completions(State(s): State<Arc<Shared>>, req: Request) -> Response {
    generate(s, Endpoint::Completions, req).await.unwrap_or_else(error)
}

async fn chat(State(s): State<Arc<Shared>>, req: Request) -> Response {
    generate(s, Endpoint::Chat, req).await.unwrap_or_else(error)
}

/// A completion or a chat: check, tokenise, queue, then answer.
async fn generate(s: Arc<Shared>, endpoint: Endpoint, req: Request) -> Result<Response, ApiError> {
    let body = axum::body::to_bytes(req.into_body(), BODY_LIMIT).await.map_err(|e| {
        ApiError::invalid(format!("could not read the request body ({e}); at most {} MiB", BODY_LIMIT >> 20))
            .with_status(413)
    })?;
    let r = api::parse(&body, endpoint)?;
    if r.model != s.model_id {
        return Err(unknown_model(&s, &r.model));
    }
    if let Some(why) = s.fatal.lock().unwrap().clone() {
        return Err(ApiError::server(503, "cluster_failed", why));
    }
    // Tokenising a long prompt takes a while: off the event loop.
    let shared = s.clone();
    let input = r.input.clone();
    let prompt = tokio::task::spawn_blocking(move || prompt_ids(&shared, input))
        .await
        .map_err(|e| ApiError::server(500, "internal_error", format!("tokenising failed: {e}")))??;
    let n = prompt.len();
    if n >= s.context {
        return Err(ApiError::bad(
            if endpoint == Endpoint::Chat { "messages" } else { "prompt" },
            format!("this model's context is {} tokens, and the prompt alone has {n}; shorten it", s.context),
        )
        .with_code("context_length_exceeded"));
    }
    // OpenAI's defaults: 16 for a completion, the rest of the context for a chat.
    let room = s.context - n;
    let max_tokens = match (r.max_tokens, endpoint) {
        (Some(m), _) if m > room => {
            return Err(ApiError::bad(
                "max_tokens",
                format!(
                    "this model's context is {} tokens: the prompt's {n} and max_tokens {m} do not fit; ask for at \
                     most {room}",
                    s.context
                ),
            )
            .with_code("context_length_exceeded"))
        }
        (Some(m), _) => m,
        (None, Endpoint::Completions) => 16.min(room),
        (None, Endpoint::Chat) => room,
    };
    let seed = r.seed.unwrap_or_else(|| {
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        t.as_nanos() as u64
    });
    let params = JobParams { max_tokens, temperature: r.temperature, top_p: r.top_p, seed };
    let (tx, rx) = unbounded_channel();
    match s.jobs.try_send(Job { prompt, params, stop: r.stop.clone(), events: tx }) {
        Ok(()) => {}
        Err(TrySendError::Full(_)) => {
            return Err(ApiError::server(
                429,
                "queue_full",
                "the server is busy: its request queue is full (boltccl-llm serve --max-queue); retry later",
            ))
        }
        Err(TrySendError::Disconnected(_)) => {
            let why = s.fatal.lock().unwrap().clone().unwrap_or_else(|| "the server is stopping".into());
            return Err(ApiError::server(503, "unavailable", why));
        }
    }
    let number = s.next_id.fetch_add(1, Ordering::Relaxed);
    let id = match endpoint {
        Endpoint::Chat => format!("chatcmpl-{:x}-{number}", s.created),
        Endpoint::Completions => format!("cmpl-{:x}-{number}", s.created),
    };
    let created = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let out = Out { id, created, model: s.model_id.clone(), endpoint, include_usage: r.include_usage };
    if r.stream {
        Ok(stream(out, rx))
    } else {
        whole(out, rx).await
    }
}

/// The prompt's token ids: the chat template's text for a chat, the text or ids given for a
/// completion; the beginning-of-sequence token first when the model wants one and the text
/// does not already start with it (as the CLI does).
fn prompt_ids(s: &Shared, input: Input) -> Result<Vec<u32>, ApiError> {
    let text = match input {
        Input::Ids(ids) => {
            let v = s.tok.vocab_size();
            if let Some(bad) = ids.iter().find(|&&t| t as usize >= v) {
                return Err(ApiError::bad("prompt", format!("token id {bad} is not in the vocabulary ({v} tokens)")));
            }
            return if ids.is_empty() { Err(ApiError::bad("prompt", "the prompt is empty")) } else { Ok(ids) };
        }
        Input::Text(t) => t,
        Input::Messages(m) => match &s.template {
            Ok(t) => t.render(&m).map_err(|e| ApiError::bad("messages", e))?,
            Err(why) => return Err(ApiError::invalid(why.clone()).with_code("no_chat_template")),
        },
    };
    let mut ids = Vec::new();
    if let (true, Some(bos)) = (s.tok.add_bos, s.tok.bos) {
        if !text.starts_with(&s.tok.decode(&[bos], true)) || s.tok.decode(&[bos], true).is_empty() {
            ids.push(bos);
        }
    }
    ids.extend(s.tok.encode(&text, true).map_err(|e| ApiError::bad("prompt", format!("cannot tokenise: {e:#}")))?);
    if ids.is_empty() {
        return Err(ApiError::bad("prompt", "the prompt is empty"));
    }
    Ok(ids)
}

/// How to label a response.
struct Out {
    id: String,
    created: u64,
    model: String,
    endpoint: Endpoint,
    include_usage: bool,
}

impl Out {
    fn head(&self) -> Head<'_> {
        Head { id: &self.id, created: self.created, model: &self.model, endpoint: self.endpoint }
    }
}

/// Waits for the whole text, then answers it as one JSON body.
async fn whole(out: Out, mut rx: UnboundedReceiver<Event>) -> Result<Response, ApiError> {
    let mut text = String::new();
    loop {
        match rx.recv().await {
            Some(Event::Text(t)) => text.push_str(&t),
            Some(Event::Done { finish_reason, prompt_tokens, completion_tokens }) => {
                let body = out.head().response(&text, finish_reason, prompt_tokens, completion_tokens);
                return Ok(json_response(StatusCode::OK, &body));
            }
            Some(Event::Error(why)) => return Err(cluster_failed(&why)),
            Some(Event::Lost(why)) => return Err(rank_lost(why)),
            None => return Err(cluster_failed("the generation worker stopped")),
        }
    }
}

fn cluster_failed(why: &str) -> ApiError {
    ApiError::server(500, "cluster_failed", format!("generation failed: {why}; the server is stopping"))
}

/// A rank died during the request and the others healed: 503, worth retrying.
fn rank_lost(why: String) -> ApiError {
    ApiError::server(503, "rank_lost", why)
}

/// Answers as server-sent events: `data: {chunk}` lines, then `data: [DONE]`. The body owns
/// the receiver: when the client goes away, hyper drops the body, and the worker sees the
/// channel closed at its next token and stops.
fn stream(out: Out, rx: UnboundedReceiver<Event>) -> Response {
    struct St {
        out: Out,
        rx: UnboundedReceiver<Event>,
        started: bool,
        done: bool,
    }
    let st = St { out, rx, started: false, done: false };
    let events = futures_util::stream::unfold(st, |mut st| async move {
        if st.done {
            return None;
        }
        let inc = st.out.include_usage;
        let mut buf = String::new();
        if !st.started && st.out.endpoint == Endpoint::Chat {
            sse(&mut buf, &st.out.head().chunk(Piece::Role, inc));
        }
        st.started = true;
        match st.rx.recv().await {
            Some(Event::Text(t)) => sse(&mut buf, &st.out.head().chunk(Piece::Text(&t), inc)),
            Some(Event::Done { finish_reason, prompt_tokens, completion_tokens }) => {
                sse(&mut buf, &st.out.head().chunk(Piece::Finish(finish_reason), inc));
                if inc {
                    sse(&mut buf, &st.out.head().usage_chunk(prompt_tokens, completion_tokens));
                }
                buf.push_str("data: [DONE]\n\n");
                st.done = true;
            }
            Some(Event::Error(why)) => {
                sse(&mut buf, &cluster_failed(&why).to_json());
                st.done = true;
            }
            Some(Event::Lost(why)) => {
                sse(&mut buf, &rank_lost(why).to_json());
                st.done = true;
            }
            None => {
                sse(&mut buf, &cluster_failed("the generation worker stopped").to_json());
                st.done = true;
            }
        }
        Some((Ok::<_, Infallible>(Bytes::from(buf)), st))
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(events))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

fn sse(buf: &mut String, v: &Value) {
    buf.push_str("data: ");
    buf.push_str(&v.to_string());
    buf.push_str("\n\n");
}
