#!/usr/bin/env python3
"""Expected renders of fitllm's chat-template fixtures, made by the reference implementation.

Renders every fixture with Python's jinja2 through Hugging Face transformers' own
`render_jinja_template` (what `tokenizer.apply_chat_template(..., tokenize=False)` calls):
an ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks, the loopcontrols
extension, the `{% generation %}` tag, `raise_exception`, `strftime_now`, `dict`,
`namespace`, and HF's `tojson` filter. The C++ tests (tests/chat/*_test.cpp) render the same
fixtures and compare byte for byte; they read the goldens and do not need Python.

  tests/chat/fixtures/templates.json      published templates (texts in templates/NAME.jinja)
  tests/chat/fixtures/conversations.json  conversations every template is rendered over
  tests/chat/fixtures/snippets.json       small templates, one Jinja construct each
  tests/chat/fixtures/goldens.json        written here: output or error of every case

Usage:  .venv/bin/python tools/gen_chat_template_goldens.py [--check]
        --check compares with the committed goldens instead of writing them.
Needs:  pip install jinja2==3.1.6 transformers==5.24.0   (into the project's .venv)
"""
import argparse
import datetime
import json
import logging
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "chat" / "fixtures"
GOLDENS = FIXTURES / "goldens.json"


def load_json(name):
    with open(FIXTURES / name, encoding="utf-8") as f:
        return json.load(f)


def reference_renderer(now):
    """HF's renderer, with strftime_now's clock pinned so that goldens do not depend on the day."""
    logging.disable(logging.WARNING)  # transformers warns that PyTorch is absent; irrelevant here
    import jinja2
    import transformers
    from transformers.utils import chat_template_utils

    class PinnedClock(datetime.datetime):
        @classmethod
        def now(cls, tz=None):
            return now

    chat_template_utils.datetime = PinnedClock

    def render(source, messages, add_generation_prompt, variables):
        variables = dict(variables)
        tools = variables.pop("tools", None)
        documents = variables.pop("documents", None)
        try:
            rendered, _ = chat_template_utils.render_jinja_template(
                conversations=[messages], tools=tools, documents=documents, chat_template=source,
                add_generation_prompt=add_generation_prompt, **variables)
            return {"output": rendered[0]}
        except Exception as e:  # the goldens record jinja2's error; fitllm must fail too
            return {"error": {"type": type(e).__name__, "message": str(e)}}

    versions = {"jinja2": jinja2.__version__, "transformers": transformers.__version__}
    return render, versions


def make_goldens():
    conversations = load_json("conversations.json")
    now = datetime.datetime.fromisoformat(conversations["now"])
    render, versions = reference_renderer(now)

    template_cases = []
    for t in load_json("templates.json")["templates"]:
        source = (FIXTURES / "templates" / (t["name"] + ".jinja")).read_text(encoding="utf-8")
        for conv in conversations["conversations"]:
            for agp in (True, False):
                variables = {"bos_token": t["bos_token"], "eos_token": t["eos_token"], **conv.get("extra_context", {})}
                case = {"template": t["name"], "conversation": conv["name"], "add_generation_prompt": agp}
                case.update(render(source, conv["messages"], agp, variables))
                template_cases.append(case)

    snippet_cases = []
    for s in load_json("snippets.json")["snippets"]:
        context = dict(s.get("context", {}))
        messages = context.pop("messages", [])
        variables = {"bos_token": "<s>", "eos_token": "</s>", **context}
        case = {"name": s["name"]}
        case.update(render(s["template"], messages, s.get("add_generation_prompt", False), variables))
        snippet_cases.append(case)

    return {
        "about": "Written by tools/gen_chat_template_goldens.py; do not edit. Each case holds jinja2's "
                 "output, or the error it raised.",
        "reference": versions,
        "now": conversations["now"],
        "templates": template_cases,
        "snippets": snippet_cases,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the committed goldens, write nothing")
    args = parser.parse_args()
    goldens = make_goldens()
    text = json.dumps(goldens, ensure_ascii=False, indent=1) + "\n"
    if args.check:
        committed = GOLDENS.read_text(encoding="utf-8") if GOLDENS.exists() else ""
        if committed != text:
            print(f"{GOLDENS} is out of date: rerun without --check", file=sys.stderr)
            return 1
        print(f"{GOLDENS} is up to date")
        return 0
    GOLDENS.write_text(text, encoding="utf-8")
    n_t, n_s = len(goldens["templates"]), len(goldens["snippets"])
    errors = sum("error" in c for c in goldens["templates"] + goldens["snippets"])
    print(f"wrote {GOLDENS.relative_to(ROOT)}: {n_t} template cases, {n_s} snippets ({errors} expected errors)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
