#!/usr/bin/env python3
"""Writes the seed corpus of a fuzz target from the test fixtures, so that the seeds follow the
fixtures instead of being a second copy of them (scripts/fuzz.sh calls this).

    fuzz/make_corpus.py jinja OUT_DIR       # each fixture template with each conversation, each snippet
    fuzz/make_corpus.py tokenizer OUT_DIR   # llama.cpp's tokenizer test texts, for every vocabulary

Standard library only."""
import hashlib
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "chat" / "fixtures"


def write(out: pathlib.Path, data: bytes) -> None:
    (out / hashlib.sha1(data).hexdigest()).write_bytes(data)


def jinja(out: pathlib.Path) -> int:
    # A seed is the template, a NUL, then the context as JSON (jinja_fuzz.cpp reads it so).
    conversations = json.loads((FIXTURES / "conversations.json").read_text())["conversations"]
    templates = sorted((FIXTURES / "templates").glob("*.jinja"))
    n = 0
    for i, path in enumerate(templates):
        source = path.read_bytes()
        # Two conversations per template (they take turns), tools given once: enough to reach
        # every branch a template has without a seed per pair.
        for conversation in (conversations[i % len(conversations)], conversations[(i + 1) % len(conversations)]):
            context = {"messages": conversation["messages"], "add_generation_prompt": True}
            if n % 2:
                context["tools"] = [{"type": "function", "function": {"name": "get_weather",
                                     "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
            write(out, source + b"\0" + json.dumps(context).encode())
            n += 1
    for snippet in json.loads((FIXTURES / "snippets.json").read_text())["snippets"]:
        context = snippet.get("context", {})
        write(out, snippet["template"].encode() + b"\0" + json.dumps(context).encode())
        n += 1
    return n


def tokenizer(out: pathlib.Path) -> int:
    # A seed is a vocabulary byte, a flags byte, then the text (tokenizer_fuzz.cpp reads it so);
    # the vocabularies are numbered as the fuzzer loads them: tests/data/vocab sorted, then the
    # two tiny models.
    vocab_dir = ROOT / "tests" / "data" / "vocab"
    n_vocabs = len(list(vocab_dir.glob("*.gguf"))) + 2
    texts = set()
    for inp in sorted(vocab_dir.glob("*.inp")):
        texts.update(inp.read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n"))
    n = 0
    for i, text in enumerate(sorted(texts)):
        if not text or len(text) > 2000:
            continue
        for flags in (0, 3 if i % 2 else 12):
            write(out, bytes([i % n_vocabs, flags]) + text.encode())
            n += 1
    return n


def main() -> None:
    if len(sys.argv) != 3 or sys.argv[1] not in ("jinja", "tokenizer"):
        sys.exit(__doc__)
    out = pathlib.Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    n = jinja(out) if sys.argv[1] == "jinja" else tokenizer(out)
    print(f"{sys.argv[1]}: {n} seeds in {out}")


if __name__ == "__main__":
    main()
