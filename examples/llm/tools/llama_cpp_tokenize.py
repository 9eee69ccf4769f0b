#!/usr/bin/env python3
"""llama.cpp's tokenization and built-in chat formatting, for the tokenizer cross-check test
(`tests/llama_cpp_tokenizer.rs`).

Reads a JSON request from the file named by the first argument:

    {"models": ["a.gguf", ...], "texts": ["...", ...],
     "chats": [{"template": "...", "messages": [{"role": "user", "content": "..."}]}, ...]}

and prints one JSON object: for each model, in order, either {"error": "..."} (llama.cpp
refused to load its vocabulary) or {"special": [[ids], ...], "plain": [[ids], ...],
"with_bos": [ids], "eog": [ids]}: every text tokenized with special tokens parsed and
without, the first text with the model's BOS policy (`add_bos=True` adds BOS only where the
vocabulary says to), and the tokens that end generation; and for each chat, the prompt llama.cpp's `llama_chat_apply_template` writes
(with the assistant's turn opened), or null where it does not know the template.
"""
import ctypes
import json
import sys

import llama_cpp
from llama_cpp import Llama


def tokenize_all(path, texts):
    try:
        llm = Llama(model_path=path, vocab_only=True, verbose=False)
    except Exception as e:  # llama-cpp-python raises ValueError when llama.cpp refuses the file
        return {"error": str(e)}
    ids = lambda text, bos, special: [int(t) for t in llm.tokenize(text.encode(), add_bos=bos, special=special)]
    return {
        "special": [ids(t, False, True) for t in texts],
        "plain": [ids(t, False, False) for t in texts],
        "with_bos": ids(texts[0], True, True),
        "eog": [i for i in range(llm.n_vocab()) if llama_cpp.llama_vocab_is_eog(llm._model.vocab, i)],
    }


def apply_template(template, messages):
    arr = (llama_cpp.llama_chat_message * len(messages))()
    keep = []
    for i, m in enumerate(messages):
        role, content = m["role"].encode(), m["content"].encode()
        keep += [role, content]
        arr[i].role, arr[i].content = role, content
    n = 1 << 16
    buf = ctypes.create_string_buffer(n)
    got = llama_cpp.llama_chat_apply_template(template.encode(), arr, len(messages), True, buf, n)
    if got < 0:
        return None
    assert got <= n, "chat prompt longer than the buffer"
    return buf.raw[:got].decode()


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        req = json.load(f)
    out = {
        "models": [tokenize_all(p, req["texts"]) for p in req["models"]],
        "chats": [apply_template(c["template"], c["messages"]) for c in req.get("chats", [])],
    }
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
