//! Byte-level BPE (GPT-2 style), built from the vocabulary and merge list in GGUF metadata.
//!
//! Encoding: split out special tokens, pre-tokenise the rest into words with the regexes of
//! the file's pre-tokenizer (`tokenizer.ggml.pre`, see [`PreTokenizer`]), map each byte to a
//! printable unicode char (GPT-2's byte-to-unicode table), then repeatedly merge the adjacent
//! pair with the lowest merge rank. Decoding reverses the byte mapping.

use std::collections::HashMap;
use std::sync::Mutex;

use anyhow::{bail, ensure, Context};
use fancy_regex::Regex;

/// GPT-2's word pattern, as llama.cpp writes it: contractions, letter runs, digit runs,
/// punctuation runs, and whitespace not followed by a word (a word keeps one leading space).
/// Text no alternative matches (a lone newline before a word) stays a word of its own.
const GPT2_PATTERN: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";

/// Llama 3's word pattern (tokenizer.json's, with the case-insensitive contractions spelled
/// out for ASCII only, as llama.cpp does: `(?i)` would also fold `'ſ` into `'s`). A letter run
/// takes one leading non-letter, non-digit, non-newline char; digits group in threes;
/// punctuation keeps the newlines after it; newline runs keep the spaces before them.
const LLAMA3_PATTERN: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Qwen2's (Qwen2, Qwen2.5, Qwen3): Llama 3's with every digit a word of its own.
const QWEN2_PATTERN: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// How text is cut into words before the merges, chosen by the GGUF's `tokenizer.ggml.pre`
/// as llama.cpp chooses it. Each is a list of patterns applied in turn: a pattern cuts every
/// word the previous ones made into its matches and the text between them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PreTokenizer {
    /// llama.cpp's fallback for a file without `tokenizer.ggml.pre` (and for `default`):
    /// punctuation runs, then GPT-2's pattern, then digit runs, then three ASCII digits.
    Default,
    /// GPT-2's pattern alone (`gpt-2`, `phi-2`, `mpt`, `olmo`).
    Gpt2,
    /// Every digit alone, then GPT-2's pattern (`smollm`, `starcoder`, `refact`, `codeshell`).
    Smollm,
    /// Llama 3's pattern (`llama-bpe`, `llama3`, `llama-v3`, `falcon3`, `pixtral`); a word that
    /// is itself in the vocabulary is that token, whatever the merges say.
    Llama3,
    /// Qwen2's pattern (`qwen2`, `deepseek-r1-qwen`, `megrez`).
    Qwen2,
}

/// The `tokenizer.ggml.pre` values this tokenizer reads, and what each means.
const PRE_NAMES: [(&str, PreTokenizer); 17] = [
    ("default", PreTokenizer::Default),
    ("gpt-2", PreTokenizer::Gpt2),
    ("phi-2", PreTokenizer::Gpt2),
    ("mpt", PreTokenizer::Gpt2),
    ("olmo", PreTokenizer::Gpt2),
    ("smollm", PreTokenizer::Smollm),
    ("starcoder", PreTokenizer::Smollm),
    ("refact", PreTokenizer::Smollm),
    ("codeshell", PreTokenizer::Smollm),
    ("llama-bpe", PreTokenizer::Llama3),
    ("llama3", PreTokenizer::Llama3),
    ("llama-v3", PreTokenizer::Llama3),
    ("falcon3", PreTokenizer::Llama3),
    ("pixtral", PreTokenizer::Llama3),
    ("qwen2", PreTokenizer::Qwen2),
    ("deepseek-r1-qwen", PreTokenizer::Qwen2),
    ("megrez", PreTokenizer::Qwen2),
];

impl PreTokenizer {
    /// The pre-tokenizer a GGUF's `tokenizer.ggml.pre` names. A value it does not know is an
    /// error naming the ones it does: llama.cpp refuses such a file too, and splitting its
    /// text another way would give tokens the model was never trained on.
    pub fn from_name(name: &str) -> anyhow::Result<Self> {
        match PRE_NAMES.iter().find(|(n, _)| *n == name) {
            Some(&(_, pre)) => Ok(pre),
            None => {
                let known: Vec<&str> = PRE_NAMES.iter().map(|(n, _)| *n).collect();
                bail!("unknown pre-tokenizer tokenizer.ggml.pre = {name:?}; supported: {}", known.join(", "))
            }
        }
    }

    /// The patterns applied in turn.
    fn patterns(self) -> &'static [&'static str] {
        match self {
            Self::Default => &[r"[\p{P}\$\+<=>\^~\|]+", GPT2_PATTERN, r"\p{N}+", "[0-9][0-9][0-9]"],
            Self::Gpt2 => &[GPT2_PATTERN],
            Self::Smollm => &[r"\p{N}", GPT2_PATTERN],
            Self::Llama3 => &[LLAMA3_PATTERN],
            Self::Qwen2 => &[QWEN2_PATTERN],
        }
    }

    /// Whether a word found whole in the vocabulary skips the merges (llama.cpp's
    /// `ignore_merges`, which Llama 3's tokenizer.json sets).
    fn ignores_merges(self) -> bool {
        self == Self::Llama3
    }

    /// Whether prompts start with BOS when the file does not say (`tokenizer.ggml.add_bos_token`):
    /// llama.cpp's default for Llama 3's pre-tokenizer, off for the others.
    pub fn adds_bos_by_default(self) -> bool {
        self == Self::Llama3
    }
}

/// The chat prompt formats the CLI writes itself (it has no Jinja engine), recognised in the
/// template by their markers as llama.cpp recognises its built-in ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChatFormat {
    /// `<|im_start|>role\n...<|im_end|>\n` (SmolLM2, Qwen).
    ChatMl,
    /// `<|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|>` (Llama 3, 3.1, 3.2).
    Llama3,
}

impl ChatFormat {
    /// The format `template` writes, if it is one of these.
    pub fn detect(template: &str) -> Option<Self> {
        if template.contains("<|im_start|>") {
            Some(Self::ChatMl)
        } else if template.contains("<|start_header_id|>") && template.contains("<|end_header_id|>") {
            Some(Self::Llama3)
        } else {
            None
        }
    }
}

/// Token texts that end a turn, besides the file's EOS: llama.cpp stops on them too (its
/// end-of-generation set), so a chat model that ends its answer with `<|eot_id|>` while its
/// EOS is `<|end_of_text|>` (Llama 3) stops there.
const END_OF_TURN: [&str; 7] =
    ["<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>"];

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
    /// The pre-tokenizer and its patterns, compiled.
    pre_kind: PreTokenizer,
    pre: Vec<Regex>,
    cache: Mutex<HashMap<String, Vec<u32>>>,
    /// Beginning-of-sequence token id.
    pub bos: Option<u32>,
    /// End-of-sequence token id.
    pub eos: Option<u32>,
    /// Whether prompts start with [`Tokenizer::bos`] (`tokenizer.ggml.add_bos_token`, else
    /// the pre-tokenizer's default).
    pub add_bos: bool,
    /// End-of-turn token (`tokenizer.ggml.eot_token_id`), when the file names one.
    pub eot: Option<u32>,
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
            pre_kind: PreTokenizer::Gpt2,
            pre: compile(PreTokenizer::Gpt2),
            cache: Mutex::new(HashMap::new()),
            bos,
            eos,
            add_bos: false,
            eot: None,
        })
    }

    /// Uses `pre` to cut text into words (GPT-2's pattern until this is called).
    pub fn with_pre_tokenizer(mut self, pre: PreTokenizer) -> Self {
        self.pre_kind = pre;
        self.pre = compile(pre);
        self.cache.lock().unwrap().clear();
        self
    }

    /// The pre-tokenizer in use.
    pub fn pre_tokenizer(&self) -> PreTokenizer {
        self.pre_kind
    }

    /// The tokens that end generation: EOS, the end-of-turn token, and the tokens llama.cpp
    /// also treats as ending a turn (`<|eot_id|>`, `<|im_end|>`, ...) where the vocabulary
    /// has them as special tokens.
    pub fn stop_tokens(&self) -> Vec<u32> {
        let mut stop: Vec<u32> = [self.eos, self.eot].into_iter().flatten().collect();
        for text in END_OF_TURN {
            if let Some(&id) = self.vocab.get(text) {
                if self.is_special[id as usize] && !stop.contains(&id) {
                    stop.push(id);
                }
            }
        }
        stop
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
        for word in self.split_words(text)? {
            self.encode_word(word, out)?;
        }
        Ok(())
    }

    /// Cuts `text` into the words the merges run on: each pattern in turn cuts every word so
    /// far into its matches and the stretches between them (kept, as llama.cpp keeps them).
    pub fn split_words<'a>(&self, text: &'a str) -> anyhow::Result<Vec<&'a str>> {
        let mut words = if text.is_empty() { Vec::new() } else { vec![text] };
        for re in &self.pre {
            let mut next = Vec::with_capacity(words.len());
            for word in words {
                let mut at = 0;
                for m in re.find_iter(word) {
                    let m = m.with_context(|| format!("pre-tokenizer pattern failed on {word:?}"))?;
                    if m.start() > at {
                        next.push(&word[at..m.start()]);
                    }
                    if m.end() > m.start() {
                        next.push(m.as_str());
                    }
                    at = m.end();
                }
                if at < word.len() {
                    next.push(&word[at..]);
                }
            }
            words = next;
        }
        Ok(words)
    }

    fn encode_word(&self, word: &str, out: &mut Vec<u32>) -> anyhow::Result<()> {
        if let Some(ids) = self.cache.lock().unwrap().get(word) {
            out.extend_from_slice(ids);
            return Ok(());
        }
        let mut syms: Vec<String> = word.bytes().map(|b| self.byte_enc[b as usize].to_string()).collect();
        if self.pre_kind.ignores_merges() {
            let whole: String = syms.concat();
            if let Some(&id) = self.vocab.get(&whole) {
                out.push(id);
                self.cache.lock().unwrap().insert(word.to_string(), vec![id]);
                return Ok(());
            }
        }
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

    /// Formats a single-turn Llama 3 prompt as Llama 3's template renders it: `bos` (the text
    /// of BOS, `<|begin_of_text|>`), an optional system turn, the user turn, then the
    /// assistant's header, each turn `<|start_header_id|>role<|end_header_id|>\n\n` + the
    /// trimmed content + `<|eot_id|>`. Llama 3.1 and 3.2's templates also insert a dated system
    /// turn when none is given; like llama.cpp's built-in Llama 3 format, this does not.
    pub fn llama3_prompt(bos: &str, system: Option<&str>, user: &str) -> String {
        let turn = |role: &str, content: &str| {
            format!("<|start_header_id|>{role}<|end_header_id|>\n\n{}<|eot_id|>", content.trim())
        };
        let mut s = bos.to_string();
        if let Some(sys) = system {
            s.push_str(&turn("system", sys));
        }
        s.push_str(&turn("user", user));
        s.push_str("<|start_header_id|>assistant<|end_header_id|>\n\n");
        s
    }

    /// The single-turn prompt for the model's chat `template`: ChatML or Llama 3, whichever it
    /// is ([`ChatFormat::detect`]). Any other template is an error rather than a prompt in the
    /// wrong format, which the model would answer as noise.
    pub fn chat_prompt(&self, template: &str, system: Option<&str>, user: &str) -> anyhow::Result<String> {
        match ChatFormat::detect(template) {
            Some(ChatFormat::ChatMl) => {
                Self::chatml_prompt(template, system, user).context("the ChatML template was not recognised")
            }
            Some(ChatFormat::Llama3) => {
                let bos = self.bos.map(|b| self.decode(&[b], true)).unwrap_or_default();
                Ok(Self::llama3_prompt(&bos, system, user))
            }
            None => bail!(
                "the model's chat template is neither ChatML (<|im_start|>) nor Llama 3's (<|start_header_id|>), \
                 the formats this CLI writes: pass --raw to feed the prompt as it is, or use `boltccl-llm serve`, \
                 which renders any template"
            ),
        }
    }
}

/// The patterns of `pre`, compiled (they are constants: a failure is a bug here, not bad input).
fn compile(pre: PreTokenizer) -> Vec<Regex> {
    pre.patterns().iter().map(|p| Regex::new(p).expect("pre-tokenizer patterns are valid")).collect()
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
