#!/usr/bin/env python3
"""Pre-tokenizer goldens for fitllm's tests (tests/tokenizer/goldens/pre_tokenizer_splits.json).

  .venv/bin/python tools/gen_pre_tokenizer_goldens.py [OUT.json]

For a fixed corpus of tricky strings (contractions, digit runs, whitespace runs with newlines,
CJK, emoji, accents, punctuation, code) it records two kinds of expectations:

1. "splits": the pieces Python's `regex` module cuts with the llama3, qwen2 and gpt-2 patterns,
   written as llama.cpp writes them. Where the tokenizer.json original (with its (?i:...) group)
   cuts differently, llama.cpp wins and the case carries a note.
2. "llama_cpp_ids": token ids from llama.cpp itself (PyPI llama-cpp-python, vocab_only, with
   add_special=false and parse_special=false) for the gpt-2 test vocabulary with
   tokenizer.ggml.pre rewritten to each pre-tokenizer name, so that every expression list,
   ignore_merges and the handling of malformed UTF-8 are checked end to end against llama.cpp.

Needs `pip install regex llama-cpp-python` in the venv and the vocab files of
tests/data/vocab (FITLLM_VOCAB_DIR overrides). Texts are stored as hex bytes (so malformed
UTF-8 fits in JSON) where they are not UTF-8, as text otherwise.
"""
import ctypes
import json
import os
import struct
import sys
import tempfile

import llama_cpp
import regex

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOCAB_DIR = os.environ.get("FITLLM_VOCAB_DIR", os.path.join(ROOT, "tests", "data", "vocab"))
BASE_VOCAB = "ggml-vocab-gpt-2.gguf"

# llama.cpp's patterns (llama-vocab.cpp). Python's `regex` \s is the Unicode White_Space set,
# which is exactly the table llama.cpp generated with it.
CONTRACTIONS_LLAMA_CPP = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
CONTRACTIONS_ORIGINAL = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)"
LLAMA3_TAIL = r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
QWEN2_TAIL = r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
PATTERNS = {
    "llama3": CONTRACTIONS_LLAMA_CPP + LLAMA3_TAIL,
    "qwen2": CONTRACTIONS_LLAMA_CPP + QWEN2_TAIL,
    # GPT-2's pattern as llama.cpp's hand-written splitter runs it (with the final \s+).
    "gpt-2": r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+",
}
ORIGINALS = {
    "llama3": CONTRACTIONS_ORIGINAL + LLAMA3_TAIL,
    "qwen2": CONTRACTIONS_ORIGINAL + QWEN2_TAIL,
}

# One name per distinct expression list, plus dbrx (llama3's list without ignore_merges) and
# refact/mpt (names that share starcoder's and gpt-2's lists).
PRE_NAMES = ["default", "llama-bpe", "dbrx", "qwen2", "gpt-2", "mpt", "falcon", "deepseek-llm",
             "deepseek-coder", "starcoder", "refact", "bloom", "viking", "tekken", "gpt-4o", "deepseek-v3",
             "seed-coder", "qwen35"]


def corpus() -> list[bytes]:
    texts = [
        # contractions
        "I'm", "you're he'll she'd we've", "THEY'RE IT'LL I'D", "'s", "'", "''", "don't'", "'sa",
        "rock'n'roll", "O'Neil's", "'ST 'Re 'vE 'lL 'D 'M", "abc'sdef", " 's", "  's", "'\u017ft",
        # digits
        "1", "12", "123", "1234", "12345", "123456", "1234567", "a1b22c333d4444", "3.14159",
        "1,000,000", "\u0663\u0664\u0665\u0666", "\u2460\u2461\u2462\u2463", "\u216b", "\u00bd x\u00b2",
        # whitespace
        " ", "  ", "   a", "a   b", "a \n b", "\n", "\n\n\n", " \n\n  x", "\r\n\r\n", "\t\tx", "x  ",
        "x \t\n ", "a\u00a0b", "a\u3000\u3000b", "\u2028", "\u0085x", "a \u180e b", "\x1c\x1d x",
        "  \n  \n  end", "a\u2000\u2001b", " \u00a0 ", "\u3000\u4e2d",
        # CJK
        "\u4f60\u597d\u4e16\u754c", "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8",
        "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8", "\u4e2d\u6587\uff0c\u6807\u70b9\u3002",
        "\u4e2d\u6587\u3000\u4e2d\u6587", "\u3002\u3000\u3002", "\u5b57 \u1680\u5b57",
        # emoji
        "\U0001f999\U0001f999 llama", "\U0001f468\u200d\U0001f469\u200d\U0001f467", "\U0001f1e9\U0001f1ea!",
        "a\U0001f642b",
        # accents and other scripts
        "na\u00efve caf\u00e9", "e\u0301", "\u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac",
        "\u043d\u0435\u0449\u043e \u043d\u0430 \u0411\u044a\u043b\u0433\u0430\u0440\u0441\u043a\u0438",
        "\u01c5ungla", "\ufb01", "\U0001d518\U0001d52b\U0001d526", "\u0939\u093f\u0928\u094d\u0926\u0940",
        # punctuation and code
        "Hello, world!!!", "...", "?!?! wow", " ?!\n\n", "(a)[b]{c}", "x = y + z; // comment\n",
        "$$$ 100", "#include <stdio.h>", "a--b", "https://x.y/z?q=1", "~`^|", "__init__",
        "def f(x):\n    return x * 2\n", "    \tindent", "\tif (x) {\n\t\treturn;\n\t}\n",
        "Hello123world", "ABC's", "<|endoftext|>", "\u2018q\u2019 \u201cdq\u201d \uff01\uff1f",
        # case changes (tekken, gpt-4o), glued punctuation (deepseek-v3), combining marks (qwen35)
        "HelloWorld camelCaseName XMLHttpRequest", "\u00c9COLE \u00e9cole \u00c9cole", "I'M DON'T you'RE",
        "~'t =~ .Net (abc) a/b/c\n", "\u0915\u094d\u0937 \u0e01\u0e33 a\u0301b\u0327",
    ]
    data = [t.encode("utf-8") for t in texts]
    # Malformed UTF-8: llama.cpp turns each bad byte into U+FFFD, keeps overlong forms and
    # surrogates as the code points they spell, and re-encodes them in shortest form.
    data += [b"\xff", b"a\x80b", b"\xe4\xbd", b"x\xe4\xbdy", b"\xc0\x80", b"\xc1\xbfz", b"\xed\xa0\x80 x",
             b"ok \xf8\x88\x80\x80\x80 ok", b"\xe0\x80\xaf/"]
    return data


def split_all(pattern: str, text: str) -> list[str]:
    pieces = regex.findall(pattern, text)
    assert "".join(pieces) == text, (pattern, text, pieces)  # these patterns leave no gaps
    return pieces


def patched_vocab(path: str, pre: str, out_path: str) -> None:
    """Copies the GGUF with tokenizer.ggml.pre's string replaced (vocab-only: no tensor data)."""
    with open(path, "rb") as f:
        data = f.read()
    key = b"tokenizer.ggml.pre"
    at = data.index(struct.pack("<Q", len(key)) + key)
    value_at = at + 8 + len(key) + 4  # u64 key length, key, u32 type (8 = string)
    assert struct.unpack_from("<I", data, value_at - 4)[0] == 8
    old_len = struct.unpack_from("<Q", data, value_at)[0]
    new = pre.encode()
    with open(out_path, "wb") as f:
        f.write(data[:value_at] + struct.pack("<Q", len(new)) + new + data[value_at + 8 + old_len:])


def tokenize(vocab, text: bytes) -> list[int]:
    n_max = len(text) * 4 + 16
    buf = (llama_cpp.llama_token * n_max)()
    n = llama_cpp.llama_tokenize(vocab, text, len(text), buf, n_max, False, False)
    if n < 0:
        raise RuntimeError(f"llama_tokenize needs {-n} tokens")
    return list(buf[:n])


def quiet_llama_cpp() -> None:
    @llama_cpp.llama_log_callback
    def ignore(level, text, user_data):  # noqa: ARG001
        pass
    quiet_llama_cpp.callback = ignore  # keep it alive while llama.cpp holds it
    llama_cpp.llama_log_set(ignore, ctypes.c_void_p(0))


def llama_cpp_ids(texts: list[bytes]) -> dict[str, list[list[int]]]:
    quiet_llama_cpp()
    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    result = {}
    with tempfile.TemporaryDirectory() as tmp:
        for pre in PRE_NAMES:
            path = os.path.join(tmp, f"vocab-{pre}.gguf")
            patched_vocab(os.path.join(VOCAB_DIR, BASE_VOCAB), pre, path)
            model = llama_cpp.llama_model_load_from_file(path.encode(), params)
            if not model:
                sys.exit(f"llama.cpp cannot load {path}")
            vocab = llama_cpp.llama_model_get_vocab(model)
            result[pre] = [tokenize(vocab, t) for t in texts]
            llama_cpp.llama_model_free(model)
    return result


def main() -> None:
    out_path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        ROOT, "tests", "tokenizer", "goldens", "pre_tokenizer_splits.json")
    texts = corpus()
    ids = llama_cpp_ids(texts)
    cases = []
    for i, raw in enumerate(texts):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        if text is None:
            case = {"hex": raw.hex()}
        else:
            case = {"text": text}
            case["splits"] = {name: split_all(p, text) for name, p in PATTERNS.items()}
            notes = []
            for name, original in ORIGINALS.items():
                if split_all(original, text) != case["splits"][name]:
                    notes.append(f"{name}: the tokenizer.json pattern's (?i:...) cuts this as "
                                 f"{split_all(original, text)!r}; llama.cpp spells the cases out")
            if notes:
                case["notes"] = notes
        case["llama_cpp_ids"] = {pre: ids[pre][i] for pre in PRE_NAMES}
        cases.append(case)
    golden = {
        "generator": "tools/gen_pre_tokenizer_goldens.py",
        "regex": regex.__version__,
        "llama_cpp_python": llama_cpp.__version__,
        "vocab": BASE_VOCAB,
        "patterns": PATTERNS,
        "cases": cases,
    }
    # One line per case keeps the file small and its diffs readable.
    with open(out_path, "w", encoding="utf-8") as f:
        f.write("{\n")
        for key, value in golden.items():
            if key == "cases":
                continue
            f.write(f" {json.dumps(key)}: {json.dumps(value, ensure_ascii=False)},\n")
        f.write(' "cases": [\n')
        f.write(",\n".join("  " + json.dumps(c, ensure_ascii=False) for c in cases))
        f.write("\n ]\n}\n")
    print(f"{len(cases)} cases -> {out_path}")


if __name__ == "__main__":
    main()
