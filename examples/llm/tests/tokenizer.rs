//! Byte-level BPE: merge order, special tokens, digit isolation, round-trips; and the real
//! SmolLM2 vocabulary when the model file is available.

mod common;

use boltccl_llm::loader;
use boltccl_llm::tokenizer::{ChatFormat, PreTokenizer, StreamDecoder, Tokenizer};

const MERGES: [&str; 8] = ["h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "1 2"];

fn toy() -> Tokenizer {
    let mut tokens: Vec<String> = common::gpt2_byte_chars().iter().map(|c| c.to_string()).collect();
    for m in MERGES {
        tokens.push(m.replace(' ', ""));
    }
    tokens.push("<|im_start|>".into());
    let mut types = vec![1u32; tokens.len()];
    *types.last_mut().unwrap() = 3; // control
    let merges: Vec<String> = MERGES.iter().map(|s| s.to_string()).collect();
    Tokenizer::from_parts(tokens, &merges, &types, None, None).unwrap()
}

fn strs(t: &Tokenizer, ids: &[u32]) -> Vec<String> {
    ids.iter().map(|&i| t.decode(&[i], true)).collect()
}

#[test]
fn merges_apply_in_rank_order() {
    let t = toy();
    let ids = t.encode("hello world", false).unwrap();
    assert_eq!(strs(&t, &ids), ["hello", " wor", "l", "d"]);
    assert_eq!(t.decode(&ids, false), "hello world");
    // "hel" alone: "h e" merges, then "he l" is not a merge.
    assert_eq!(strs(&t, &t.encode("hel", false).unwrap()), ["he", "l"]);
}

#[test]
fn special_tokens_only_when_asked() {
    let t = toy();
    let special = t.token_id("<|im_start|>").unwrap();
    let ids = t.encode("<|im_start|>hello", true).unwrap();
    assert_eq!(ids[0], special);
    assert_eq!(ids.len(), 2);
    let plain = t.encode("<|im_start|>hello", false).unwrap();
    assert!(!plain.contains(&special));
    assert_eq!(t.decode(&plain, false), "<|im_start|>hello");
    // Control tokens are hidden from normal decoding.
    assert_eq!(t.decode(&ids, false), "hello");
    assert_eq!(t.decode(&ids, true), "<|im_start|>hello");
}

#[test]
fn digit_isolation() {
    let t = toy();
    assert_eq!(strs(&t, &t.encode("a 123", false).unwrap()), ["a", " ", "12", "3"]);
    let t = toy().with_pre_tokenizer(PreTokenizer::Smollm);
    assert_eq!(strs(&t, &t.encode("a 123", false).unwrap()), ["a", " ", "1", "2", "3"]);
}

#[test]
fn round_trips_arbitrary_text() {
    let t = toy();
    for s in [
        "",
        "hello world",
        "  leading and trailing  ",
        "tabs\tand\nnewlines\r\n\n",
        "it's, they'll, we've: 3.14159 + 42!",
        "Ünïcödé — 日本語 — emoji 🦀🚀",
        "\u{0}\u{1}\u{7f} control bytes",
    ] {
        let ids = t.encode(s, false).unwrap();
        assert_eq!(t.decode(&ids, false), s, "round trip of {s:?}");
    }
}

#[test]
fn stream_decoder_holds_partial_utf8() {
    let t = toy();
    let ids = t.encode("🦀", false).unwrap();
    assert_eq!(ids.len(), 4, "toy vocab has no merges for the crab's 4 bytes");
    let mut d = StreamDecoder::default();
    let pieces: Vec<String> = ids.iter().map(|&i| d.push(&t, i)).collect();
    assert_eq!(pieces, ["", "", "", "🦀"]);
}

#[test]
fn smollm2_vocabulary() {
    let Some(path) = common::smollm2_path() else {
        return;
    };
    let ck = loader::open(&path).unwrap();
    let t = ck.tokenizer.expect("GGUF has a tokenizer");
    assert_eq!(t.vocab_size(), 49152);
    // SmolLM2's GGUF says add_bos_token = false; EOS is <|im_end|>, which ends a chat turn.
    assert!(!t.add_bos);
    assert_eq!(t.eos, t.token_id("<|im_end|>"));
    // Common words are single tokens in a 49k byte-level BPE vocabulary.
    let ids = t.encode("Hello world", false).unwrap();
    assert_eq!(strs(&t, &ids), ["Hello", " world"]);
    for s in [
        "The quick brown fox jumps over the lazy dog.",
        "Tensor parallelism splits q/k/v by heads; o_proj by columns (x2 all_sum/layer).",
        "naïve café 東京 🦀 12345",
    ] {
        let ids = t.encode(s, false).unwrap();
        assert_eq!(t.decode(&ids, false), s);
        assert!(ids.len() < s.len(), "BPE should compress {s:?}");
    }
    let chat = Tokenizer::chatml_prompt(ck.chat_template.as_deref().unwrap(), None, "Hi").unwrap();
    let ids = t.encode(&chat, true).unwrap();
    let start = t.token_id("<|im_start|>").unwrap();
    assert_eq!(ids[0], start);
    // SmolLM2's template inserts its default system turn: system, user, assistant headers.
    assert_eq!(ids.iter().filter(|&&i| i == start).count(), 3);
    assert!(chat.starts_with("<|im_start|>system\nYou are a helpful AI assistant named SmolLM"));
    assert_eq!(t.decode(&ids, true), chat);
}

#[test]
fn chatml_prompt_formats() {
    let plain = "{% for m in messages %}<|im_start|>{{ m['role'] }}...{% endfor %}";
    assert_eq!(
        Tokenizer::chatml_prompt(plain, None, "Hi").unwrap(),
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
    let with_default = "{{ '<|im_start|>system\nBe brief.<|im_end|>\n' }}<|im_start|>";
    assert_eq!(
        Tokenizer::chatml_prompt(with_default, None, "Hi").unwrap(),
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
    assert!(Tokenizer::chatml_prompt(with_default, Some("X"), "Hi")
        .unwrap()
        .starts_with("<|im_start|>system\nX<|im_end|>"));
    assert!(Tokenizer::chatml_prompt("[INST]", None, "Hi").is_none());
}

/// Words of `text` under `pre`, on the toy vocabulary (the split does not depend on it).
fn words(pre: PreTokenizer, text: &str) -> Vec<String> {
    toy().with_pre_tokenizer(pre).split_words(text).unwrap().into_iter().map(str::to_string).collect()
}

#[test]
fn pre_tokenizers_split_as_their_patterns_say() {
    // Llama 3: contractions in either case, a letter run with one leading non-letter, digits
    // in threes, punctuation with its newlines, newline runs with the spaces before them.
    assert_eq!(
        words(PreTokenizer::Llama3, "DON'T we'LL O'Tis 1234567!!\n\n  x\ty"),
        ["DON", "'T", " we", "'LL", " O", "'T", "is", " ", "123", "456", "7", "!!\n\n", " ", " x", "\ty"]
    );
    // Qwen2: the same with every digit alone.
    assert_eq!(words(PreTokenizer::Qwen2, "a 1234"), ["a", " ", "1", "2", "3", "4"]);
    // GPT-2: lower-case contractions only, a digit run with one leading space.
    assert_eq!(words(PreTokenizer::Gpt2, "DON'T don't 1234"), ["DON", "'", "T", " don", "'t", " 1234"]);
    // llama.cpp's default: punctuation runs first, then GPT-2's pattern, then three digits.
    assert_eq!(words(PreTokenizer::Default, "a+b 12345"), ["a", "+", "b", " ", "123", "45"]);
    assert_eq!(words(PreTokenizer::Smollm, "x 12"), ["x", " ", "1", "2"]);
    assert!(words(PreTokenizer::Llama3, "").is_empty());
}

#[test]
fn pre_tokenizer_names() {
    assert_eq!(PreTokenizer::from_name("llama-bpe").unwrap(), PreTokenizer::Llama3);
    assert_eq!(PreTokenizer::from_name("qwen2").unwrap(), PreTokenizer::Qwen2);
    assert_eq!(PreTokenizer::from_name("smollm").unwrap(), PreTokenizer::Smollm);
    assert_eq!(PreTokenizer::from_name("gpt-2").unwrap(), PreTokenizer::Gpt2);
    let err = format!("{:#}", PreTokenizer::from_name("tekken").unwrap_err());
    assert!(err.contains("\"tekken\"") && err.contains("llama-bpe") && err.contains("qwen2"), "{err}");
}

#[test]
fn llama3_chat_prompt_is_the_documented_format() {
    // Meta's documented Llama 3 prompt, verbatim.
    let want = "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>\
                <|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>\
                <|start_header_id|>assistant<|end_header_id|>\n\n";
    assert_eq!(Tokenizer::llama3_prompt("<|begin_of_text|>", Some("Be brief."), " Hi\n"), want);
    let template = "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>...";
    assert_eq!(ChatFormat::detect(template), Some(ChatFormat::Llama3));
    assert_eq!(ChatFormat::detect("<|im_start|>{{ m.role }}"), Some(ChatFormat::ChatMl));
    // A template of neither kind: an error pointing at --raw, not a raw prompt.
    assert_eq!(ChatFormat::detect("[INST] {{ m.content }} [/INST]"), None);
    let err = toy().chat_prompt("[INST] {{ m.content }} [/INST]", None, "Hi").unwrap_err();
    assert!(format!("{err:#}").contains("--raw"));
}
