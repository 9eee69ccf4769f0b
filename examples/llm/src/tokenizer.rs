//! Byte-level BPE (GPT-2 style), built from the vocabulary and merge list in GGUF metadata.
//!
//! Encoding: split out special tokens, pre-tokenise with the GPT-2 regex (optionally isolating
//! every digit first, as SmolLM's tokenizer does), map each byte to a printable unicode char
//! (GPT-2's byte-to-unicode table), then repeatedly merge the adjacent pair with the lowest
//! merge rank. Decoding reverses the byte mapping.

use std::collections::HashMap;
use std::sync::Mutex;

use anyhow::{ensure, Context};
use fancy_regex::Regex;

/// GPT-2 pre-tokenisation pattern: contractions, letter runs, digit runs, punctuation runs,
/// and whitespace (trailing whitespace before a word stays with the word's leading space).
const GPT2_PATTERN: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

/// llama.cpp token type for control tokens (`<|im_start|>`, ...).
const TOKEN_TYPE_CONTROL: u32 = 3;
/// llama.cpp token type for user-defined tokens (also matched verbatim in input).
const TOKEN_TYPE_USER_DEFINED: u32 = 4;

/// GPT-2's reversible byte -> unicode mapping: printable bytes map to themselves, the rest are
/// shifted to code points 256.. so every byte has a visible, non-whitespace character.
fn byte_to_unicode() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut n = 0u32;
    for b in 0..256u32 {
        let printable = (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
        table[b as usize] = if printable {
            char::from_u32(b).unwrap()
        } else {
            n += 1;
            char::from_u32(255 + n).unwrap()
        };
    }
    table
}

/// A byte-level BPE tokenizer.
pub struct Tokenizer {
    tokens: Vec<String>,
    vocab: HashMap<String, u32>,
    merge_rank: HashMap<(String, String), u32>,
    /// Special tokens matched verbatim in the input, longest first.
    specials: Vec<(String, u32)>,
    is_special: Vec<bool>,
    byte_enc: [char; 256],
    byte_dec: HashMap<char, u8>,
    pre: Regex,
    split_digits: bool,
    cache: Mutex<HashMap<String, Vec<u32>>>,
    /// Beginning-of-sequence token id.
    pub bos: Option<u32>,
    /// End-of-sequence token id.
    pub eos: Option<u32>,
    /// Whether prompts start with [`Tokenizer::bos`] (`tokenizer.ggml.add_bos_token`).
    pub add_bos: bool,
}

impl Tokenizer {
    /// Builds a tokenizer. `merges` are `"left right"` strings in priority order; `types` are
    /// llama.cpp token types (may be empty).
    pub fn from_parts(
        tokens: Vec<String>,
        merges: &[String],
        types: &[u32],
        bos: Option<u32>,
        eos: Option<u32>,
    ) -> anyhow::Result<Self> {
        let vocab: HashMap<String, u32> = tokens.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect();
        let mut merge_rank = HashMap::with_capacity(merges.len());
        for (i, m) in merges.iter().enumerate() {
            let (a, b) = m.split_once(' ').with_context(|| format!("malformed merge {m:?}"))?;
            merge_rank.entry((a.to_string(), b.to_string())).or_insert(i as u32);
        }
        let mut is_special = vec![false; tokens.len()];
        let mut specials = Vec::new();
        for (i, &ty) in types.iter().enumerate().take(tokens.len()) {
            if ty == TOKEN_TYPE_CONTROL || ty == TOKEN_TYPE_USER_DEFINED {
                is_special[i] = ty == TOKEN_TYPE_CONTROL;
                if !tokens[i].is_empty() {
                    specials.push((tokens[i].clone(), i as u32));
                }
            }
        }
        specials.sort_by_key(|s| std::cmp::Reverse(s.0.len()));
        let byte_enc = byte_to_unicode();
        let byte_dec = byte_enc.iter().enumerate().map(|(i, &c)| (c, i as u8)).collect();
        for id in [bos, eos].into_iter().flatten() {
            ensure!((id as usize) < tokens.len(), "special token id {id} out of vocab");
        }
        Ok(Self {
            tokens,
            vocab,
            merge_rank,
            specials,
            is_special,
            byte_enc,
            byte_dec,
            pre: Regex::new(GPT2_PATTERN).expect("static regex"),
            split_digits: false,
            cache: Mutex::new(HashMap::new()),
            bos,
            eos,
            add_bos: false,
        })
    }

    /// Isolates every digit before the GPT-2 regex (SmolLM / `tokenizer.ggml.pre = "smollm"`).
    pub fn with_digit_split(mut self, on: bool) -> Self {
        self.split_digits = on;
        self
    }

    /// Vocabulary size.
    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    /// Id of a token string, if present.
    pub fn token_id(&self, s: &str) -> Option<u32> {
        self.vocab.get(s).copied()
    }

    /// Encodes `text`. With `parse_special`, special-token strings in the text become their ids
    /// (needed for chat templates); without it they are tokenised as plain text.
    pub fn encode(&self, text: &str, parse_special: bool) -> anyhow::Result<Vec<u32>> {
        let mut out = Vec::new();
        let mut rest = text;
        while !rest.is_empty() {
            // Find the earliest special token occurrence (longest wins at the same position).
            let next = if parse_special {
                self.specials
                    .iter()
                    .filter_map(|(s, id)| rest.find(s.as_str()).map(|p| (p, s.len(), *id)))
                    .min_by_key(|&(p, len, _)| (p, usize::MAX - len))
            } else {
                None
            };
            let (plain, special) = match next {
                Some((p, len, id)) => (&rest[..p], Some((id, p + len))),
                None => (rest, None),
            };
            self.encode_plain(plain, &mut out)?;
            match special {
                Some((id, end)) => {
                    out.push(id);
                    rest = &rest[end..];
                }
                None => break,
            }
        }
        Ok(out)
    }

    fn encode_plain(&self, text: &str, out: &mut Vec<u32>) -> anyhow::Result<()> {
        let mut chunks: Vec<&str> = Vec::new();
        if self.split_digits {
            // Each digit becomes its own chunk; the regex then runs on the pieces in between.
            let mut start = 0;
            for (i, c) in text.char_indices() {
                if c.is_numeric() {
                    if start < i {
                        chunks.push(&text[start..i]);
                    }
                    chunks.push(&text[i..i + c.len_utf8()]);
                    start = i + c.len_utf8();
                }
            }
            if start < text.len() {
                chunks.push(&text[start..]);
            }
        } else {
            chunks.push(text);
        }
        for chunk in chunks {
            for m in self.pre.find_iter(chunk) {
                let piece = m.context("pre-tokenizer regex failed")?.as_str();
                self.encode_word(piece, out)?;
            }
        }
        Ok(())
    }

    fn encode_word(&self, word: &str, out: &mut Vec<u32>) -> anyhow::Result<()> {
        if let Some(ids) = self.cache.lock().unwrap().get(word) {
            out.extend_from_slice(ids);
            return Ok(());
        }
        let mut syms: Vec<String> = word.bytes().map(|b| self.byte_enc[b as usize].to_string()).collect();
        // Merge the lowest-ranked adjacent pair until no pair is in the merge table.
        loop {
            let best = syms
                .windows(2)
                .enumerate()
                .filter_map(|(i, w)| self.merge_rank.get(&(w[0].clone(), w[1].clone())).map(|&r| (r, i)))
                .min();
            let Some((_, i)) = best else { break };
            let right = syms.remove(i + 1);
            syms[i].push_str(&right);
        }
        let mut ids = Vec::with_capacity(syms.len());
        for s in &syms {
            match self.vocab.get(s) {
                Some(&id) => ids.push(id),
                None => {
                    // A merged symbol absent from the vocab: fall back to single byte-chars.
                    for c in s.chars() {
                        let id = self
                            .vocab
                            .get(c.to_string().as_str())
                            .with_context(|| format!("byte symbol {c:?} not in vocabulary"))?;
                        ids.push(*id);
                    }
                }
            }
        }
        out.extend_from_slice(&ids);
        self.cache.lock().unwrap().insert(word.to_string(), ids);
        Ok(())
    }

    /// Raw bytes of one token. Control tokens yield nothing unless `with_special`.
    pub fn token_bytes(&self, id: u32, with_special: bool) -> Vec<u8> {
        let Some(t) = self.tokens.get(id as usize) else {
            return Vec::new();
        };
        if self.is_special[id as usize] {
            return if with_special { t.as_bytes().to_vec() } else { Vec::new() };
        }
        t.chars()
            .flat_map(|c| match self.byte_dec.get(&c) {
                Some(&b) => vec![b],
                // Not a byte-mapped char (e.g. a user-defined token): emit its UTF-8.
                None => c.to_string().into_bytes(),
            })
            .collect()
    }

    /// Decodes ids to text (invalid UTF-8 is replaced).
    pub fn decode(&self, ids: &[u32], with_special: bool) -> String {
        let bytes: Vec<u8> = ids.iter().flat_map(|&id| self.token_bytes(id, with_special)).collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// Formats a single-turn ChatML prompt (`<|im_start|>user ... <|im_end|>` then the
    /// assistant header), the format SmolLM2-Instruct and Qwen use. Returns `None` when the
    /// template does not look like ChatML, so callers fall back to the raw prompt.
    ///
    /// This is not a Jinja engine. It reproduces the one behaviour of such templates that
    /// changes the prompt: when the template hard-codes a default system turn (SmolLM2's does:
    /// "You are a helpful AI assistant named SmolLM, ...") and no `system` is given, that turn
    /// is inserted, exactly as `apply_chat_template` would.
    pub fn chatml_prompt(template: &str, system: Option<&str>, user: &str) -> Option<String> {
        if !template.contains("<|im_start|>") {
            return None;
        }
        let default_system = template
            .split_once("<|im_start|>system\n")
            .or_else(|| template.split_once("<|im_start|>system\\n"))
            .and_then(|(_, rest)| rest.split_once("<|im_end|>"))
            .map(|(sys, _)| sys)
            .filter(|s| !s.contains("{{") && !s.contains("{%"));
        let mut s = String::new();
        if let Some(sys) = system.or(default_system) {
            s.push_str(&format!("<|im_start|>system\n{sys}<|im_end|>\n"));
        }
        s.push_str(&format!("<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"));
        Some(s)
    }
}

/// Incremental decoder for streaming: holds back bytes of an incomplete UTF-8 sequence.
#[derive(Default)]
pub struct StreamDecoder {
    pending: Vec<u8>,
}

impl StreamDecoder {
    /// Adds one token and returns the text that is now complete.
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> String {
        self.pending.extend(tok.token_bytes(id, false));
        match std::str::from_utf8(&self.pending) {
            Ok(s) => {
                let s = s.to_string();
                self.pending.clear();
                s
            }
            Err(e) => {
                let valid = e.valid_up_to();
                // An invalid (not merely incomplete) sequence will never complete: flush lossy.
                if e.error_len().is_some() {
                    let s = String::from_utf8_lossy(&self.pending).into_owned();
                    self.pending.clear();
                    return s;
                }
                let s = String::from_utf8_lossy(&self.pending[..valid]).into_owned();
                self.pending.drain(..valid);
                s
            }
        }
    }
}
