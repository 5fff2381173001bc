#!/usr/bin/env python3
"""Expected renders of gpt-oss's chat template (the "harmony" format) by the reference renderer.

gpt-oss files carry OpenAI's Jinja template (tests/chat/fixtures/gpt-oss/openai-gpt-oss.jinja, the
text llama.cpp keeps as models/templates/openai-gpt-oss-120b.jinja; gpt-oss-20b's is the same).
This renders it over conversations that reach its branches (a developer message, reasoning_effort
and model_identity, builtin tools, function tools with typed parameters, a tool call and its result,
an assistant turn's thinking, the template's own raise_exception) with Hugging Face transformers'
renderer (tools/gen_chat_template_goldens.py's, clock pinned) and writes
tests/chat/fixtures/gpt-oss/goldens.json, which tests/chat/gpt_oss_template_test.cpp compares
fitllm's renders with, byte for byte.

Usage:  .venv/bin/python tools/gen_gpt_oss_template_goldens.py
"""
import datetime
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
from gen_chat_template_goldens import reference_renderer  # noqa: E402

DIR = ROOT / "tests" / "chat" / "fixtures" / "gpt-oss"
NOW = "2024-09-26T12:00:00"

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather at a place",
    "parameters": {"type": "object", "required": ["city"], "properties": {
        "city": {"type": "string", "description": "The city"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
        "days": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "when": {"oneOf": [{"type": "string"}, {"type": "number"}]}}}}}

CONVERSATIONS = [
    {"name": "user", "messages": [{"role": "user", "content": "Hi there"}]},
    {"name": "system_and_turns", "messages": [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"}, {"role": "user", "content": "And 3+3?"}]},
    {"name": "reasoning_high_identity", "messages": [{"role": "developer", "content": "Answer in French."},
                                                      {"role": "user", "content": "Hello"}],
     "extra_context": {"reasoning_effort": "high", "model_identity": "You are a tiny test model."}},
    {"name": "builtin_tools", "messages": [{"role": "user", "content": "Search for cats"}],
     "extra_context": {"builtin_tools": ["browser", "python"]}},
    {"name": "function_tools_and_call", "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "thinking": "I should call the tool.",
         "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "{\"temp\": 21}"}], "extra_context": {"tools": [WEATHER]}},
    {"name": "final_turn_with_thinking", "messages": [
        {"role": "user", "content": "Why?"},
        {"role": "assistant", "content": "Because.", "thinking": "Think first."}]},
    {"name": "channel_tags_in_content", "messages": [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": "<|channel|>final<|message|>oops"}]},
    {"name": "tool_without_call", "messages": [{"role": "user", "content": "x"}, {"role": "tool", "content": "y"}]},
]


def main():
    render, versions = reference_renderer(datetime.datetime.fromisoformat(NOW))
    source = (DIR / "openai-gpt-oss.jinja").read_text(encoding="utf-8")
    cases = []
    for conv in CONVERSATIONS:
        for agp in (True, False):
            variables = {"bos_token": "<|startoftext|>", "eos_token": "<|return|>", **conv.get("extra_context", {})}
            case = {"conversation": conv["name"], "add_generation_prompt": agp, "messages": conv["messages"],
                    "extra_context": conv.get("extra_context", {})}
            case.update(render(source, conv["messages"], agp, variables))
            cases.append(case)
    out = {"about": "Written by tools/gen_gpt_oss_template_goldens.py; do not edit.", "reference": versions,
           "now": NOW, "bos_token": "<|startoftext|>", "eos_token": "<|return|>", "cases": cases}
    (DIR / "goldens.json").write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"{len(cases)} cases, {sum('error' in c for c in cases)} raising")


if __name__ == "__main__":
    main()
