//! OpenAI's request and response shapes: parsing and checking a request body, errors in
//! OpenAI's `{"error": {"message", "type", "param", "code"}}` form, and the JSON of responses
//! and stream chunks. No HTTP here.

use serde_json::{json, Map, Value};

/// An error answered to the client, in OpenAI's shape.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// HTTP status.
    pub status: u16,
    /// What went wrong and what to do about it.
    pub message: String,
    /// OpenAI's error type: `invalid_request_error` (4xx) or `server_error` (5xx).
    pub kind: &'static str,
    /// The request parameter at fault, if one is.
    pub param: Option<String>,
    /// A machine-readable code, such as `model_not_found` or `context_length_exceeded`.
    pub code: Option<&'static str>,
}

impl ApiError {
    /// A 400 about parameter `param`.
    pub fn bad(param: &str, message: impl Into<String>) -> Self {
        Self {
            status: 400,
            message: message.into(),
            kind: "invalid_request_error",
            param: Some(param.to_string()),
            code: None,
        }
    }

    /// A 400 not about one parameter (e.g. the body is not JSON).
    pub fn invalid(message: impl Into<String>) -> Self {
        Self { param: None, ..Self::bad("", message) }
    }

    /// A 5xx from the server's side.
    pub fn server(status: u16, code: &'static str, message: impl Into<String>) -> Self {
        Self { status, message: message.into(), kind: "server_error", param: None, code: Some(code) }
    }

    /// Sets the code.
    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    /// Sets the status.
    pub fn with_status(mut self, status: u16) -> Self {
        self.status = status;
        self
    }

    /// The body: `{"error": {"message", "type", "param", "code"}}`.
    pub fn to_json(&self) -> Value {
        json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}})
    }
}

/// Which endpoint a request came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `/v1/completions`: a prompt, continued as it is.
    Completions,
    /// `/v1/chat/completions`: messages, formatted by the model's chat template.
    Chat,
}

/// One chat message.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    /// `system`, `user`, `assistant`, ... (passed to the template as it is).
    pub role: String,
    /// Its text.
    pub content: String,
}

/// What to continue.
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    /// A completion's prompt as text.
    Text(String),
    /// A completion's prompt as token ids.
    Ids(Vec<u32>),
    /// A chat.
    Messages(Vec<Message>),
}

/// A checked request.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// The model asked for.
    pub model: String,
    /// What to continue.
    pub input: Input,
    /// `max_tokens` (or `max_completion_tokens`), when given.
    pub max_tokens: Option<usize>,
    /// Sampling temperature (OpenAI's default 1; 0 is greedy).
    pub temperature: f32,
    /// Nucleus mass (default 1: off).
    pub top_p: f32,
    /// Sampling seed, when given.
    pub seed: Option<u64>,
    /// Stop sequences (at most 4).
    pub stop: Vec<String>,
    /// Server-sent events instead of one JSON body.
    pub stream: bool,
    /// `stream_options.include_usage`: a last chunk with the token counts.
    pub include_usage: bool,
}

/// The parameters this server takes, for the message that refuses the others.
pub fn supported(endpoint: Endpoint) -> &'static str {
    match endpoint {
        Endpoint::Completions => {
            "model, prompt, max_tokens, temperature, top_p, seed, stop, stream, stream_options, n (1 only), user"
        }
        Endpoint::Chat => {
            "model, messages, max_tokens (or max_completion_tokens), temperature, top_p, seed, stop, stream, \
             stream_options, n (1 only), user"
        }
    }
}

/// Parses and checks a request body.
pub fn parse(body: &[u8], endpoint: Endpoint) -> Result<Request, ApiError> {
    let v: Value = serde_json::from_slice(body).map_err(|e| {
        ApiError::invalid(format!("the request body is not valid JSON ({e}); send a JSON object"))
            .with_code("invalid_json")
    })?;
    let Value::Object(mut o) = v else {
        return Err(ApiError::invalid("the request body must be a JSON object"));
    };
    // JSON null means "not given", as in OpenAI's API.
    o.retain(|_, v| !v.is_null());
    let mut take = |k: &str| o.remove(k);

    let model = match take("model") {
        Some(Value::String(s)) => s,
        Some(_) => return Err(ApiError::bad("model", "`model` must be a string")),
        None => return Err(ApiError::bad("model", "`model` is required (GET /v1/models lists it)")),
    };
    let input = match endpoint {
        Endpoint::Completions => prompt(take("prompt"))?,
        Endpoint::Chat => Input::Messages(messages(take("messages"))?),
    };
    let mut max_tokens = count(take("max_tokens"), "max_tokens")?;
    if endpoint == Endpoint::Chat {
        if let Some(m) = count(take("max_completion_tokens"), "max_completion_tokens")? {
            max_tokens = Some(m);
        }
    }
    let temperature = number(take("temperature"), "temperature", 0.0, 2.0)?.unwrap_or(1.0);
    let top_p = number(take("top_p"), "top_p", 0.0, 1.0)?.unwrap_or(1.0);
    let seed = match take("seed") {
        None => None,
        Some(Value::Number(n)) if n.is_u64() => n.as_u64(),
        Some(Value::Number(n)) if n.is_i64() => n.as_i64().map(|s| s as u64),
        Some(_) => return Err(ApiError::bad("seed", "`seed` must be an integer")),
    };
    let stop = match take("stop") {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s],
        Some(Value::Array(a)) if a.len() <= 4 && a.iter().all(Value::is_string) => {
            a.into_iter().filter_map(|s| s.as_str().map(str::to_string)).collect()
        }
        Some(_) => return Err(ApiError::bad("stop", "`stop` must be a string or a list of at most 4 strings")),
    };
    let stream = match take("stream") {
        None => false,
        Some(Value::Bool(b)) => b,
        Some(_) => return Err(ApiError::bad("stream", "`stream` must be true or false")),
    };
    let include_usage = match take("stream_options") {
        None => false,
        Some(_) if !stream => {
            return Err(ApiError::bad("stream_options", "`stream_options` is only allowed with `stream: true`"))
        }
        Some(Value::Object(mut so)) => {
            let usage = match so.remove("include_usage") {
                None | Some(Value::Null) => false,
                Some(Value::Bool(b)) => b,
                Some(_) => {
                    return Err(ApiError::bad("stream_options", "`stream_options.include_usage` must be true or false"))
                }
            };
            if let Some(k) = so.keys().next() {
                return Err(ApiError::bad(
                    "stream_options",
                    format!("unsupported stream option `{k}` (supported: include_usage)"),
                ));
            }
            usage
        }
        Some(_) => return Err(ApiError::bad("stream_options", "`stream_options` must be an object")),
    };
    match take("n") {
        None => {}
        Some(Value::Number(n)) if n.as_u64() == Some(1) => {}
        Some(_) => return Err(ApiError::bad("n", "only `n: 1` is supported (one choice per request)")),
    }
    match take("user") {
        None | Some(Value::String(_)) => {}
        Some(_) => return Err(ApiError::bad("user", "`user` must be a string")),
    }
    // What clients often send at its neutral value is accepted at that value only.
    for (k, neutral) in [
        ("presence_penalty", json!(0)),
        ("frequency_penalty", json!(0)),
        ("logprobs", json!(false)),
        ("echo", json!(false)),
        ("best_of", json!(1)),
    ] {
        if let Some(v) = take(k) {
            if v.as_f64() != neutral.as_f64() || v.as_bool() != neutral.as_bool() {
                return Err(ApiError::bad(
                    k,
                    format!(
                        "`{k}` is not supported (only its default, {neutral}); this server takes {}",
                        supported(endpoint)
                    ),
                ));
            }
        }
    }
    if let Some(k) = o.keys().next() {
        return Err(ApiError::bad(
            k,
            format!("unsupported parameter `{k}`; this server takes {}", supported(endpoint)),
        ));
    }
    Ok(Request { model, input, max_tokens, temperature, top_p, seed, stop, stream, include_usage })
}

fn prompt(v: Option<Value>) -> Result<Input, ApiError> {
    let ids = |a: &[Value]| -> Option<Vec<u32>> {
        a.iter().map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok())).collect()
    };
    match v {
        None => Err(ApiError::bad("prompt", "`prompt` is required")),
        Some(Value::String(s)) => Ok(Input::Text(s)),
        Some(Value::Array(a)) => match a.as_slice() {
            [Value::String(s)] => Ok(Input::Text(s.clone())),
            [Value::Array(inner)] => ids(inner).map(Input::Ids).ok_or_else(bad_prompt),
            [Value::Number(_), ..] => ids(&a).map(Input::Ids).ok_or_else(bad_prompt),
            [_, _, ..] if a.iter().all(|x| x.is_string() || x.is_array()) => {
                Err(ApiError::bad("prompt", "only one prompt per request is supported"))
            }
            _ => Err(bad_prompt()),
        },
        Some(_) => Err(bad_prompt()),
    }
}

fn bad_prompt() -> ApiError {
    ApiError::bad("prompt", "`prompt` must be a string or a list of token ids")
}

fn messages(v: Option<Value>) -> Result<Vec<Message>, ApiError> {
    let Some(Value::Array(list)) = v else {
        return Err(ApiError::bad("messages", "`messages` must be a list of {role, content} objects"));
    };
    if list.is_empty() {
        return Err(ApiError::bad("messages", "`messages` must not be empty"));
    }
    let mut out = Vec::with_capacity(list.len());
    for (i, m) in list.into_iter().enumerate() {
        let param = format!("messages[{i}]");
        let Value::Object(mut m) = m else {
            return Err(ApiError::bad(&param, "each message must be an object with `role` and `content`"));
        };
        let role = match m.remove("role") {
            Some(Value::String(r)) => r,
            _ => return Err(ApiError::bad(&param, "each message needs a string `role`")),
        };
        let content = match m.remove("content") {
            None | Some(Value::Null) if role == "assistant" => String::new(),
            Some(Value::String(s)) => s,
            Some(Value::Array(parts)) => text_parts(parts, &param)?,
            _ => return Err(ApiError::bad(&param, "`content` must be a string or a list of text parts")),
        };
        m.remove("name");
        if let Some(k) = m.keys().next() {
            return Err(ApiError::bad(
                &param,
                format!("unsupported message field `{k}` (supported: role, content, name)"),
            ));
        }
        out.push(Message { role, content });
    }
    Ok(out)
}

/// The text of a list of content parts (`[{"type": "text", "text": ...}]`), joined.
fn text_parts(parts: Vec<Value>, param: &str) -> Result<String, ApiError> {
    let mut s = String::new();
    for p in parts {
        match (p.get("type").and_then(Value::as_str), p.get("text").and_then(Value::as_str)) {
            (Some("text"), Some(t)) => s.push_str(t),
            (Some(other), _) if other != "text" => {
                return Err(ApiError::bad(
                    param,
                    format!("content parts of type `{other}` are not supported (text only)"),
                ))
            }
            _ => return Err(ApiError::bad(param, "a content part must be {\"type\": \"text\", \"text\": \"...\"}")),
        }
    }
    Ok(s)
}

fn count(v: Option<Value>, name: &str) -> Result<Option<usize>, ApiError> {
    match v {
        None => Ok(None),
        Some(Value::Number(n)) => match n.as_u64() {
            Some(0) | None => Err(ApiError::bad(name, format!("`{name}` must be a positive integer"))),
            Some(k) => Ok(Some(usize::try_from(k).unwrap_or(usize::MAX))),
        },
        Some(_) => Err(ApiError::bad(name, format!("`{name}` must be a positive integer"))),
    }
}

fn number(v: Option<Value>, name: &str, lo: f64, hi: f64) -> Result<Option<f32>, ApiError> {
    match v {
        None => Ok(None),
        Some(Value::Number(n)) => match n.as_f64() {
            Some(x) if (lo..=hi).contains(&x) => Ok(Some(x as f32)),
            _ => Err(ApiError::bad(name, format!("`{name}` must be a number from {lo} to {hi}"))),
        },
        Some(_) => Err(ApiError::bad(name, format!("`{name}` must be a number from {lo} to {hi}"))),
    }
}

/// The `/v1/models` entry of the model served.
pub fn model_entry(id: &str, created: u64) -> Value {
    json!({"id": id, "object": "model", "created": created, "owned_by": "boltccl"})
}

/// Token counts.
pub fn usage(prompt: usize, completion: usize) -> Value {
    json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion})
}

/// Identifies a response.
#[derive(Debug, Clone)]
pub struct Head<'a> {
    /// `chatcmpl-...` or `cmpl-...`.
    pub id: &'a str,
    /// Unix seconds.
    pub created: u64,
    /// The model's id.
    pub model: &'a str,
    /// Which endpoint.
    pub endpoint: Endpoint,
}

impl Head<'_> {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.endpoint, chunk) {
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
            (Endpoint::Completions, _) => "text_completion",
        }
    }

    fn with(&self, chunk: bool, choices: Value) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert("id".into(), json!(self.id));
        m.insert("object".into(), json!(self.object(chunk)));
        m.insert("created".into(), json!(self.created));
        m.insert("model".into(), json!(self.model));
        m.insert("choices".into(), choices);
        m
    }

    /// The whole answer (not streamed).
    pub fn response(&self, text: &str, finish_reason: &str, prompt: usize, completion: usize) -> Value {
        let choice = match self.endpoint {
            Endpoint::Chat => json!({
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": null,
                "finish_reason": finish_reason,
            }),
            Endpoint::Completions => {
                json!({"index": 0, "text": text, "logprobs": null, "finish_reason": finish_reason})
            }
        };
        let mut m = self.with(false, json!([choice]));
        m.insert("usage".into(), usage(prompt, completion));
        Value::Object(m)
    }

    /// A stream chunk: the chat's opening one (`role`), a piece of text, or the closing one
    /// (`finish_reason`, empty text). With `include_usage` every chunk has `"usage": null`.
    pub fn chunk(&self, piece: Piece<'_>, include_usage: bool) -> Value {
        let (text, finish) = match piece {
            Piece::Role => ("", None),
            Piece::Text(t) => (t, None),
            Piece::Finish(f) => ("", Some(f)),
        };
        let choice = match (self.endpoint, piece) {
            (Endpoint::Chat, Piece::Role) => json!({"role": "assistant", "content": ""}),
            (Endpoint::Chat, Piece::Text(_)) => json!({"content": text}),
            (Endpoint::Chat, Piece::Finish(_)) => json!({}),
            (Endpoint::Completions, _) => json!(text),
        };
        let choice = match self.endpoint {
            Endpoint::Chat => json!({"index": 0, "delta": choice, "logprobs": null, "finish_reason": finish}),
            Endpoint::Completions => json!({"index": 0, "text": choice, "logprobs": null, "finish_reason": finish}),
        };
        let mut m = self.with(true, json!([choice]));
        if include_usage {
            m.insert("usage".into(), Value::Null);
        }
        Value::Object(m)
    }

    /// The last chunk with `stream_options.include_usage`: no choices, the counts.
    pub fn usage_chunk(&self, prompt: usize, completion: usize) -> Value {
        let mut m = self.with(true, json!([]));
        m.insert("usage".into(), usage(prompt, completion));
        Value::Object(m)
    }
}

/// What a stream chunk carries.
#[derive(Debug, Clone, Copy)]
pub enum Piece<'a> {
    /// The chat's first chunk: `{"role": "assistant"}`.
    Role,
    /// Generated text.
    Text(&'a str),
    /// The end, with OpenAI's `finish_reason`.
    Finish(&'a str),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(body: &str) -> Result<Request, ApiError> {
        parse(body.as_bytes(), Endpoint::Chat)
    }

    #[test]
    fn a_full_chat_request_parses() {
        let r = chat(
            r#"{"model": "m", "messages": [{"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}]}],
                "max_tokens": 5, "temperature": 0, "top_p": 0.5, "seed": -1, "stop": ["\n"], "stream": true,
                "stream_options": {"include_usage": true}, "n": 1, "presence_penalty": 0, "user": "u", "logprobs": null}"#,
        )
        .unwrap();
        assert_eq!(r.model, "m");
        assert_eq!(
            r.input,
            Input::Messages(vec![
                Message { role: "system".into(), content: "be brief".into() },
                Message { role: "user".into(), content: "hi there".into() },
            ])
        );
        assert_eq!((r.max_tokens, r.temperature, r.top_p, r.seed), (Some(5), 0.0, 0.5, Some(u64::MAX)));
        assert_eq!(r.stop, ["\n"]);
        assert!(r.stream && r.include_usage);
        let d = chat(r#"{"model": "m", "messages": [{"role": "user", "content": "x"}]}"#).unwrap();
        assert_eq!((d.max_tokens, d.temperature, d.top_p, d.seed, d.stream), (None, 1.0, 1.0, None, false));
    }

    #[test]
    fn prompts_as_text_or_ids() {
        let p = |b: &str| parse(b.as_bytes(), Endpoint::Completions).map(|r| r.input);
        assert_eq!(p(r#"{"model":"m","prompt":"a"}"#).unwrap(), Input::Text("a".into()));
        assert_eq!(p(r#"{"model":"m","prompt":["a"]}"#).unwrap(), Input::Text("a".into()));
        assert_eq!(p(r#"{"model":"m","prompt":[1,2]}"#).unwrap(), Input::Ids(vec![1, 2]));
        assert_eq!(p(r#"{"model":"m","prompt":[[3]]}"#).unwrap(), Input::Ids(vec![3]));
        assert_eq!(p(r#"{"model":"m","prompt":["a","b"]}"#).unwrap_err().param.as_deref(), Some("prompt"));
        assert_eq!(p(r#"{"model":"m","prompt":[1,-2]}"#).unwrap_err().param.as_deref(), Some("prompt"));
    }

    #[test]
    fn bad_requests_name_the_parameter_and_what_is_supported() {
        let e = chat("{not json").unwrap_err();
        assert_eq!((e.status, e.kind, e.code), (400, "invalid_request_error", Some("invalid_json")));
        for (body, param) in [
            (r#"{"messages": [{"role": "user", "content": "x"}]}"#, "model"),
            (r#"{"model": "m"}"#, "messages"),
            (r#"{"model": "m", "messages": []}"#, "messages"),
            (r#"{"model": "m", "messages": [{"role": "user"}]}"#, "messages[0]"),
            (r#"{"model": "m", "messages": [{"role": "user", "content": "x"}], "n": 2}"#, "n"),
            (r#"{"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": 3}"#, "temperature"),
            (r#"{"model": "m", "messages": [{"role": "user", "content": "x"}], "top_p": "1"}"#, "top_p"),
            (r#"{"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 0}"#, "max_tokens"),
            (r#"{"model": "m", "messages": [{"role": "user", "content": "x"}], "stop": [1]}"#, "stop"),
            (
                r#"{"model": "m", "messages": [{"role": "user", "content": "x"}], "stream_options": {}}"#,
                "stream_options",
            ),
            (
                r#"{"model": "m", "messages": [{"role": "user", "content": "x"}], "presence_penalty": 1}"#,
                "presence_penalty",
            ),
            (r#"{"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": []}"#, "tools"),
        ] {
            let e = chat(body).unwrap_err();
            assert_eq!((e.status, e.param.as_deref()), (400, Some(param)), "{body}: {e:?}");
            assert!(!e.message.is_empty());
        }
        let e = chat(r#"{"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": []}"#).unwrap_err();
        assert!(e.message.contains("max_tokens") && e.message.contains("n (1 only)"), "{}", e.message);
        let j = e.to_json();
        assert_eq!(j["error"]["type"], "invalid_request_error");
        assert_eq!(j["error"]["param"], "tools");
        assert!(j["error"]["code"].is_null());
    }

    #[test]
    fn chunks_have_openai_shapes() {
        let h = Head { id: "chatcmpl-1", created: 5, model: "m", endpoint: Endpoint::Chat };
        assert_eq!(h.chunk(Piece::Role, false)["choices"][0]["delta"], json!({"role": "assistant", "content": ""}));
        assert_eq!(h.chunk(Piece::Text("a"), true)["choices"][0]["delta"]["content"], "a");
        assert!(h.chunk(Piece::Text("a"), true)["usage"].is_null());
        assert_eq!(h.chunk(Piece::Finish("stop"), false)["choices"][0]["finish_reason"], "stop");
        assert_eq!(h.usage_chunk(3, 4)["usage"]["total_tokens"], 7);
        let r = h.response("hi", "length", 3, 2);
        assert_eq!(r["object"], "chat.completion");
        assert_eq!(r["choices"][0]["message"]["content"], "hi");
        let c = Head { endpoint: Endpoint::Completions, ..h };
        assert_eq!(c.chunk(Piece::Text("b"), false)["choices"][0]["text"], "b");
        assert_eq!(c.response("x", "stop", 1, 1)["object"], "text_completion");
    }
}
