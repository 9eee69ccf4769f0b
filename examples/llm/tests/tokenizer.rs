//! Byte-level BPE: merge order, special tokens, digit isolation, round-trips; and the real
//! SmolLM2 vocabulary when the model file is available.

mod common;

use boltccl_llm::loader;
use boltccl_llm::tokenizer::{PreTokenizer, StreamDecoder, Tokenizer};

/// GPT-2's byte -> char table, written out independently of the crate's implementation.
fn byte_chars() -> Vec<char> {
    let mut printable: Vec<u32> = (b'!' as u32..=b'~' as u32).collect();
    printable.extend(0xA1..=0xAC);
    printable.extend(0xAE..=0xFF);
    let mut n = 0;
    (0..256u32)
        .map(|b| {
            if printable.contains(&b) {
                char::from_u32(b).unwrap()
            } else {
                n += 1;
                char::from_u32(255 + n).unwrap()
            }
        })
        .collect()
}

const MERGES: [&str; 8] = ["h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "1 2"];

fn toy() -> Tokenizer {
    let mut tokens: Vec<String> = byte_chars().iter().map(|c| c.to_string()).collect();
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
