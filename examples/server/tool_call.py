#!/usr/bin/env python3
"""Tool calling through `fitllm serve` with the official `openai` client.

Starts `fitllm serve` on a free loopback port (or uses --url), offers one function, and asks for a
call with tool_choice "required" (then with the function named): the answer is always a valid
call, since the server constrains the model's tokens to the call's format and the function's
parameters schema. The arguments are parsed and checked against that schema here, the function is
run, and its result goes back in a "tool" message for the model's final answer.

The demo model (Gemma 3 270M) has a chat template that shows no tools: fitllm then gives them in
a system prompt and asks for calls as <tool_call>{"name": ..., "arguments": ...}</tool_call>.

    .venv/bin/python examples/server/tool_call.py                        # build/fitllm, the demo model
    .venv/bin/python examples/server/tool_call.py --fitllm PATH --model MODEL.gguf
    .venv/bin/python examples/server/tool_call.py --url http://127.0.0.1:8080   # a running server

Needs `openai` and `jsonschema` (requirements.txt). Exits 1 when a call is not valid.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time
import urllib.request

import jsonschema
import openai

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "minLength": 1, "maxLength": 40},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}


def get_weather(city, unit):
    """What the function would answer (a real one would ask a weather service)."""
    return {"city": city, "temperature": 18 if unit == "celsius" else 64, "unit": unit, "sky": "sunny"}


def start_server(fitllm, model):
    proc = subprocess.Popen([fitllm, "serve", "-m", model, "--port", "0", "-c", "2048", "-np", "1"],
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    line = proc.stderr.readline()
    m = re.search(r"listening on (http://[\d.]+:\d+)", line)
    if not m:
        proc.kill()
        sys.exit("fitllm serve did not start: " + line + proc.stderr.read())
    url = m.group(1)
    deadline = time.time() + 120
    while True:  # ready when the model is loaded
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        if time.time() > deadline or proc.poll() is not None:
            proc.kill()
            sys.exit("fitllm serve did not get ready")
        time.sleep(0.1)
    return proc, url


def check_call(message, name):
    """The answer's one call: its function's name and arguments, checked against the schema."""
    calls = message.tool_calls or []
    if len(calls) != 1:
        raise SystemExit(f"expected one tool call, got {len(calls)}: {message}")
    call = calls[0]
    if call.type != "function" or call.function.name != name:
        raise SystemExit(f"expected a call of {name}, got {call}")
    arguments = json.loads(call.function.arguments)  # raises on text that is not JSON
    jsonschema.validate(arguments, WEATHER["function"]["parameters"])  # raises when it does not match
    return call, arguments


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fitllm", default=os.path.join(ROOT, "build", "fitllm"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "gemma-3-270m-q4_k_m.gguf"))
    ap.add_argument("--url", help="a running fitllm serve (then --fitllm and --model are not used)")
    args = ap.parse_args()

    proc = None
    url = args.url
    if url is None:
        proc, url = start_server(args.fitllm, args.model)
    try:
        client = openai.OpenAI(base_url=url.rstrip("/") + "/v1", api_key="none", max_retries=0, timeout=120)
        messages = [{"role": "user", "content": "What is the weather like in Paris today, in celsius?"}]
        for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
            r = client.chat.completions.create(model="any", messages=messages, tools=[WEATHER], tool_choice=choice,
                                               parallel_tool_calls=False, temperature=0, max_tokens=256)
            if r.choices[0].finish_reason != "tool_calls":
                raise SystemExit(f"tool_choice {json.dumps(choice)}: finish_reason {r.choices[0].finish_reason}")
            call, arguments = check_call(r.choices[0].message, "get_weather")
            print(f"tool_choice {json.dumps(choice)}: {call.function.name}({call.function.arguments})")

        # The call and its result back in the conversation; the model answers in words.
        result = get_weather(**arguments)
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": call.id, "type": "function",
                 "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
            {"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)},
        ]
        # tool_choice "auto": the model answers, or calls again (a 270M model may).
        r = client.chat.completions.create(model="any", messages=messages, tools=[WEATHER], temperature=0,
                                           max_tokens=48)
        m = r.choices[0].message
        print("answer:", m.content if not m.tool_calls else "another call: " + m.tool_calls[0].function.arguments)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)
    print("tool calling: a valid call each time")


if __name__ == "__main__":
    main()
