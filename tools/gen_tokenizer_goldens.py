#!/usr/bin/env python3
"""Token-id goldens from llama.cpp (PyPI llama-cpp-python) for fitllm's tokenizer tests.

  .venv/bin/python tools/gen_tokenizer_goldens.py MODEL.gguf OUT.json

For every string of a fixed corpus (code, whitespace runs, many scripts, emoji, digits,
special-token text) it records llama.cpp's ids for the four combinations of add_special and
parse_special, and its detokenization of the parse_special ids. Needs `scripts/setup.sh --oracle`.
"""
import ctypes
import json
import random
import sys

import llama_cpp


def corpus() -> list[str]:
    texts = [
        "", " ", "  ", "   ", "\t", "\n", "\n\n", "\n\n\n", "\t\n", " \n ", "\r\n", "a", " a", "a ",
        "Hello world", " Hello world", "Hello World", " Hello World!", "Hello, world!", " Hello, world!",
        "Hello  world", "Hello\tworld", "Hello\nworld", "   leading", "trailing   ", "  both  ",
        "this is 🦙.cpp", "w048 7tuijk dsdfhu", "нещо на Български", "កាន់តែពិសេសអាចខលចេញ",
        "🚀 (normal) 😶‍🌫️ (multiple emojis concatenated) ✅ (only emoji that has its own token)",
        "Führer", "ied 4 ½ months", "3", "33", "333", "3333", "33333", "333333", "3333333", "33333333",
        "1234567890", "3.14159", "1,000,000", "-42", "+7", "0x1F", "1e-6", "2026-11-29", "12:34:56",
        "I'm", "you're", "he'll", "she'd", "we've", "I'M", "YOU'RE", "don't", "can't", "o'clock",
        "The quick brown fox jumps over the lazy dog.", "THE QUICK BROWN FOX", "tHe QuIcK bRoWn",
        "Ελληνικά γράμματα", "العربية لغة جميلة", "עברית היא שפה", "हिन्दी भाषा", "ภาษาไทย",
        "中文字符测试", "日本語のテキスト、カタカナ、ひらがな", "한국어 텍스트", "Tiếng Việt có dấu",
        "Ærøskøbing", "naïve café résumé", "straße", "ﬁ ligature", "Å Å", "e\u0301", "ǅ ǆ",
        "😀😃😄😁", "👍🏽", "👨‍👩‍👧‍👦", "🇩🇪🇯🇵", "❤️", "☃", "∑∫√∞≠≤", "→←↑↓", "©®™", "€£¥₹",
        "\u200b zero width", "\u00a0nbsp", "\u3000ideographic space", "tab\tseparated\tvalues",
        "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n", "<bos>", "<eos>", "<pad>",
        "<unk>", "<mask>", "<start_of_image>", "<end_of_turn>", "text<eos>more", "<bos><bos>",
        "< start_of_turn >", "<start_of_turn", "start_of_turn>", "<0x41>", "[INST]", "<|im_start|>",
        "def f(x):\n    return x * 2\n", "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}",
        "#include <stdio.h>\nint main() { printf(\"hi\\n\"); }", "SELECT * FROM t WHERE id = 1;",
        "const x = () => { return {a: 1}; };", "<div class=\"x\">&amp;</div>", "$ ls -la | grep foo",
        "    indented four", "\tindented tab", "        eight spaces", "a    b", "a\n\n\nb", "x\r\ny",
        "```python\nprint('hi')\n```", "| a | b |\n|---|---|", "- item\n- item 2", "# Heading",
        "email@example.com", "https://example.com/path?q=1&r=2#frag", "C:\\Users\\name", "~/.bashrc",
        "!!!", "???", "...", "--", "—", "–", "…", "“quoted”", "‘single’", "«guillemets»", "(paren)",
        "[bracket]", "{brace}", "a/b", "a\\b", "a_b", "snake_case_name", "camelCaseName", "PascalCase",
        "UPPER_CASE", "kebab-case-name", "dot.separated.name", "multiple   spaces   here",
        "\u0000nul", "\u0001\u0002", "\u007f", "\u0080", "\u00ff", "\uffff", "\U0001F600", "\U00010348",
        "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "ﾊﾝｶｸ", "ＦＵＬＬＷＩＤＴＨ", "①②③", "ⅰⅱⅲ", "½¼¾", "x²", "H₂O",
    ]
    rng = random.Random(1234)
    alphabet = "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJ0123456789 \n\t.,;:!?'\"-()[]{}<>/\\|@#$%^&*_+=~`éüñçøåßжщыπλ中文日本한🙂🎉"
    while len(texts) < 240:
        n = rng.randint(1, 60)
        texts.append("".join(rng.choice(alphabet) for _ in range(n)))
    texts.append(" ".join(["lorem ipsum dolor sit amet"] * 40))
    texts.append("\n".join(f"line {i}: value={i * i}" for i in range(30)))
    return texts


def tokenize(vocab, text: bytes, add_special: bool, parse_special: bool) -> list[int]:
    n_max = len(text) + 16
    buf = (llama_cpp.llama_token * n_max)()
    n = llama_cpp.llama_tokenize(vocab, text, len(text), buf, n_max, add_special, parse_special)
    if n < 0:
        raise RuntimeError(f"llama_tokenize needs {-n} tokens")
    return list(buf[:n])


def detokenize(vocab, ids: list[int], remove_special: bool, unparse_special: bool) -> bytes:
    arr = (llama_cpp.llama_token * max(1, len(ids)))(*ids)
    cap = 64 + 32 * len(ids)
    out = ctypes.create_string_buffer(cap)
    n = llama_cpp.llama_detokenize(vocab, arr, len(ids), out, cap, remove_special, unparse_special)
    if n < 0:
        raise RuntimeError("detokenize buffer too small")
    return out.raw[:n]


def main() -> None:
    model_path, out_path = sys.argv[1], sys.argv[2]
    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(model_path.encode(), params)
    if not model:
        sys.exit(f"cannot load {model_path}")
    vocab = llama_cpp.llama_model_get_vocab(model)
    cases = []
    for text in corpus():
        b = text.encode("utf-8")
        ids_special = tokenize(vocab, b, True, True)
        cases.append({
            "text": text,
            "ids": tokenize(vocab, b, False, False),
            "ids_add_special": tokenize(vocab, b, True, False),
            "ids_parse_special": tokenize(vocab, b, False, True),
            "ids_add_parse_special": ids_special,
            # Bytes as latin-1 so JSON can hold any byte sequence.
            "detokenized": detokenize(vocab, ids_special, False, True).decode("latin-1"),
            "detokenized_remove_special": detokenize(vocab, ids_special, True, False).decode("latin-1"),
        })
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump({"model": model_path.split("/")[-1], "llama_cpp_python": llama_cpp.__version__,
                   "cases": cases}, f, ensure_ascii=False, indent=1)
    print(f"{len(cases)} cases -> {out_path}")


if __name__ == "__main__":
    main()
