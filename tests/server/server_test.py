#!/usr/bin/env python3
"""HTTP tests of `fitllm serve` against a real server on loopback (ctest: ServerHttp).

Run: .venv/bin/python tests/server/server_test.py BUILD_DIR/fitllm SOURCE_DIR [GROUP]
(GROUP: one of GROUPS below, or "rest"; without it every class runs).
Exits 77 (ctest: skipped) when the `openai` package is missing from the venv; without the `ollama`
package only OllamaClient is skipped.
Uses the tiny models in tests/model/data/ (fast, nonsense text) and the demo model when present.
"""
import datetime
import http.client
import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

try:
    import openai
except ImportError:
    print("SKIP: the Python package 'openai' is not installed (pip install -r requirements.txt)")
    sys.exit(77)
try:
    import ollama
except ImportError:
    ollama = None  # OllamaClient is skipped

FITLLM = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else "build/fitllm"
SOURCE = os.path.abspath(sys.argv[2]) if len(sys.argv) > 2 else "."
DATA = os.path.join(SOURCE, "tests", "model", "data")
TINY_LLAMA = os.path.join(DATA, "tiny-llama-q8_0.gguf")
TINY_QWEN = os.path.join(DATA, "tiny-qwen2-q8_0.gguf")
DEMO = os.path.join(SOURCE, "models", "gemma-3-270m-q4_k_m.gguf")
SANITIZED = os.environ.get("FITLLM_SANITIZED") == "1"  # the ASan + UBSan build (tests/CMakeLists.txt)


class Server:
    """fitllm serve on a free loopback port, stopped with SIGTERM."""

    def __init__(self, *args, wait_ready=True):
        self.proc = subprocess.Popen([FITLLM, "serve", "--port", "0", "-t", "2", *args], stderr=subprocess.PIPE,
                                     stdout=subprocess.DEVNULL, text=True)
        self.log = []
        line = self.proc.stderr.readline()
        self.log.append(line)
        m = re.search(r"listening on http://[\d.]+:(\d+)", line)
        if not m:
            self.proc.kill()
            raise RuntimeError("fitllm serve did not start: " + line + self.proc.stderr.read())
        self.port = int(m.group(1))
        threading.Thread(target=self._drain, daemon=True).start()
        self.base = f"http://127.0.0.1:{self.port}"
        if wait_ready:
            deadline = time.time() + 30
            while self.get("/health")[0] != 200:
                if time.time() > deadline or self.proc.poll() is not None:
                    raise RuntimeError("not ready: " + "".join(self.log))
                time.sleep(0.05)

    def _drain(self):
        for line in self.proc.stderr:
            self.log.append(line)

    def request(self, method, path, body=None, headers=None, raw=None):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        data = raw if raw is not None else (json.dumps(body) if body is not None else None)
        conn.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
        r = conn.getresponse()
        text = r.read().decode()
        conn.close()
        try:
            return r.status, json.loads(text)
        except json.JSONDecodeError:
            return r.status, text

    def get(self, path, **kw):
        return self.request("GET", path, **kw)

    def post(self, path, body=None, **kw):
        return self.request("POST", path, body, **kw)

    def client(self, key="none"):
        return openai.OpenAI(base_url=self.base + "/v1", api_key=key, max_retries=0, timeout=60)

    def metric(self, name):
        _, text = self.get("/metrics")
        total = 0.0
        found = False
        for line in text.splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                total += float(line.rsplit(" ", 1)[1])
                found = True
        return total if found else None

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stderr.close()


def assert_error(test, status_body, status, code=None, param=False):
    """The error's message; param: the field it must name (None: null), False: not checked."""
    s, body = status_body
    test.assertEqual(s, status, body)
    test.assertIsInstance(body, dict, body)
    test.assertIn("error", body)
    for k in ("message", "type", "param", "code"):  # param is null when no field is at fault
        test.assertIn(k, body["error"])
    if code is not None:
        test.assertEqual(body["error"]["code"], code, body)
    if param is not False:
        test.assertEqual(body["error"]["param"], param, body)
    return body["error"]["message"]


QWEN3_TEMPLATE = os.path.join(SOURCE, "tests", "chat", "fixtures", "templates", "qwen3.jinja")


def render_hf(template, messages, **variables):
    """A chat template rendered as Hugging Face's apply_chat_template renders it (jinja2)."""
    import jinja2

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                       extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template).render(messages=messages, add_generation_prompt=True, **variables)


class ToolsAndReasoning(unittest.TestCase):
    """Tools and thinking on the tiny Qwen 3 with Qwen 3's own chat template (copied into its file):
    the template gets the tools, the tool messages and the kwargs (the prompt's token count equals a
    jinja2 render's), and the answer goes through the splitter (its text is random: the parsing of
    calls and <think> is tested on text in tests/server/chat_output_test.cpp)."""

    WEATHER = {"function": {"description": "The weather in a city", "name": "get_weather",
                            "parameters": {"properties": {"city": {"type": "string"}}, "required": ["city"],
                                           "type": "object"}},
               "type": "function"}  # keys sorted, as the server's JSON holds them

    @classmethod
    def setUpClass(cls):
        try:
            import jinja2  # noqa: F401
            import jinja2.ext  # noqa: F401
            import jinja2.sandbox  # noqa: F401
        except ImportError:
            raise unittest.SkipTest("needs jinja2 and gguf (pip install -r requirements.txt)")
        cls.dir = tempfile.mkdtemp(prefix="fitllm-tools-")
        cls.path = os.path.join(cls.dir, "qwen3-tools.gguf")
        r = subprocess.run([sys.executable, "-m", "gguf.scripts.gguf_new_metadata", "--force",
                            "--chat-template-file", QWEN3_TEMPLATE, os.path.join(DATA, "tiny-qwen3-q8_0.gguf"),
                            cls.path], capture_output=True, text=True)
        if r.returncode != 0:
            shutil.rmtree(cls.dir)
            raise unittest.SkipTest("gguf_new_metadata failed (is gguf installed?): " + r.stderr[-300:])
        with open(QWEN3_TEMPLATE) as f:
            cls.template = f.read()
        cls.srv = Server("-m", cls.path, "-np", "2", "-c", "1024")
        cls.model = "qwen3-tools"

    @classmethod
    def tearDownClass(cls):
        cls.srv.stop()
        shutil.rmtree(cls.dir)

    def n_tokens(self, text):
        s, r = self.srv.post("/tokenize", {"content": text, "add_special": False, "parse_special": True})
        self.assertEqual(s, 200, r)
        return len(r["tokens"])

    def conversation(self):
        """A turn with a call and its result, as the client sends it and as the template sees it."""
        sent = [{"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"}]
        seen = [sent[0],
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
                {"role": "tool", "content": "18 C, sunny", "tool_call_id": "call_1"}]
        return sent, seen

    def test_template_gets_tools_and_tool_messages(self):
        sent, seen = self.conversation()
        client = self.srv.client()
        r = client.chat.completions.create(model=self.model, messages=sent, tools=[self.WEATHER], max_tokens=1)
        expected = self.n_tokens(render_hf(self.template, seen, tools=[self.WEATHER]))
        self.assertEqual(r.usage.prompt_tokens, expected)
        # Without the tools the prompt is shorter; tool_choice "none" does not offer them.
        plain = client.chat.completions.create(model=self.model, messages=sent, max_tokens=1)
        self.assertEqual(plain.usage.prompt_tokens, self.n_tokens(render_hf(self.template, seen)))
        self.assertLess(plain.usage.prompt_tokens, expected)
        none = client.chat.completions.create(model=self.model, messages=sent, tools=[self.WEATHER],
                                              tool_choice="none", max_tokens=1)
        self.assertEqual(none.usage.prompt_tokens, plain.usage.prompt_tokens)

    def test_chat_template_kwargs_and_think(self):
        msgs = [{"role": "user", "content": "2+2?"}]
        client = self.srv.client()
        off = client.chat.completions.create(model=self.model, messages=msgs, max_tokens=1,
                                             extra_body={"chat_template_kwargs": {"enable_thinking": False}})
        rendered = render_hf(self.template, msgs, enable_thinking=False)
        self.assertTrue(rendered.endswith("<think>\n\n</think>\n\n"), rendered)
        self.assertEqual(off.usage.prompt_tokens, self.n_tokens(rendered))
        on = client.chat.completions.create(model=self.model, messages=msgs, max_tokens=1)
        self.assertEqual(on.usage.prompt_tokens, self.n_tokens(render_hf(self.template, msgs)))
        # Ollama's think: false is enable_thinking: false.
        s, r = self.srv.post("/api/chat", {"model": self.model, "messages": msgs, "think": False, "stream": False,
                                           "options": {"num_predict": 1}})
        self.assertEqual((s, r.get("prompt_eval_count")), (200, off.usage.prompt_tokens), r)
        assert_error(self, self.srv.post("/v1/chat/completions", {"messages": msgs, "reasoning_format": "xml"}),
                     400, "invalid_value", "reasoning_format")

    def test_split_answer_whole_and_streamed_agree(self):
        # The random model's text goes through the splitter; streamed deltas must add up to the
        # whole answer, with reasoning and tool calls in their own fields when the text has them.
        sent, _ = self.conversation()
        client = self.srv.client()
        for extra in ({}, {"reasoning_format": "none"}):
            with self.subTest(extra=extra):
                whole = client.chat.completions.create(model=self.model, messages=sent, tools=[self.WEATHER],
                                                       max_tokens=40, temperature=0, extra_body=extra)
                m = whole.choices[0].message
                self.assertIn(whole.choices[0].finish_reason, ("stop", "length", "tool_calls"))
                content, reasoning, calls, finish = "", "", [], None
                for chunk in client.chat.completions.create(model=self.model, messages=sent, tools=[self.WEATHER],
                                                            max_tokens=40, temperature=0, stream=True,
                                                            extra_body=extra):
                    if not chunk.choices:
                        continue
                    d = chunk.choices[0].delta
                    content += d.content or ""
                    reasoning += getattr(d, "reasoning_content", None) or ""
                    for c in d.tool_calls or []:
                        calls.append((c.index, c.function.name, c.function.arguments))
                    finish = chunk.choices[0].finish_reason or finish
                self.assertEqual(content, m.content or "")
                self.assertEqual(reasoning, getattr(m, "reasoning_content", None) or "")
                self.assertEqual(calls, [(i, c.function.name, c.function.arguments)
                                         for i, c in enumerate(m.tool_calls or [])])
                self.assertEqual(finish, whole.choices[0].finish_reason)
                if extra:
                    self.assertIsNone(getattr(m, "reasoning_content", None))

    def test_show_lists_tools_and_thinking(self):
        s, r = self.srv.post("/api/show", {"model": self.model})
        self.assertEqual(s, 200, r)
        self.assertEqual(r["capabilities"], ["completion", "tools", "thinking"])

    def test_forcing_a_call(self):
        # tool_choice "required" or a named function: the answer is a call the grammar of the
        # template's format allows, whatever the (random) model would write, parsed into tool_calls.
        msgs = [{"role": "user", "content": "hi"}]
        short = {"type": "function", "function": {"name": "get_time", "parameters": {
            "type": "object", "properties": {"zone": {"type": "string", "maxLength": 6}}, "required": ["zone"]}}}
        weather = {"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"]}}}
        c = self.srv.client()
        for seed, choice in enumerate(("required", {"type": "function", "function": {"name": "get_weather"}})):
            r = c.chat.completions.create(model=self.model, messages=msgs, tools=[short, weather], tool_choice=choice,
                                          max_tokens=200, temperature=0.8, seed=seed)
            self.assertEqual(r.choices[0].finish_reason, "tool_calls", r)
            calls = r.choices[0].message.tool_calls
            self.assertGreaterEqual(len(calls), 1, r)
            for call in calls:
                args = json.loads(call.function.arguments)
                if choice != "required":
                    self.assertEqual(call.function.name, "get_weather")
                self.assertIn(call.function.name, ("get_time", "get_weather"))
                key = "zone" if call.function.name == "get_time" else "city"
                self.assertIsInstance(args[key], str)
                self.assertLessEqual(len(args[key]), 8)
        # Streamed: the call comes as a tool_calls delta.
        deltas = []
        for chunk in c.chat.completions.create(model=self.model, messages=msgs, tools=[weather], tool_choice="required",
                                               max_tokens=200, seed=7, stream=True):
            for ch in chunk.choices:
                deltas += ch.delta.tool_calls or []
        self.assertEqual([d.function.name for d in deltas], ["get_weather"])
        # Refused: a call forced without tools, a name not offered, and with response_format too.
        chat = "/v1/chat/completions"
        assert_error(self, self.srv.post(chat, {"messages": msgs, "tool_choice": "required"}), 400, None, "tool_choice")
        assert_error(self, self.srv.post(chat, {"messages": msgs, "tools": [weather], "tool_choice": {
            "type": "function", "function": {"name": "nope"}}}), 400, None, "tool_choice")
        assert_error(self, self.srv.post(chat, {"messages": msgs, "tools": [weather], "tool_choice": "required",
                                                "response_format": {"type": "json_object"}}), 400, None, "tool_choice")

    def test_forced_calls_in_each_of_n_choices(self):
        # n choices: each is a sequence with its own grammar matcher, its calls parsed on its own.
        msgs = [{"role": "user", "content": "hi"}]
        weather = {"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"]}}}
        c = self.srv.client()
        r = c.chat.completions.create(model=self.model, messages=msgs, tools=[weather], tool_choice="required",
                                      max_tokens=200, temperature=0.8, seed=3, n=2)
        self.assertEqual([ch.index for ch in r.choices], [0, 1])
        for ch in r.choices:
            self.assertEqual(ch.finish_reason, "tool_calls", r)
            self.assertEqual([call.function.name for call in ch.message.tool_calls], ["get_weather"])
            self.assertLessEqual(len(json.loads(ch.message.tool_calls[0].function.arguments)["city"]), 8)
        names, finish = {0: [], 1: []}, {}
        for chunk in c.chat.completions.create(model=self.model, messages=msgs, tools=[weather],
                                               tool_choice="required", max_tokens=200, seed=3, n=2, stream=True):
            for ch in chunk.choices:
                names[ch.index] += [d.function.name for d in ch.delta.tool_calls or []]
                if ch.finish_reason:
                    finish[ch.index] = ch.finish_reason
        self.assertEqual(names, {0: ["get_weather"], 1: ["get_weather"]})
        self.assertEqual(finish, {0: "tool_calls", 1: "tool_calls"})

    @unittest.skipIf(ollama is None, "the ollama package is not installed")
    def test_ollama_client_tools_and_think(self):
        client = ollama.Client(host=self.srv.base)
        history = [{"role": "user", "content": "Weather in Paris?"},
                   {"role": "assistant", "content": "",
                    "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
                   {"role": "tool", "content": "18 C, sunny", "tool_name": "get_weather"}]
        r = client.chat(model=self.model, messages=history, tools=[self.WEATHER], think=True,
                        options={"num_predict": 4, "temperature": 0})
        self.assertTrue(r.done)
        seen = [history[0], {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
            {"role": "tool", "content": "18 C, sunny", "name": "get_weather"}]
        self.assertEqual(r.prompt_eval_count,
                         self.n_tokens(render_hf(self.template, seen, tools=[self.WEATHER], enable_thinking=True)))
        self.assertIsInstance(r.message.content, str)
        for call in r.message.tool_calls or []:
            self.assertIsInstance(call.function.arguments, dict)


class HarmonyToolCalls(unittest.TestCase):
    """gpt-oss's harmony format on the tiny gpt-oss (its own template): tool_choice "required" or a
    named function constrains the (random) output to a harmony call, an analysis message before it
    or not, read back as tool_calls (whole and streamed) whose arguments validate against the
    schema; "auto" is not constrained."""

    WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather", "parameters": {
        "type": "object", "properties": {
            "place": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10},
                                                       "country": {"enum": ["NO", "FR"]}},
                      "required": ["city", "country"], "additionalProperties": False},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "days": {"type": "number", "minimum": 0, "maximum": 7}},
        "required": ["place", "unit", "days"], "additionalProperties": False}}}
    TIME = {"type": "function", "function": {"name": "get_time", "description": "The time"}}
    # The random model may reason (analysis) for as long as it likes before the call: <|end|> (id
    # 357 in the tiny vocabulary), which ends the analysis, is made likelier so that it does.
    END_BIAS = {"357": 4}

    @classmethod
    def setUpClass(cls):
        cls.srv = Server("-m", os.path.join(DATA, "tiny-gpt-oss-q8_0.gguf"), "-np", "2", "-c", "2048")

    @classmethod
    def tearDownClass(cls):
        cls.srv.stop()

    def check(self, calls, name=None):
        self.assertEqual(len(calls), 1)
        fn = calls[0]["function"] if isinstance(calls[0], dict) else calls[0].function
        fname, fargs = (fn["name"], fn["arguments"]) if isinstance(fn, dict) else (fn.name, fn.arguments)
        if name:
            self.assertEqual(fname, name)
        self.assertIn(fname, ("get_weather", "get_time"))
        args = json.loads(fargs)
        if jsonschema is not None and fname == "get_weather":
            jsonschema.validate(args, self.WEATHER["function"]["parameters"])
        return fname

    def test_forced_calls_whole_and_streamed(self):
        c = self.srv.client()
        msgs = [{"role": "user", "content": "Weather in Oslo?"}]
        reasoned = 0
        for seed in range(4):
            for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
                name = None if choice == "required" else "get_weather"
                r = c.chat.completions.create(model="x", messages=msgs, tools=[self.WEATHER, self.TIME],
                                              tool_choice=choice, max_tokens=1500, seed=seed,
                                              logit_bias=self.END_BIAS)
                self.assertEqual(r.choices[0].finish_reason, "tool_calls", r)
                self.assertIsNone(r.choices[0].message.content, r)
                self.check(r.choices[0].message.tool_calls, name)
                reasoned += bool(getattr(r.choices[0].message, "reasoning_content", None))
                deltas, finish = [], None
                for chunk in c.chat.completions.create(model="x", messages=msgs, tools=[self.WEATHER, self.TIME],
                                                       tool_choice=choice, max_tokens=1500, seed=seed, stream=True,
                                                       logit_bias=self.END_BIAS):
                    for ch in chunk.choices:
                        deltas += ch.delta.tool_calls or []
                        self.assertFalse(ch.delta.content, chunk)
                        finish = ch.finish_reason or finish
                self.assertEqual(finish, "tool_calls")
                self.check(deltas, name)
        print(f"harmony forced calls: {reasoned} of 8 reasoned (analysis) before the call", file=sys.stderr)
        # Not forced: nothing constrains the answer, which ends as the model likes.
        r = c.chat.completions.create(model="x", messages=msgs, tools=[self.WEATHER], max_tokens=8, seed=1)
        self.assertIn(r.choices[0].finish_reason, ("length", "stop", "tool_calls"))

    def test_grammar_token_references(self):
        # A grammar's <|channel|> is gpt-oss's token: the final message it writes is the content.
        msgs = [{"role": "user", "content": "hi"}]
        s, r = self.srv.post("/v1/chat/completions", {"messages": msgs, "max_tokens": 40, "seed": 2, "grammar":
                                                      'root ::= <|channel|> "final" <|message|> [a-z]{1,5} <|return|>'})
        self.assertEqual(s, 200, r)
        self.assertRegex(r["choices"][0]["message"]["content"], "^[a-z]{1,5}$")
        self.assertEqual(r["choices"][0]["finish_reason"], "stop")
        assert_error(self, self.srv.post("/v1/chat/completions", {"messages": msgs, "grammar": "root ::= <|nope|>"}),
                     400, "invalid_grammar", "grammar")


class OneModel(unittest.TestCase):
    """A tiny Llama with 2 slots: the API, streaming, bad input, cancellation, batching."""

    @classmethod
    def setUpClass(cls):
        cls.srv = Server("-m", TINY_LLAMA, "-np", "2", "-c", "512", "--max-queue", "4")
        cls.model = "tiny-llama-q8_0"

    @classmethod
    def tearDownClass(cls):
        cls.srv.stop()

    def test_health_and_models(self):
        self.assertEqual(self.srv.get("/health"), (200, {"status": "ok"}))
        models = self.srv.client().models.list()
        self.assertEqual([m.id for m in models.data], [self.model])

    def test_chat_whole_and_streamed_agree(self):
        c = self.srv.client()
        msgs = [{"role": "user", "content": "Hello there"}]
        whole = c.chat.completions.create(model=self.model, messages=msgs, max_tokens=12, temperature=0)
        self.assertEqual(whole.object, "chat.completion")
        self.assertEqual(whole.choices[0].message.role, "assistant")
        self.assertEqual(whole.usage.completion_tokens, 12)
        self.assertEqual(whole.choices[0].finish_reason, "length")
        self.assertGreater(whole.usage.prompt_tokens, 3)
        text = ""
        usage = None
        finish = None
        for chunk in c.chat.completions.create(model=self.model, messages=msgs, max_tokens=12, temperature=0,
                                               stream=True, stream_options={"include_usage": True}):
            if chunk.usage:
                usage = chunk.usage
            for ch in chunk.choices:
                text += ch.delta.content or ""
                finish = ch.finish_reason or finish
        self.assertEqual(text, whole.choices[0].message.content)
        self.assertEqual(finish, "length")
        self.assertEqual(usage.completion_tokens, 12)

    def test_nullable_fields_as_the_spec_shows_them(self):
        s, r = self.srv.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                      "max_tokens": 2})
        self.assertEqual(s, 200, r)
        choice = r["choices"][0]
        self.assertIsNone(choice["logprobs"])
        self.assertEqual(choice["message"]["refusal"], None)
        s, r = self.srv.post("/v1/completions", {"prompt": "hi", "max_tokens": 2})
        self.assertIsNone(r["choices"][0]["logprobs"])
        conn = http.client.HTTPConnection("127.0.0.1", self.srv.port, timeout=30)
        conn.request("POST", "/v1/chat/completions", json.dumps(
            {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "stream": True}))
        events = [json.loads(e[6:]) for e in conn.getresponse().read().decode().split("\n\n")
                  if e.startswith("data: {")]
        conn.close()
        self.assertTrue(events)
        self.assertTrue(all(e["choices"][0]["logprobs"] is None for e in events if e["choices"]), events)

    def test_sse_ends_with_done(self):
        conn = http.client.HTTPConnection("127.0.0.1", self.srv.port, timeout=30)
        conn.request("POST", "/v1/completions", json.dumps({"prompt": "a b c", "max_tokens": 4, "stream": True}))
        r = conn.getresponse()
        self.assertEqual(r.status, 200)
        self.assertTrue(r.getheader("Content-Type").startswith("text/event-stream"))
        events = [e for e in r.read().decode().split("\n\n") if e]
        self.assertTrue(all(e.startswith("data: ") for e in events), events)
        self.assertEqual(events[-1], "data: [DONE]")
        self.assertIn(json.loads(events[-2][6:])["choices"][0]["finish_reason"], ("length", "stop"))
        conn.close()

    def test_completions_and_sampling_fields(self):
        c = self.srv.client()
        r = c.completions.create(model=self.model, prompt="Once upon a time", max_tokens=10, temperature=0.9,
                                 top_p=0.9, seed=7, presence_penalty=0.5, frequency_penalty=0.5,
                                 extra_body={"top_k": 20, "min_p": 0.01, "repeat_penalty": 1.1})
        again = c.completions.create(model=self.model, prompt="Once upon a time", max_tokens=10, temperature=0.9,
                                     top_p=0.9, seed=7, presence_penalty=0.5, frequency_penalty=0.5,
                                     extra_body={"top_k": 20, "min_p": 0.01, "repeat_penalty": 1.1})
        self.assertEqual(r.object, "text_completion")
        self.assertEqual(r.choices[0].text, again.choices[0].text)  # same seed, same text
        self.assertEqual(r.usage.completion_tokens, 10)
        # Token ids as the prompt.
        _, tok = self.srv.post("/tokenize", {"content": "Once upon a time", "add_special": True})
        by_ids = c.completions.create(model=self.model, prompt=tok["tokens"], max_tokens=10, temperature=0)
        by_text = c.completions.create(model=self.model, prompt="Once upon a time", max_tokens=10, temperature=0)
        self.assertEqual(by_ids.choices[0].text, by_text.choices[0].text)

    def test_stop_strings(self):
        c = self.srv.client()
        full = c.completions.create(model=self.model, prompt="Once upon a time", max_tokens=24, temperature=0)
        text = full.choices[0].text
        # A stop string from a run of ASCII letters inside the text (tiny models emit odd bytes too).
        m = re.search(r"[A-Za-z]{3,}", text[1:])
        self.assertIsNotNone(m, text)
        stop = m.group(0)[:3]
        cut = c.completions.create(model=self.model, prompt="Once upon a time", max_tokens=24, temperature=0,
                                   stop=[stop])
        self.assertEqual(cut.choices[0].text, text[:text.index(stop)])
        self.assertEqual(cut.choices[0].finish_reason, "stop")
        streamed = "".join(ch.choices[0].text for ch in c.completions.create(
            model=self.model, prompt="Once upon a time", max_tokens=24, temperature=0, stop=stop, stream=True)
            if ch.choices)
        self.assertEqual(streamed, cut.choices[0].text)

    def test_tokenize_detokenize(self):
        s, r = self.srv.post("/tokenize", {"content": "hello world"})
        self.assertEqual(s, 200)
        self.assertTrue(all(isinstance(t, int) for t in r["tokens"]))
        s, d = self.srv.post("/detokenize", {"tokens": r["tokens"]})
        self.assertEqual((s, d["content"].strip()), (200, "hello world"))
        assert_error(self, self.srv.post("/detokenize", {"tokens": [10**9]}), 400, "invalid_value")
        assert_error(self, self.srv.post("/tokenize", {"content": 5}), 400)

    def test_bad_input(self):
        chat = "/v1/chat/completions"
        msgs = [{"role": "user", "content": "hi"}]
        assert_error(self, self.srv.post(chat, raw="{not json"), 400, "invalid_json")
        assert_error(self, self.srv.post(chat, raw="[1, 2]"), 400, "invalid_type")
        assert_error(self, self.srv.post(chat, {"model": self.model}), 400, "missing_field")
        assert_error(self, self.srv.post(chat, {"messages": "hi"}), 400, "invalid_type")
        assert_error(self, self.srv.post(chat, {"messages": [{"role": 1, "content": "x"}]}), 400, "invalid_type")
        assert_error(self, self.srv.post(chat, {"messages": msgs, "max_tokens": "ten"}), 400, "invalid_type")
        assert_error(self, self.srv.post(chat, {"messages": msgs, "temperature": -1}), 400, "invalid_value")
        assert_error(self, self.srv.post(chat, {"messages": msgs, "top_p": "high"}), 400, "invalid_type")
        assert_error(self, self.srv.post(chat, {"messages": msgs, "stop": [1]}), 400, "invalid_type")
        assert_error(self, self.srv.post(chat, {"messages": msgs, "stream": "yes"}), 400, "invalid_type")
        assert_error(self, self.srv.post(chat, {"messages": msgs, "n": 0}), 400, "invalid_value")
        # One model answers to any name (clients send their own default): see ModelNames.
        s, r = self.srv.post(chat, {"messages": msgs, "model": "no-such-model", "max_tokens": 2})
        self.assertEqual((s, r["model"]), (200, self.model), r)
        msg = assert_error(self, self.srv.post(chat, {"messages": msgs, "max_tokens": 10**6}), 400,
                           "context_length_exceeded")
        self.assertIn("512", msg)
        long_prompt = "word " * 2000
        msg = assert_error(self, self.srv.post("/v1/completions", {"prompt": long_prompt}), 400,
                           "context_length_exceeded")
        self.assertIn("512", msg)
        assert_error(self, self.srv.post("/v1/completions", {"prompt": [1, "x"]}), 400)
        assert_error(self, self.srv.get("/v1/nothing"), 404, "not_found")
        # The openai client sees these as exceptions of the right class.
        with self.assertRaises(openai.BadRequestError):
            self.srv.client().chat.completions.create(model=self.model, messages=msgs, max_tokens=10**6)
        # And the server still serves.
        r = self.srv.client().chat.completions.create(model=self.model, messages=msgs, max_tokens=3)
        self.assertEqual(r.usage.completion_tokens, 3)

    def test_unsupported_fields_are_refused(self):
        # What fitllm does not implement is a 400 unsupported_parameter naming the field, never ignored.
        chat, comp = "/v1/chat/completions", "/v1/completions"
        msgs = [{"role": "user", "content": "hi"}]
        tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
        refused = [
            (chat, {"response_format": {"type": "json_object", "strict": True}}, "response_format.strict"),
            (chat, {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "other": 1}}},
             "response_format.json_schema.other"),
            (chat, {"functions": [tool["function"]]}, "functions"),
            (chat, {"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
            (chat, {"modalities": ["text", "audio"]}, "modalities"),
            (chat, {"reasoning_effort": "high"}, "reasoning_effort"),
            (chat, {"prediction": {"type": "content", "content": "x"}}, "prediction"),
            (chat, {"store": True}, "store"),
            (chat, {"service_tier": "flex"}, "service_tier"),
            (chat, {"stream_options": {"include_usage": True, "other": 1}}, "stream_options.other"),
            (chat, {"mirostat": 2}, "mirostat"),  # a field nobody defined here
            (chat, {"prompt": "x"}, "prompt"),  # a completions field
            (comp, {"messages": msgs}, "messages"),  # and the other way round
            (comp, {"best_of": 2}, "best_of"),
            (comp, {"echo": True}, "echo"),
            (comp, {"suffix": "end"}, "suffix"),
            (comp, {"prompt": ["a", "b"]}, "prompt"),  # a batch of prompts
        ]
        for path, extra, param in refused:
            body = {"messages": msgs} if path == chat else {"prompt": "hi"}
            body.update(extra)
            with self.subTest(path=path, field=param):
                msg = assert_error(self, self.srv.post(path, body), 400, "unsupported_parameter", param)
                self.assertTrue(msg.startswith(param + ":"), msg)
                self.assertEqual(self.srv.post(path, body)[1]["error"]["type"], "invalid_request_error")
        # This model's template (built-in Mistral v0.1) shows no tools: they go into a system prompt
        # (a longer prompt), and a forced call comes back in Hermes's format, parsed.
        digit = {"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["x"],
            "additionalProperties": False}}}
        s, plain = self.srv.post(chat, {"messages": msgs, "max_tokens": 1})
        s, r = self.srv.post(chat, {"messages": msgs, "tools": [digit], "tool_choice": "required",
                                    "parallel_tool_calls": False, "temperature": 0, "max_tokens": 80})
        self.assertEqual(s, 200, r)
        self.assertGreater(r["usage"]["prompt_tokens"], plain["usage"]["prompt_tokens"] + 20)
        # A random model spends the grammar's whitespace (up to 16 per place), so 80 tokens may cut
        # the call: then the text is its start. The demo model's whole call: DemoModel.
        if r["choices"][0]["finish_reason"] == "length":
            self.assertTrue(r["choices"][0]["message"]["content"].startswith("<tool_call>\n{"), r)
        else:
            self.assertEqual(r["choices"][0]["finish_reason"], "tool_calls", r)
            call = r["choices"][0]["message"]["tool_calls"][0]["function"]
            self.assertEqual(call["name"], "f")
            self.assertIn(json.loads(call["arguments"])["x"], range(10))
        # A message's tool calls and tool messages are accepted and given to the template (this one,
        # Mistral v0.1's, ignores tool_calls and refuses the tool role itself); the deprecated
        # function_call is refused.
        tool_msgs = msgs + [{"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]
        s, r = self.srv.post(chat, {"messages": tool_msgs + [{"role": "user", "content": "ok"}], "max_tokens": 2})
        self.assertEqual(s, 200, r)
        msg = assert_error(self, self.srv.post(chat, {"messages": tool_msgs + [
            {"role": "tool", "tool_call_id": "c1", "content": "42"}]}), 400, "template_error", "messages")
        self.assertIn("roles must alternate", msg)
        assert_error(self, self.srv.post(chat, {"messages": msgs[:0] + [
            {"role": "assistant", "content": "x", "function_call": {"name": "f", "arguments": "{}"}}]}),
            400, "unsupported_parameter", "messages[0].function_call")
        # The openai client raises BadRequestError with the field in it: a schema keyword fitllm
        # cannot honour is refused by its path, never ignored.
        with self.assertRaises(openai.BadRequestError) as e:
            self.srv.client().chat.completions.create(model=self.model, messages=msgs, response_format={
                "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "a+"}}})
        self.assertEqual(e.exception.body["param"], "response_format.json_schema.schema")
        self.assertEqual(e.exception.body["code"], "unsupported_schema")
        self.assertIn("$.pattern", e.exception.body["message"])
        # Values that ask for nothing more pass, and an error with no field at fault has param null.
        accepted = {"response_format": {"type": "text"}, "tools": [], "tool_choice": "none", "n": 1,
                    "logprobs": False, "user": "u-1", "metadata": {"k": "v"}, "store": False,
                    "parallel_tool_calls": True, "service_tier": "auto", "modalities": ["text"], "typical_p": 0.9,
                    "stream_options": None, "max_completion_tokens": 2}
        s, r = self.srv.post(chat, {"messages": [{"role": "user", "content": "hi", "name": "ann"}], **accepted})
        self.assertEqual((s, r["usage"]["completion_tokens"]), (200, 2), r)
        s, r = self.srv.post(comp, {"prompt": "hi", "max_tokens": 2, "n": 1, "best_of": 1, "echo": False,
                                    "logprobs": None, "suffix": None})
        self.assertEqual((s, r["usage"]["completion_tokens"]), (200, 2), r)
        assert_error(self, self.srv.post(chat, raw="{not json"), 400, "invalid_json", None)
        assert_error(self, self.srv.post(chat, {"messages": msgs, "temperature": -1}), 400, "invalid_value",
                     "temperature")
        assert_error(self, self.srv.post(chat, {"messages": msgs, "max_tokens": 10**6}), 400,
                     "context_length_exceeded", "max_tokens")

    def test_logprobs(self):
        msgs = [{"role": "user", "content": "Hello there"}]
        body = {"messages": msgs, "max_tokens": 8, "temperature": 0, "logprobs": True, "top_logprobs": 3}
        s, r = self.srv.post("/v1/chat/completions", body)
        self.assertEqual(s, 200, r)
        choice = r["choices"][0]
        self.assertEqual(choice["finish_reason"], "length")
        content = choice["logprobs"]["content"]
        self.assertIsNone(choice["logprobs"]["refusal"])
        self.assertEqual(len(content), 8)
        for e in content:
            top = e["top_logprobs"]
            self.assertEqual(len(top), 3)
            self.assertLessEqual(e["logprob"], 0.0)
            self.assertEqual([t["logprob"] for t in top], sorted((t["logprob"] for t in top), reverse=True))
            self.assertEqual((top[0]["token"], top[0]["logprob"]), (e["token"], e["logprob"]))  # greedy: the best
            self.assertLessEqual(sum(math.exp(t["logprob"]) for t in top), 1.0 + 1e-5)
            self.assertEqual(bytes(e["bytes"]).decode(errors="replace"), e["token"])
        # The tokens' bytes are the text (the tiny model emits stray bytes: each invalid run is one
        # U+FFFD in the text, and one per byte token in a token's own text).
        valid = lambda text: text.replace("\ufffd", "")
        self.assertEqual(valid(b"".join(bytes(e["bytes"]) for e in content).decode(errors="replace")),
                         valid(choice["message"]["content"]))
        # Streamed: the same tokens and numbers, spread over the chunks.
        streamed = []
        for ch in self.srv.client().chat.completions.create(model=self.model, stream=True, **body):
            if ch.choices and ch.choices[0].logprobs:
                streamed += [(t.token, t.logprob) for t in ch.choices[0].logprobs.content]
        self.assertEqual(streamed, [(e["token"], e["logprob"]) for e in content])
        # Sampled: the chosen token's log probability, among the alternatives when it is one of them.
        r = self.srv.client().chat.completions.create(model=self.model, messages=msgs, max_tokens=8, temperature=1.0,
                                                      seed=3, logprobs=True, top_logprobs=5)
        for e in r.choices[0].logprobs.content:
            for t in e.top_logprobs:
                if t.token == e.token and t.bytes == e.bytes:
                    self.assertEqual(t.logprob, e.logprob)
        # A text completion's form: tokens, their log probabilities, alternatives and offsets.
        s, r = self.srv.post("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 6, "temperature": 0,
                                                 "logprobs": 2})
        lp = r["choices"][0]["logprobs"]
        self.assertEqual(len(lp["tokens"]), 6)
        self.assertEqual(valid("".join(lp["tokens"])), valid(r["choices"][0]["text"]))
        offsets = lp["text_offset"]
        self.assertEqual(offsets[0], 0)
        for i in range(5):  # each token's bytes (a stray byte's text is U+FFFD: 1 byte, not 3)
            size = 1 if lp["tokens"][i] == "\ufffd" else len(lp["tokens"][i].encode())
            self.assertEqual(offsets[i + 1] - offsets[i], size, lp)
        for tok, logprob, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
            self.assertLessEqual(logprob, 0.0)
            self.assertTrue(1 <= len(top) <= 2)
            self.assertEqual(max(top.values()), logprob)  # greedy
        # Not asked for: null; asked for wrongly: 400 naming the field.
        s, r = self.srv.post("/v1/chat/completions", {"messages": msgs, "max_tokens": 2})
        self.assertIsNone(r["choices"][0]["logprobs"])
        chat, comp = "/v1/chat/completions", "/v1/completions"
        assert_error(self, self.srv.post(chat, {"messages": msgs, "top_logprobs": 2}), 400, "invalid_value",
                     "top_logprobs")
        assert_error(self, self.srv.post(chat, {"messages": msgs, "logprobs": True, "top_logprobs": 21}), 400,
                     "invalid_value", "top_logprobs")
        assert_error(self, self.srv.post(chat, {"messages": msgs, "logprobs": 2}), 400, "invalid_type", "logprobs")
        assert_error(self, self.srv.post(comp, {"prompt": "hi", "logprobs": 21}), 400, "invalid_value", "logprobs")

    def test_logit_bias(self):
        c = self.srv.client()
        prompt = "Once upon a time"
        ask = lambda **kw: c.completions.create(model=self.model, prompt=prompt, max_tokens=1, temperature=0,
                                                **kw).choices[0].text
        natural = ask()
        # +100 on a token makes greedy pick it; -100 bans it: greedy's own choice is never picked.
        _, tok = self.srv.post("/tokenize", {"content": " castle"})
        forced = tok["tokens"][-1]
        _, piece = self.srv.post("/detokenize", {"tokens": [forced]})
        self.assertEqual(ask(logit_bias={str(forced): 100}), piece["content"])
        # Every token whose text is greedy's choice, banned: greedy picks another text. (The tiny
        # model's vocabulary spells some texts with several tokens, byte tokens among them.)
        same, i = [], 0
        while True:
            s, piece_i = self.srv.post("/detokenize", {"tokens": [i]})
            if s != 200:
                break
            if piece_i["content"] == natural:
                same.append(i)
            i += 1
        self.assertGreater(i, 100)
        self.assertTrue(same, natural)
        ban = {str(t): -100 for t in same}
        self.assertNotEqual(ask(logit_bias=ban), natural)
        self.assertEqual(ask(logit_bias={str(t): 0 for t in same}), natural)
        # Sampled (the same seeds): it comes without the ban, never with it.
        sample = lambda bias: [c.completions.create(model=self.model, prompt=prompt, max_tokens=1, temperature=1.5,
                                                    seed=i, logit_bias=bias, extra_body={"top_k": 3}).choices[0].text
                               for i in range(8)]
        self.assertIn(natural, sample({}))
        self.assertNotIn(natural, sample(ban))
        chat = "/v1/chat/completions"
        msgs = [{"role": "user", "content": "hi"}]
        assert_error(self, self.srv.post(chat, {"messages": msgs, "logit_bias": {"10": 101}}), 400, "invalid_value",
                     'logit_bias["10"]')
        assert_error(self, self.srv.post(chat, {"messages": msgs, "logit_bias": {"x1": 1}}), 400, "invalid_value",
                     "logit_bias")
        assert_error(self, self.srv.post(chat, {"messages": msgs, "logit_bias": {str(10**8): 1}}), 400,
                     "invalid_value", "logit_bias")
        assert_error(self, self.srv.post(chat, {"messages": msgs, "logit_bias": [1]}), 400, "invalid_type",
                     "logit_bias")

    def test_disconnect_frees_the_slot(self):
        # Two long streams fill both slots; dropping them mid-stream must free the slots at once,
        # or the next request would wait for 400 more tokens each.
        socks = []
        for _ in range(2):
            s = socket.create_connection(("127.0.0.1", self.srv.port))
            body = json.dumps({"prompt": "Once upon a time", "max_tokens": 450, "stream": True, "temperature": 0})
            s.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                       f"Content-Length: {len(body)}\r\n\r\n{body}").encode())
            socks.append(s)
        for s in socks:
            got = b""
            while got.count(b"data: ") < 3:
                got += s.recv(4096)
        self.assertEqual(self.srv.metric("fitllm_slots_busy"), 2)
        for s in socks:
            s.close()
        deadline = time.time() + 5
        while self.srv.metric("fitllm_slots_busy") != 0:
            self.assertLess(time.time(), deadline, "slots still busy after the clients went away")
            time.sleep(0.05)
        r = self.srv.client().completions.create(model=self.model, prompt="hi", max_tokens=2)
        self.assertEqual(r.usage.completion_tokens, 2)

    def test_concurrent_greedy_equals_single(self):
        c = self.srv.client()
        prompts = ["Once upon a time", "The quick brown fox", "In a hole in the ground", "It was a dark night"]
        alone = [c.completions.create(model=self.model, prompt=p, max_tokens=20, temperature=0).choices[0].text
                 for p in prompts]
        together = [None] * len(prompts)

        def run(i):
            together[i] = self.srv.client().completions.create(model=self.model, prompt=prompts[i], max_tokens=20,
                                                               temperature=0).choices[0].text

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(together, alone)

    def test_metrics_and_memory(self):
        self.srv.client().completions.create(model=self.model, prompt="hi", max_tokens=2)
        _, text = self.srv.get("/metrics")
        for name in ("fitllm_requests_total", "fitllm_generated_tokens_total", "fitllm_tokens_per_second",
                     "fitllm_kv_cells_used", "fitllm_kv_cells_free", "fitllm_memory_used_bytes",
                     "fitllm_queue_length", "fitllm_models_loaded"):
            self.assertIn(name, text)
        self.assertEqual(self.srv.metric("fitllm_models_loaded"), 1)
        self.assertGreater(self.srv.metric("fitllm_generated_tokens_total"), 0)
        s, mem = self.srv.get("/v1/memory")
        self.assertEqual(s, 200)
        dev = mem["devices"][0]
        self.assertEqual(dev["name"], "host")
        pools = {p["name"]: p for p in dev["pools"]}
        for k in ("weights", "kv", "scratch", "logits"):
            self.assertIn(k, pools)
        self.assertEqual(dev["used"], sum(p["used"] for p in dev["pools"]))
        self.assertLessEqual(dev["used"], dev["capacity"])
        # Requests charge their own pool (this one's connection at least); the rest is the model's.
        self.assertGreater(pools["requests"]["used"], 0)
        model_used = dev["used"] - pools["requests"]["used"]
        m = mem["models"][0]
        self.assertEqual((m["id"], m["loaded"]), (self.model, True))
        plan = m["plan"]
        self.assertEqual(plan["total"], plan["weights"] + plan["kv"] + plan["scratch"] + plan["logits"] +
                         plan["prompt_cache"] + plan["overhead"])
        # Charged: the plan's weights, logits and overhead, the cache's own KV bytes (as planned, byte
        # for byte) and the model's working memory after a full batch (at most the plan's scratch).
        self.assertLessEqual(model_used, plan["total"])
        self.assertGreater(model_used, plan["total"] - plan["scratch"])
        self.assertEqual(pools["kv"]["used"], plan["kv"])
        self.assertLessEqual(m["used"], plan["total"])


class Ollama(unittest.TestCase):
    """Ollama's /api/chat, /api/generate (whole and NDJSON), /api/tags, /api/version, /api/show,
    /api/ps and keep_alive with -m, in plain HTTP."""

    @classmethod
    def setUpClass(cls):
        cls.srv = Server("-m", TINY_LLAMA, "-np", "2", "-c", "512")
        cls.model = "tiny-llama-q8_0"

    @classmethod
    def tearDownClass(cls):
        cls.srv.stop()

    def ndjson(self, path, body):
        conn = http.client.HTTPConnection("127.0.0.1", self.srv.port, timeout=60)
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        r = conn.getresponse()
        raw = r.read().decode()
        conn.close()
        self.assertEqual(r.status, 200, raw)
        self.assertEqual(r.getheader("Content-Type"), "application/x-ndjson")
        self.assertTrue(raw.endswith("\n"))
        return [json.loads(line) for line in raw.splitlines()]

    def test_tags_and_version(self):
        s, tags = self.srv.get("/api/tags")
        self.assertEqual(s, 200)
        [m] = tags["models"]
        self.assertEqual((m["name"], m["model"], m["size"]), (self.model, self.model, os.path.getsize(TINY_LLAMA)))
        self.assertEqual(m["details"]["format"], "gguf")
        self.assertRegex(m["modified_at"], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
        s, v = self.srv.get("/api/version")
        self.assertEqual(s, 200)
        self.assertRegex(v["version"], r"^\d+\.\d+\.\d+")

    def test_chat_whole_and_streamed_as_openai(self):
        msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]
        ref = self.srv.client().chat.completions.create(model=self.model, messages=msgs, max_tokens=12, temperature=0)
        body = {"model": self.model + ":latest", "messages": msgs, "stream": False,
                "options": {"temperature": 0, "num_predict": 12}}
        s, r = self.srv.post("/api/chat", body)
        self.assertEqual(s, 200, r)
        self.assertEqual(r["message"], {"role": "assistant", "content": ref.choices[0].message.content})
        self.assertEqual((r["model"], r["done"], r["done_reason"]), (self.model, True, "length"))
        self.assertEqual((r["prompt_eval_count"], r["eval_count"]), (ref.usage.prompt_tokens, 12))
        self.assertRegex(r["created_at"], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")
        self.assertGreater(r["total_duration"], 0)
        self.assertLessEqual(r["prompt_eval_duration"] + r["eval_duration"], r["total_duration"])
        del body["stream"]  # streamed by default
        lines = self.ndjson("/api/chat", body)
        self.assertTrue(all(not line["done"] for line in lines[:-1]))
        self.assertGreater(len(lines), 2)
        self.assertEqual("".join(line["message"]["content"] for line in lines), ref.choices[0].message.content)
        self.assertEqual((lines[-1]["done"], lines[-1]["done_reason"], lines[-1]["eval_count"]), (True, "length", 12))

    def test_generate_raw_templated_and_load(self):
        prompt = "Once upon a time"
        ref = self.srv.client().completions.create(model=self.model, prompt=prompt, max_tokens=10, temperature=0)
        s, r = self.srv.post("/api/generate", {"model": "whatever", "prompt": prompt, "raw": True, "stream": False,
                                               "options": {"temperature": 0, "num_predict": 10}})
        self.assertEqual((s, r["response"], r["eval_count"]), (200, ref.choices[0].text, 10), r)
        # Not raw: through the chat template, "system" first.
        chat = self.srv.client().chat.completions.create(
            model=self.model, max_tokens=10, temperature=0,
            messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": prompt}])
        body = {"prompt": prompt, "system": "Be brief.", "options": {"temperature": 0, "num_predict": 10}}
        lines = self.ndjson("/api/generate", body)
        self.assertEqual("".join(line["response"] for line in lines), chat.choices[0].message.content)
        self.assertEqual(lines[-1]["prompt_eval_count"], chat.usage.prompt_tokens)
        # Stop strings and a seed pass through the options.
        s, r = self.srv.post("/api/generate", {"prompt": prompt, "raw": True, "stream": False, "options": {
            "temperature": 0.8, "seed": 5, "top_k": 20, "num_predict": 10}})
        s2, r2 = self.srv.post("/api/generate", {"prompt": prompt, "raw": True, "stream": False, "options": {
            "temperature": 0.8, "seed": 5, "top_k": 20, "num_predict": 10}})
        self.assertEqual((s, s2, r["response"]), (200, 200, r2["response"]))
        # No prompt: the model is loaded, nothing generated.
        s, r = self.srv.post("/api/generate", {"model": self.model})
        self.assertEqual((s, r["done"], r["done_reason"], r["response"]), (200, True, "load", ""), r)

    def test_errors_are_ollama_errors(self):
        msgs = [{"role": "user", "content": "hi"}]
        for body, field in [({"messages": msgs, "format": "yaml"}, "format"),
                            ({"messages": msgs, "format": {"type": "string", "pattern": "x"}}, "format"),
                            ({"messages": msgs, "tools": [{"type": "function"}]}, "tools"),
                            ({"messages": msgs, "keep_alive": "5m"}, "keep_alive"),
                            ({"messages": msgs, "options": {"mirostat": 2}}, "options.mirostat"),
                            ({"messages": msgs, "options": {"num_ctx": 100000}}, "options.num_ctx"),
                            ({"messages": msgs, "options": {"temperature": "hot"}}, "options.temperature"),
                            ({"messages": msgs, "options": {"num_predict": 100000}}, "options.num_predict"),
                            ({"messages": msgs, "options": {"num_predict": 0}}, "options.num_predict"),
                            ({"messages": [{"role": "user", "content": "hi", "images": ["aGk="]}]},
                             "messages[0].images"),
                            ({"messages": msgs, "prompt": "x"}, "prompt")]:
            with self.subTest(field=field):
                s, r = self.srv.post("/api/chat", {**body, "stream": False})
                self.assertEqual(s, 400, r)
                self.assertIsInstance(r["error"], str)
                self.assertIn(field, r["error"])
        s, r = self.srv.post("/api/chat", raw="{not json")
        self.assertEqual(s, 400)
        self.assertIsInstance(r["error"], str)
        # keep_alive: the -m model never unloads, so only "forever" (or nothing) is accepted.
        s, r = self.srv.post("/api/chat", {"messages": msgs, "stream": False, "keep_alive": 0})
        self.assertEqual(s, 400, r)
        self.assertIn("keep_alive: 0 s is not supported", r["error"])
        s, r = self.srv.post("/api/chat", {"messages": msgs, "stream": False, "keep_alive": "5 parsecs"})
        self.assertEqual(s, 400, r)
        self.assertIn("keep_alive", r["error"])
        for forever in (-1, "-1m"):
            s, r = self.srv.post("/api/chat", {"messages": msgs, "stream": False, "keep_alive": forever,
                                               "options": {"num_predict": 2}})
            self.assertEqual((s, r.get("eval_count")), (200, 2), r)
        # Allowed: a context within the server's, mirostat off.
        s, r = self.srv.post("/api/chat", {"messages": msgs, "stream": False,
                                           "options": {"num_ctx": 512, "mirostat": 0, "num_predict": 2}})
        self.assertEqual((s, r.get("eval_count")), (200, 2), r)


    def test_show_and_ps(self):
        s, r = self.srv.post("/api/show", {"model": self.model})
        self.assertEqual(s, 200, r)
        self.assertEqual((r["details"]["format"], r["details"]["family"]), ("gguf", "llama"))
        self.assertEqual(r["model_info"]["general.architecture"], "llama")
        self.assertIn("llama.block_count", r["model_info"])
        self.assertGreater(r["model_info"]["general.parameter_count"], 0)
        self.assertIsNone(r["model_info"]["tokenizer.ggml.tokens"])  # arrays: null, as Ollama without verbose
        self.assertNotIn("tokenizer.chat_template", r["model_info"])
        # The built-in Mistral v0.1 template shows no tools: fitllm gives them in a system prompt.
        self.assertEqual(r["capabilities"], ["completion", "tools"])
        self.assertIsInstance(r["template"], str)
        self.assertGreater(len(r["template"]), 0)
        s, r2 = self.srv.post("/api/show", {"name": self.model + ":latest"})  # the old field name
        self.assertEqual((s, r2["details"]), (200, r["details"]))
        s, r = self.srv.post("/api/show", {})
        self.assertEqual(s, 400, r)
        self.assertIn("model", r["error"])
        s, r = self.srv.get("/api/ps")  # the -m model: loaded at start, never unloaded
        self.assertEqual(s, 200, r)
        [m] = r["models"]
        self.assertEqual((m["name"], m["model"], m["size_vram"], m["details"]["family"]), (self.model, self.model, 0,
                                                                                          "llama"))
        self.assertGreater(m["size"], 0)
        self.assertTrue(m["expires_at"].startswith("2318-"), m)


class ModelNames(unittest.TestCase):
    """-m answers to any model name unless --strict-model-names; --alias sets its id."""

    def test_any_name_and_alias(self):
        srv = Server("-m", TINY_QWEN, "-c", "256", "--alias", "my-model")
        try:
            self.assertEqual([m.id for m in srv.client().models.list().data], ["my-model"])
            for name in ("gpt-4o-mini", "my-model", "tiny-qwen2-q8_0"):
                r = srv.client().chat.completions.create(model=name, max_tokens=2,
                                                         messages=[{"role": "user", "content": "hi"}])
                self.assertEqual((r.model, r.usage.completion_tokens), ("my-model", 2))
            s, r = srv.post("/tokenize", {"content": "hi", "model": "llama3"})
            self.assertEqual(s, 200, r)
        finally:
            srv.stop()

    def test_strict_model_names(self):
        srv = Server("-m", TINY_QWEN, "-c", "256", "--alias", "my-model", "--strict-model-names")
        try:
            r = srv.client().completions.create(model="my-model", prompt="hi", max_tokens=2)
            self.assertEqual(r.model, "my-model")
            s, r = srv.post("/v1/completions", {"prompt": "hi", "max_tokens": 2})  # no name: the one model
            self.assertEqual((s, r["model"]), (200, "my-model"))
            for name in ("gpt-4o-mini", "tiny-qwen2-q8_0"):  # the file's name is not the id any more
                msg = assert_error(self, srv.post("/v1/completions", {"model": name, "prompt": "hi"}), 404,
                                   "model_not_found")
                self.assertIn(name, msg)
                self.assertIn("my-model", msg)
            with self.assertRaises(openai.NotFoundError):
                srv.client().chat.completions.create(model="nope", messages=[{"role": "user", "content": "hi"}])
        finally:
            srv.stop()

    def test_alias_needs_one_model(self):
        proc = subprocess.run([FITLLM, "serve", "--port", "0", "--models-dir", DATA, "--alias", "x"],
                              capture_output=True, text=True, timeout=30)
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn("--alias", proc.stderr)


class WholeAnswerStatus(unittest.TestCase):
    def test_a_failure_after_the_start_is_the_answers_status(self):
        # A whole answer is sent when its job ends, with the status it ends with: generation that
        # fails once it runs (here the budget refuses the answer's growing text) is an error
        # status with an error body, not 200 with an error inside. The tiny Llama's longest token
        # forced (+100): 2000 tokens of 12 bytes; the budget leaves 16 KiB beside the model and
        # one connection, enough for the request's JSON but not for the answer.
        body = {"prompt": "Once upon a time", "max_tokens": 2000, "temperature": 0}
        srv = Server("-m", TINY_LLAMA, "-c", "2048", "-np", "1")
        try:
            pieces = [srv.post("/detokenize", {"tokens": [i]})[1]["content"] for i in range(450)]
            longest = max(range(len(pieces)), key=lambda i: len(pieces[i].encode()))
            body["logit_bias"] = {str(longest): 100}
            s, r = srv.post("/v1/completions", body)
            self.assertEqual((s, r["usage"]["completion_tokens"]), (200, 2000), r)
            whole = r["choices"][0]["text"]
            self.assertGreater(len(whole.encode()), 20000)
            plan = srv.get("/v1/memory")[1]["models"][0]["plan"]["total"]
        finally:
            srv.stop()
        srv = Server("-m", TINY_LLAMA, "-c", "2048", "-np", "1", "--mem", str(plan + 32768 + 16384))
        try:
            for _ in range(50):  # until the readiness checks' connections are gone (room for one only)
                time.sleep(0.1)
                conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)
                conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
                r = conn.getresponse()
                raw = r.read().decode()
                conn.close()
                err = json.loads(raw)["error"]
                if "another connection" not in err["message"]:
                    break
            self.assertEqual((r.status, err["code"], err["type"]), (503, "over_budget", "server_busy"), raw)
            self.assertIn("the answer's text grew to", err["message"])
            self.assertEqual(r.getheader("Retry-After"), "1")
            self.assertEqual(int(r.getheader("Content-Length")), len(raw.encode()))
            time.sleep(0.3)
            # The server goes on; streamed, the same request holds no text and ends as it should.
            s, r = srv.post("/v1/completions", {"prompt": "hi", "max_tokens": 4})
            self.assertEqual((s, r["usage"]["completion_tokens"]), (200, 4), r)
            time.sleep(0.3)
            with srv.client() as client:
                text = "".join(ch.choices[0].text for ch in client.completions.create(model="x", stream=True, **body)
                               if ch.choices)
            self.assertEqual(text, whole)
            time.sleep(0.3)
            self.assertEqual(srv.metric("fitllm_slots_busy"), 0)
        finally:
            srv.stop()


class Preemption(unittest.TestCase):
    def test_kv_pressure_preempts_and_resumes(self):
        # 2 slots sharing 96 KV cells: two requests of ~15 + 60 tokens cannot both keep their cells;
        # the younger is preempted, recomputed when room returns, and ends as it would alone.
        srv = Server("-m", TINY_LLAMA, "-np", "2", "-c", "96")
        try:
            prompts = ["Once upon a time", "The quick brown"]
            ask = lambda client, p: client.completions.create(model="tiny-llama-q8_0", prompt=p, max_tokens=60,
                                                              temperature=0).choices[0].text
            alone = [ask(srv.client(), p) for p in prompts]
            # The tiny model is fast: try until the two requests overlap (on a loaded machine a
            # thread may start late and find the other one done), both sent past one barrier.
            for _ in range(20):
                together = [None, None]
                barrier = threading.Barrier(2)

                def send(i):
                    client = srv.client()
                    barrier.wait()
                    together[i] = ask(client, prompts[i])

                threads = [threading.Thread(target=send, args=(i, )) for i in (0, 1)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                self.assertEqual(together, alone)
                if srv.metric("fitllm_preemptions_total") > 0:
                    break
            self.assertGreater(srv.metric("fitllm_preemptions_total"), 0)
        finally:
            srv.stop()


class ApiKey(unittest.TestCase):
    def test_api_key(self):
        srv = Server("-m", TINY_QWEN, "--api-key", "sekrit", "-c", "256")
        try:
            self.assertEqual(srv.get("/health")[0], 200)
            assert_error(self, srv.get("/v1/models"), 401, "invalid_api_key")
            assert_error(self, srv.get("/v1/models", headers={"Authorization": "Bearer wrong"}), 401)
            with self.assertRaises(openai.AuthenticationError):
                srv.client("wrong").models.list()
            r = srv.client("sekrit").completions.create(model="tiny-qwen2-q8_0", prompt="hi", max_tokens=2)
            self.assertEqual(r.usage.completion_tokens, 2)
        finally:
            srv.stop()


class Fit(unittest.TestCase):
    def test_fit_quantizes_the_kv_cache_where_the_plan_does_not_fit(self):
        # The f16 plan of -c 8192, then a budget it does not fit but a q8_0 KV cache does.
        srv = Server("-m", TINY_LLAMA, "-c", "8192", "-np", "1")
        try:
            plan = srv.get("/v1/memory")[1]["models"][0]["plan"]
        finally:
            srv.stop()
        budget = plan["total"] - plan["kv"] // 4
        # Without --fit the model is refused at start and the server ends with an error.
        proc = subprocess.run([FITLLM, "serve", "--port", "0", "-t", "2", "-m", TINY_LLAMA, "-c", "8192", "-np", "1",
                               "--mem", str(budget)], capture_output=True, text=True, timeout=30)
        self.assertEqual(proc.returncode, 1, proc.stderr)
        self.assertIn("but the memory budget is", proc.stderr)
        srv = Server("-m", TINY_LLAMA, "-c", "8192", "-np", "1", "--mem", str(budget), "--fit")
        try:
            deadline = time.time() + 10  # stderr is read by a thread
            while "ready" not in "".join(srv.log) and time.time() < deadline:
                time.sleep(0.05)
            self.assertIn("KV cache f16/f16 -> q8_0/q8_0", "".join(srv.log))
            r = srv.client().completions.create(model="tiny-llama-q8_0", prompt="hi", max_tokens=4)
            self.assertEqual(r.usage.completion_tokens, 4)
            _, mem = srv.get("/v1/memory")
            fitted = mem["models"][0]["plan"]
            self.assertLess(fitted["kv"], plan["kv"])
            self.assertLessEqual(fitted["total"], budget)
            self.assertLessEqual(mem["devices"][0]["peak"], budget)
        finally:
            srv.stop()


class ModelsDir(unittest.TestCase):
    """--models-dir: several models, JIT load, TTL unload, eviction and refusal under --mem."""

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="fitllm-models-")
        for src in (TINY_LLAMA, TINY_QWEN):
            os.symlink(src, os.path.join(cls.dir, os.path.basename(src)))
        if os.path.exists(DEMO):
            os.symlink(DEMO, os.path.join(cls.dir, "gemma.gguf"))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir)

    def loaded(self, srv):
        return {m["id"]: m["loaded"] for m in srv.get("/v1/models")[1]["data"]}

    def test_jit_load_and_ttl_unload(self):
        srv = Server("--models-dir", self.dir, "--ttl", "1", "-c", "256")
        try:
            self.assertEqual(self.loaded(srv)["tiny-llama-q8_0"], False)
            c = srv.client()
            a = c.completions.create(model="tiny-llama-q8_0", prompt="hi", max_tokens=3)
            b = c.completions.create(model="tiny-qwen2-q8_0", prompt="hi", max_tokens=3)
            self.assertEqual((a.model, b.model), ("tiny-llama-q8_0", "tiny-qwen2-q8_0"))
            state = self.loaded(srv)
            self.assertTrue(state["tiny-llama-q8_0"] and state["tiny-qwen2-q8_0"])
            assert_error(self, srv.post("/v1/completions", {"prompt": "x"}), 400, "model_required")
            # Several models: a name none of them has is refused.
            msg = assert_error(self, srv.post("/v1/completions", {"model": "gpt-4o-mini", "prompt": "x"}), 404,
                               "model_not_found")
            self.assertIn("gpt-4o-mini", msg)
            deadline = time.time() + 6
            while any(self.loaded(srv).values()):
                self.assertLess(time.time(), deadline, "models still loaded after the TTL")
                time.sleep(0.1)
            self.assertEqual(srv.metric("fitllm_model_unloads_total"), 2)
            _, mem = srv.get("/v1/memory")
            requests = {p["name"]: p["used"] for p in mem["devices"][0]["pools"]}["requests"]
            self.assertEqual(mem["devices"][0]["used"] - requests, 0)  # only this request's connection
        finally:
            srv.stop()

    def test_budget_refusal_and_eviction(self):
        # Learn each tiny model's plan, then give a budget that holds the larger one but not both.
        srv = Server("--models-dir", self.dir, "-c", "256")
        try:
            totals = {}
            for m in ("tiny-llama-q8_0", "tiny-qwen2-q8_0"):
                srv.client().completions.create(model=m, prompt="hi", max_tokens=1)
            for m in srv.get("/v1/memory")[1]["models"]:
                if m["loaded"]:
                    totals[m["id"]] = m["plan"]["total"]
        finally:
            srv.stop()
        budget = max(totals.values()) + min(totals.values()) // 2
        srv = Server("--models-dir", self.dir, "-c", "256", "--mem", str(budget), "--ttl", "0")
        try:
            c = srv.client()
            c.completions.create(model="tiny-llama-q8_0", prompt="hi", max_tokens=1)
            c.completions.create(model="tiny-qwen2-q8_0", prompt="hi", max_tokens=1)  # evicts the idle llama
            state = self.loaded(srv)
            self.assertEqual((state["tiny-llama-q8_0"], state["tiny-qwen2-q8_0"]), (False, True))
            _, mem = srv.get("/v1/memory")
            self.assertLessEqual(mem["devices"][0]["peak"], budget)
            if "gemma" in state:
                msg = assert_error(self, srv.post("/v1/completions", {"model": "gemma", "prompt": "hi"}), 507,
                                   "model_too_large")
                self.assertIn("budget", msg)
                self.assertIn("MiB", msg)
            # Still serving.
            c.completions.create(model="tiny-llama-q8_0", prompt="hi", max_tokens=1)
        finally:
            srv.stop()


@unittest.skipUnless(ollama is not None, "the Python package 'ollama' is not installed (pip install -r requirements.txt)")
@unittest.skipUnless(os.path.exists(DEMO), "the demo model is not in models/ (scripts/setup.sh assembles it)")
class OllamaClient(unittest.TestCase):
    """PyPI's ollama client against the demo model, served from a --models-dir (so that it loads,
    shows in /api/ps and unloads as keep_alive says)."""

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="fitllm-ollama-")
        os.symlink(DEMO, os.path.join(cls.dir, "gemma.gguf"))
        cls.srv = Server("--models-dir", cls.dir, "-c", "512", "--ttl", "300")
        cls.ol = ollama.Client(host=cls.srv.base, timeout=120)

    @classmethod
    def tearDownClass(cls):
        cls.srv.stop()
        shutil.rmtree(cls.dir)

    def ps(self):
        return {m.model: m for m in self.ol.ps().models}

    def test_chat_whole_and_streamed_as_openai(self):
        msgs = [{"role": "user", "content": "What is the capital of France?"}]
        ref = self.srv.client().chat.completions.create(model="gemma", messages=msgs, max_tokens=16, temperature=0)
        text = ref.choices[0].message.content
        self.assertGreater(len(text), 0)
        r = self.ol.chat(model="gemma:latest", messages=msgs, options={"temperature": 0, "num_predict": 16})
        self.assertEqual((r.message.role, r.message.content), ("assistant", text))
        self.assertEqual((r.done, r.prompt_eval_count, r.eval_count), (True, ref.usage.prompt_tokens,
                                                                     ref.usage.completion_tokens))
        parts = list(self.ol.chat(model="gemma", messages=msgs, stream=True,
                                  options={"temperature": 0, "num_predict": 16}))
        self.assertGreater(len(parts), 2)
        self.assertTrue(all(not p.done for p in parts[:-1]) and parts[-1].done)
        self.assertEqual("".join(p.message.content for p in parts), text)

    def test_generate_as_openai(self):
        prompt = "Write one word: the colour of the sky."
        ref = self.srv.client().chat.completions.create(
            model="gemma", messages=[{"role": "user", "content": prompt}], max_tokens=12, temperature=0)
        r = self.ol.generate(model="gemma", prompt=prompt, options={"temperature": 0, "num_predict": 12})
        self.assertEqual((r.response, r.done), (ref.choices[0].message.content, True))
        raw = self.srv.client().completions.create(model="gemma", prompt="Once upon a time", max_tokens=10,
                                                    temperature=0)
        parts = list(self.ol.generate(model="gemma", prompt="Once upon a time", raw=True, stream=True,
                                      options={"temperature": 0, "num_predict": 10}))
        self.assertEqual("".join(p.response for p in parts), raw.choices[0].text)
        self.assertEqual(parts[-1].eval_count, 10)

    def test_list_and_show(self):
        [m] = self.ol.list().models
        self.assertEqual((m.model, m.size, m.details.format), ("gemma", os.path.getsize(DEMO), "gguf"))
        s = self.ol.show("gemma")
        self.assertEqual((s.details.format, s.details.family, s.details.quantization_level),
                         ("gguf", "gemma3", "Q4_K_M"))
        self.assertRegex(s.details.parameter_size, r"^2\d\d\.\d\dM$")  # gemma-3-270m: about 268M
        self.assertEqual(s.modelinfo["general.architecture"], "gemma3")
        self.assertEqual(s.modelinfo["gemma3.block_count"], 18)
        self.assertEqual(s.modelinfo["gemma3.embedding_length"], 640)
        self.assertIn("gemma3.context_length", s.modelinfo)
        self.assertIn("<start_of_turn>", s.template)
        with self.assertRaises(ollama.ResponseError) as e:
            self.ol.show("no-such-model")
        self.assertEqual(e.exception.status_code, 404)
        self.assertIn("no-such-model", e.exception.error)

    def test_ps_and_keep_alive(self):
        msgs = [{"role": "user", "content": "hi"}]
        self.ol.chat(model="gemma", messages=msgs, options={"num_predict": 2})  # the server's --ttl 300
        m = self.ps()["gemma"]
        self.assertEqual((m.name, m.size_vram, m.details.family, m.context_length), ("gemma", 0, "gemma3", 512))
        self.assertGreater(m.size, os.path.getsize(DEMO) // 2)
        left = (m.expires_at - datetime.datetime.now(datetime.timezone.utc)).total_seconds()
        self.assertTrue(280 < left <= 300, left)
        self.ol.chat(model="gemma", messages=msgs, options={"num_predict": 2}, keep_alive="10m")
        left = (self.ps()["gemma"].expires_at - datetime.datetime.now(datetime.timezone.utc)).total_seconds()
        self.assertTrue(580 < left <= 600, left)
        self.ol.generate(model="gemma", prompt="hi", options={"num_predict": 2}, keep_alive=-1)
        self.assertEqual(self.ps()["gemma"].expires_at.year, 2318)  # never
        with self.assertRaises(ollama.ResponseError) as e:
            self.ol.chat(model="gemma", messages=msgs, keep_alive="5 parsecs")
        self.assertEqual(e.exception.status_code, 400)
        self.assertIn("keep_alive", e.exception.error)
        # keep_alive 0: unloaded as soon as the request is done; a later request loads it again.
        self.ol.chat(model="gemma", messages=msgs, options={"num_predict": 2}, keep_alive=0)
        deadline = time.time() + 5
        while "gemma" in self.ps():
            self.assertLess(time.time(), deadline, "still loaded after keep_alive 0")
            time.sleep(0.05)
        r = self.ol.generate(model="gemma", prompt="hi", options={"num_predict": 2}, keep_alive="1.5s")
        self.assertEqual(r.eval_count, 2)
        self.assertIn("gemma", self.ps())
        deadline = time.time() + 6
        while "gemma" in self.ps():
            self.assertLess(time.time(), deadline, "still loaded 1.5 s after its last request")
            time.sleep(0.25)
        # Ollama's way to unload a model (`ollama stop`): a generate without a prompt, keep_alive 0.
        self.ol.generate(model="gemma", prompt="hi", options={"num_predict": 1})
        r = self.ol.generate(model="gemma", keep_alive=0)
        self.assertEqual((r.done, r.done_reason), (True, "unload"))
        deadline = time.time() + 5
        while "gemma" in self.ps():
            self.assertLess(time.time(), deadline, "still loaded after an unload request")
            time.sleep(0.05)


@unittest.skipUnless(ollama is not None, "the Python package 'ollama' is not installed (pip install -r requirements.txt)")
class OllamaManage(unittest.TestCase):
    """PyPI's ollama client managing a --models-dir of the tiny models: copy, create (from a model
    or a GGUF path, with a system prompt and parameters), delete, list; pull and push refused as
    fitllm downloads and uploads nothing."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="fitllm-manage-")
        shutil.copy(TINY_LLAMA, os.path.join(self.dir, "tiny.gguf"))
        self.srv = Server("--models-dir", self.dir, "-c", "256", "--ttl", "300")
        self.ol = ollama.Client(host=self.srv.base, timeout=60)

    def tearDown(self):
        self.srv.stop()
        shutil.rmtree(self.dir)

    def names(self):
        return sorted(m.model for m in self.ol.list().models)

    def test_copy_create_delete_list(self):
        self.assertEqual(self.ol.copy("tiny:latest", "other:v1").status, "success")
        self.assertEqual(self.names(), ["other:v1", "tiny"])
        self.assertEqual(os.stat(os.path.join(self.dir, "tiny.gguf")).st_nlink, 2)  # a hard link
        r = self.ol.chat(model="other:v1", messages=[{"role": "user", "content": "hi"}], options={"num_predict": 2})
        self.assertEqual(r.eval_count, 2)
        # Create from a GGUF path, streamed as Ollama streams it, with a system prompt and parameters.
        parts = list(self.ol.create(model="brief", from_=TINY_QWEN, system="Answer in one word.",
                                    parameters={"num_predict": 3, "temperature": 0}, stream=True))
        self.assertEqual([p.status for p in parts][-1], "success")
        self.assertIn("reading model metadata", [p.status for p in parts])
        self.assertEqual(self.names(), ["brief", "other:v1", "tiny"])
        r = self.ol.chat(model="brief", messages=[{"role": "user", "content": "hi"}])
        self.assertEqual(r.eval_count, 3)  # the model's num_predict
        plain = self.srv.client().chat.completions.create(
            model="brief", max_tokens=3, temperature=0,
            messages=[{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": "hi"}])
        self.assertEqual((r.message.content, r.prompt_eval_count), (plain.choices[0].message.content,
                                                                    plain.usage.prompt_tokens))
        s = self.ol.show("brief")
        self.assertIn('SYSTEM """Answer in one word."""', s.modelfile)
        self.assertIn("num_predict", s.parameters)
        # From a model here, not streamed; its settings come along, the request's override them.
        self.assertEqual(self.ol.create(model="brief:two", from_="brief", parameters={"num_predict": 1}).status,
                         "success")
        r = self.ol.generate(model="brief:two", prompt="hi")
        self.assertEqual(r.eval_count, 1)
        with self.assertRaises(ollama.ResponseError) as e:
            self.ol.create(model="x", from_="brief", template="{{ .Prompt }}")
        self.assertEqual(e.exception.status_code, 400)
        self.assertIn("template", e.exception.error)
        with self.assertRaises(ollama.ResponseError) as e:
            self.ol.create(model="../x", from_="tiny")
        self.assertEqual(e.exception.status_code, 400)
        self.assertIn("'../x'", e.exception.error)
        with self.assertRaises(ollama.ResponseError) as e:
            self.ol.create(model="x", from_="/no/such/file.gguf")
        self.assertEqual(e.exception.status_code, 404)
        self.assertFalse(os.path.exists(os.path.join(os.path.dirname(self.dir), "x.gguf")))
        # Delete: the name goes, the file's other name stays; unknown names are 404.
        self.assertEqual(self.ol.delete("tiny").status, "success")
        self.assertEqual(self.names(), ["brief", "brief:two", "other:v1"])
        self.assertTrue(os.path.exists(TINY_QWEN))  # created from a path: the source is untouched
        self.assertEqual(self.ol.delete("brief").status, "success")
        self.assertTrue(os.path.exists(TINY_QWEN))
        with self.assertRaises(ollama.ResponseError) as e:
            self.ol.delete("tiny")
        self.assertEqual(e.exception.status_code, 404)
        r = self.ol.generate(model="other:v1", prompt="hi", options={"num_predict": 2})
        self.assertEqual(r.eval_count, 2)

    def test_pull_and_push(self):
        self.assertEqual(self.ol.pull("tiny").status, "success")  # here: up to date
        self.assertEqual([p.status for p in self.ol.pull("tiny:latest", stream=True)], ["success"])
        with self.assertRaises(ollama.ResponseError) as e:
            self.ol.pull("llama3.2")
        self.assertEqual(e.exception.status_code, 404)
        self.assertIn("downloads no models", e.exception.error)
        self.assertIn(os.path.join(self.dir, "llama3.2.gguf"), e.exception.error)
        with self.assertRaises(ollama.ResponseError) as e:
            self.ol.push("tiny")
        self.assertEqual(e.exception.status_code, 501)
        self.assertIn("uploads no models", e.exception.error)


@unittest.skipUnless(os.path.exists(DEMO), "the demo model is not in models/ (scripts/setup.sh assembles it)")
class PromptCache(unittest.TestCase):
    """A conversation's next turn starts from the cells its last turn left (--cache-prompts, on by
    default), and answers what a server without the cache answers. One token per forward pass
    (-b 1) in both, so that the cached cells hold the very bits a recomputation gives (with longer
    passes the kernels' sums run in another order, and a random model's near-ties may go the other
    way)."""

    def test_turns_reuse_the_conversation_so_far(self):
        cached = Server("-m", TINY_LLAMA, "-np", "1", "-b", "1", "-c", "1024")
        plain = Server("-m", TINY_LLAMA, "-np", "1", "-b", "1", "-c", "1024", "--cache-prompts", "0")
        try:
            histories = {"cached": [], "plain": []}
            for turn in range(3):
                answers = {}
                for name, srv in (("cached", cached), ("plain", plain)):
                    msgs = histories[name]
                    msgs.append({"role": "user", "content": f"Tell me more, part {turn}"})
                    r = srv.client().chat.completions.create(model="tiny-llama-q8_0", messages=msgs, max_tokens=16,
                                                             temperature=0)
                    answers[name] = r
                    msgs.append({"role": "assistant", "content": r.choices[0].message.content})
                self.assertEqual(answers["cached"].choices[0].message.content,
                                 answers["plain"].choices[0].message.content, f"turn {turn}")
                self.assertEqual(answers["plain"].usage.prompt_tokens_details.cached_tokens, 0)
                got = answers["cached"].usage.prompt_tokens_details.cached_tokens
                if turn > 0:
                    # At least the previous turn's prompt: the answer's text, tokenized again, may part
                    # from the tokens the random model sampled anywhere.
                    self.assertGreaterEqual(got, previous_prompt, f"turn {turn}")
                self.assertLess(got, answers["cached"].usage.prompt_tokens)
                previous_prompt = answers["cached"].usage.prompt_tokens
            self.assertGreaterEqual(cached.metric("fitllm_prompt_cache_hits_total"), 2)
            self.assertGreater(cached.metric("fitllm_prompt_tokens_cached_total"), 0)
            self.assertGreaterEqual(cached.metric("fitllm_prompt_cache_prompts"), 1)
            self.assertEqual(plain.metric("fitllm_prompt_cache_hits_total"), 0)
            s, mem = cached.get("/v1/memory")
            self.assertEqual(s, 200)
            self.assertGreaterEqual(mem["models"][0]["cached_prompts"], 1)
        finally:
            cached.stop()
            plain.stop()


    def test_evicted_prompts_come_back_from_host_memory(self):
        # One kept prompt in the KV cache: the second conversation pushes the first out into host
        # memory (--cache-ram), and the first's next turn takes it from there.
        srv = Server("-m", TINY_LLAMA, "-np", "1", "-b", "1", "-c", "1024", "--cache-prompts", "1", "--cache-ram", "8M")
        try:
            first = [{"role": "user", "content": "Tell me about the sea"}]
            r = srv.client().chat.completions.create(model="x", messages=first, max_tokens=8, temperature=0)
            srv.client().chat.completions.create(model="x", messages=[{"role": "user", "content": "Something else"}],
                                                 max_tokens=8, temperature=0)
            # The scheduler keeps (and so evicts) a prompt in the step after its answer went out.
            deadline = time.monotonic() + 10
            while srv.metric("fitllm_prompt_cache_ram_prompts") != 1 and time.monotonic() < deadline:
                time.sleep(0.02)
            self.assertEqual(srv.metric("fitllm_prompt_cache_ram_prompts"), 1)
            self.assertGreater(srv.metric("fitllm_prompt_cache_ram_bytes"), 0)
            first += [{"role": "assistant", "content": r.choices[0].message.content},
                      {"role": "user", "content": "And more"}]
            again = srv.client().chat.completions.create(model="x", messages=first, max_tokens=8, temperature=0)
            self.assertGreaterEqual(again.usage.prompt_tokens_details.cached_tokens, r.usage.prompt_tokens)
            self.assertEqual(srv.metric("fitllm_prompt_cache_restores_total"), 1)
            s, mem = srv.get("/v1/memory")
            self.assertEqual(mem["models"][0]["plan"]["prompt_cache"], 8 << 20)
        finally:
            srv.stop()

    def test_cache_dir_outlives_the_server_and_its_leftovers_go(self):
        # --cache-dir: a restart answers the next turn from the files. What a killed server left
        # (a temporary file of a write cut short) is removed at the start, a broken file skipped,
        # each named in the log; a rotated quantized K's files (and its K transform's) work the same.
        d = tempfile.mkdtemp(prefix="fitllm-cache-dir-")
        try:
            dead = os.path.join(d, "prompt-00000000deadbeef-1.fitllm-prompt.tmp")
            with open(dead, "wb") as f:
                f.write(b"FITLLMKV" + b"\0" * 100)
            os.utime(dead, (time.time() - 3600, time.time() - 3600))
            broken = os.path.join(d, "prompt-00000000deadbeef-2.fitllm-prompt")
            with open(broken, "wb") as f:
                f.write(b"\x01" * 200)
            flags = ("-m", TINY_LLAMA, "-np", "1", "-b", "1", "-c", "1024", "--cache-prompts", "1",
                     "--cache-ram", "8M", "--cache-disk", "64M", "--cache-dir", d)
            msgs = [{"role": "user", "content": "Tell me about the sea"}]
            srv = Server(*flags)
            try:
                deadline = time.monotonic() + 10  # the log is read by a thread of its own
                while broken + ": skipped" not in "".join(srv.log) and time.monotonic() < deadline:
                    time.sleep(0.02)
                log = "".join(srv.log)
                self.assertIn(dead + ": removed, a temporary file of a write that did not finish", log)
                self.assertIn(broken + ": skipped, not a fitllm prompt file", log)
                self.assertFalse(os.path.exists(dead))
                self.assertTrue(os.path.exists(broken))  # not this server's to delete
                self.assertEqual(srv.metric("fitllm_prompt_cache_disk_corrupt_total"), 1)
                r = srv.client().chat.completions.create(model="x", messages=msgs, max_tokens=8, temperature=0)
            finally:
                srv.stop()
            files = [f for f in os.listdir(d) if f.endswith(".fitllm-prompt") and f != os.path.basename(broken)]
            self.assertEqual(len(files), 1, os.listdir(d))  # written when the server stopped
            msgs += [{"role": "assistant", "content": r.choices[0].message.content},
                     {"role": "user", "content": "And more"}]
            srv = Server(*flags)
            try:
                again = srv.client().chat.completions.create(model="x", messages=msgs, max_tokens=8, temperature=0)
                self.assertGreaterEqual(again.usage.prompt_tokens_details.cached_tokens, r.usage.prompt_tokens)
                self.assertEqual(srv.metric("fitllm_prompt_cache_disk_loaded_total"), 1)
            finally:
                srv.stop()
            # A rotated quantized K: its K transform goes to a file beside the prompts, and the
            # restart reads it, so the next turn comes from the files too.
            shutil.rmtree(d)
            os.mkdir(d)
            quantized = (*flags, "-ctk", "q4_0", "-ctv", "q4_0")
            srv = Server(*quantized)
            try:
                r = srv.client().chat.completions.create(model="x", messages=msgs[:1], max_tokens=8, temperature=0)
            finally:
                srv.stop()
            self.assertEqual(len([f for f in os.listdir(d) if f.endswith(".fitllm-keys")]), 1, os.listdir(d))
            msgs = msgs[:1] + [{"role": "assistant", "content": r.choices[0].message.content},
                               {"role": "user", "content": "And more"}]
            srv = Server(*quantized)
            try:
                again = srv.client().chat.completions.create(model="x", messages=msgs, max_tokens=8, temperature=0)
                self.assertGreaterEqual(again.usage.prompt_tokens_details.cached_tokens, r.usage.prompt_tokens)
                self.assertEqual(srv.metric("fitllm_prompt_cache_disk_loaded_total"), 1)
            finally:
                srv.stop()
        finally:
            shutil.rmtree(d)


class DemoModel(unittest.TestCase):
    def test_chat_as_the_cli(self):
        # The reply through the chat template equals `fitllm chat`'s for the same message (greedy).
        message = "What is the capital of France?"
        cli = subprocess.run([FITLLM, "chat", "-m", DEMO, "--temp", "0", "-n", "24", "-c", "512", "-t", "2"],
                             input=message + "\n", capture_output=True, text=True, timeout=60)
        expected = cli.stdout.split("> ", 1)[1].rsplit("\n> ", 1)[0]
        srv = Server("-m", DEMO, "-c", "512", "-np", "2")
        try:
            r = srv.client().chat.completions.create(model="gemma-3-270m-q4_k_m",
                                                     messages=[{"role": "user", "content": message}], max_tokens=24,
                                                     temperature=0)
            self.assertEqual(r.choices[0].message.content, expected)
        finally:
            srv.stop()

    def test_forced_tool_call_on_a_template_without_tools(self):
        # Gemma 3's template shows no tools: they go into a system prompt, and tool_choice
        # "required" or a named function gets a whole call whose arguments follow the schema.
        if jsonschema is None:
            self.skipTest("needs jsonschema (pip install -r requirements.txt)")
        weather = {"type": "function", "function": {
            "name": "get_weather", "description": "The current weather in a city", "parameters": {
                "type": "object", "properties": {"city": {"type": "string", "maxLength": 40},
                                                 "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                "required": ["city", "unit"], "additionalProperties": False}}}
        srv = Server("-m", DEMO, "-c", "2048", "-np", "1")
        try:
            msgs = [{"role": "user", "content": "What is the weather in Paris, in celsius?"}]
            for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
                r = srv.client().chat.completions.create(model="x", messages=msgs, tools=[weather],
                                                         tool_choice=choice, parallel_tool_calls=False,
                                                         temperature=0, max_tokens=256)
                self.assertEqual(r.choices[0].finish_reason, "tool_calls", r)
                calls = r.choices[0].message.tool_calls
                self.assertEqual(len(calls), 1, r)
                self.assertEqual(calls[0].function.name, "get_weather")
                jsonschema.validate(json.loads(calls[0].function.arguments), weather["function"]["parameters"])
            # The call and its result back: the conversation renders (Gemma's roles alternate).
            msgs += [{"role": "assistant", "content": None, "tool_calls": [
                         {"id": calls[0].id, "type": "function", "function": {
                             "name": "get_weather", "arguments": calls[0].function.arguments}}]},
                     {"role": "tool", "tool_call_id": calls[0].id, "content": "18 C, sunny"}]
            r = srv.client().chat.completions.create(model="x", messages=msgs, tools=[weather], temperature=0,
                                                     max_tokens=16)
            self.assertIn(r.choices[0].finish_reason, ("stop", "length", "tool_calls"))
        finally:
            srv.stop()

    def test_whole_answer_client_gone_stops_generating(self):
        # A request that is not streamed, whose client goes away, stops generating and frees its
        # slot at once (the server notices the closed connection while the job runs). The demo
        # model, as the tiny ones would finish before anyone noticed.
        srv = Server("-m", DEMO, "-c", "512", "-np", "1")
        try:
            # A whole answer is one JSON body with its length, sent when the job ends.
            status, text = srv.request("POST", "/v1/completions", raw=json.dumps(
                {"prompt": "1, 2, 3, 4, 5,", "max_tokens": 40, "temperature": 0}))
            self.assertEqual(status, 200)
            self.assertTrue(isinstance(text, dict) and text["usage"]["completion_tokens"] == 40, text)
            conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)
            conn.request("POST", "/v1/completions", body=json.dumps({"prompt": "1, 2, 3,", "max_tokens": 40}))
            r = conn.getresponse()
            raw = r.read().decode()
            conn.close()
            self.assertEqual(int(r.getheader("Content-Length")), len(raw.encode()))
            self.assertTrue(raw.startswith("{") and json.loads(raw)["object"] == "text_completion", raw[:200])
            r = srv.client().chat.completions.create(model="gemma-3-270m-q4_k_m", max_tokens=40, temperature=0,
                                                     messages=[{"role": "user", "content": "Count to 50."}])
            self.assertEqual(r.usage.completion_tokens, 40)

            max_tokens = 480
            steps0 = srv.metric("fitllm_forward_steps_total")
            s = socket.create_connection(("127.0.0.1", srv.port))
            body = json.dumps({"prompt": "1, 2, 3, 4, 5,", "max_tokens": max_tokens, "temperature": 0})
            s.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                       f"Content-Length: {len(body)}\r\n\r\n{body}").encode())
            deadline = time.time() + 30
            while srv.metric("fitllm_forward_steps_total") < steps0 + 5:
                self.assertLess(time.time(), deadline, "the request does not run")
                time.sleep(0.02)
            self.assertEqual(srv.metric("fitllm_slots_busy"), 1)
            s.close()
            closed = time.time()
            while srv.metric("fitllm_slots_busy") != 0:
                self.assertLess(time.time(), closed + 2, "the slot is still busy 2 s after the client went away")
                time.sleep(0.02)
            steps = srv.metric("fitllm_forward_steps_total") - steps0  # one token each: the only request
            self.assertLess(steps, max_tokens / 4, f"{steps} tokens generated of {max_tokens}")
            r = srv.client().completions.create(model="gemma-3-270m-q4_k_m", prompt="hi", max_tokens=2)
            self.assertEqual(r.usage.completion_tokens, 2)
        finally:
            srv.stop()


try:
    import jsonschema
except ImportError:
    jsonschema = None
SCHEMAS = os.path.join(SOURCE, "tests", "server", "json_schemas.json")


class StructuredOutput(unittest.TestCase):
    """response_format (json_object, json_schema), grammar and Ollama's format: every answer of 24 JSON
    schemas parses and validates (jsonschema), on the tiny random model and on the demo model."""

    def check_schemas(self, srv, model, temperatures):
        if jsonschema is None:
            self.skipTest("the Python package 'jsonschema' is not installed (pip install -r requirements.txt)")
        with open(SCHEMAS) as f:
            schemas = json.load(f)
        self.assertGreaterEqual(len(schemas), 20)
        client = srv.client()
        n = 0
        for i, schema in enumerate(schemas):
            for temperature in temperatures:
                with self.subTest(schema=i, temperature=temperature):
                    r = client.chat.completions.create(
                        model=model, messages=[{"role": "user", "content": "Answer in JSON: " + json.dumps(schema)}],
                        max_tokens=400, temperature=temperature, seed=i + 1,
                        response_format={"type": "json_schema",
                                         "json_schema": {"name": f"s{i}", "schema": schema, "strict": True}})
                    text = r.choices[0].message.content
                    self.assertEqual(r.choices[0].finish_reason, "stop", text)
                    jsonschema.validate(json.loads(text), schema)
                    n += 1
        self.assertEqual(n, len(schemas) * len(temperatures))

    def test_schemas_on_the_random_model(self):
        srv = Server("-m", TINY_LLAMA, "-np", "2", "-c", "1024")
        try:
            self.check_schemas(srv, "tiny-llama-q8_0", [1.0, 1.5])
        finally:
            srv.stop()

    @unittest.skipUnless(os.path.exists(DEMO), "the demo model is not in models/ (scripts/setup.sh assembles it)")
    @unittest.skipIf(SANITIZED, "48 answers of the demo model take minutes under the sanitizers: the Release "
                     "suite runs them, and the random model's schemas run here")
    def test_schemas_on_the_demo_model(self):
        srv = Server("-m", DEMO, "-np", "2", "-c", "2048")
        try:
            self.check_schemas(srv, "gemma-3-270m-q4_k_m", [0.0, 0.8])
        finally:
            srv.stop()

    def test_json_object_grammar_format_and_errors(self):
        srv = Server("-m", TINY_LLAMA, "-np", "2", "-c", "1024")
        try:
            msgs = [{"role": "user", "content": "JSON please"}]
            client = srv.client()
            # json_object: any JSON object, streamed too.
            for seed in range(3):
                r = client.chat.completions.create(model="m", messages=msgs, max_tokens=300, seed=seed,
                                                   response_format={"type": "json_object"})
                if r.choices[0].finish_reason == "stop":
                    self.assertIsInstance(json.loads(r.choices[0].message.content), dict)
                else:  # cut by max_tokens: still a prefix of an object
                    self.assertTrue(r.choices[0].message.content.startswith("{"))
            schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 3}},
                      "required": ["n"], "additionalProperties": False}
            chunks = client.chat.completions.create(
                model="m", messages=msgs, max_tokens=100, stream=True, seed=4,
                response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": schema}})
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            self.assertIn(json.loads(text)["n"], (1, 2, 3))
            # Properties come in the schema's order, not sorted (required ones always there).
            ordered = {"type": "object", "properties": {"zeta": {"type": "boolean"}, "alpha": {"type": "null"},
                                                        "mid": {"enum": [1]}},
                       "required": ["zeta", "alpha", "mid"], "additionalProperties": False}
            r = client.chat.completions.create(model="m", messages=msgs, max_tokens=100, seed=5, response_format={
                "type": "json_schema", "json_schema": {"name": "o", "schema": ordered}})
            self.assertEqual(list(json.loads(r.choices[0].message.content)), ["zeta", "alpha", "mid"])
            s, r = srv.post("/api/chat", {"model": "m", "messages": msgs, "stream": False, "format": ordered})
            self.assertEqual(list(json.loads(r["message"]["content"])), ["zeta", "alpha", "mid"], r)
            # llama-server's grammar field, on /v1/completions too.
            r = client.completions.create(model="m", prompt="Pick:", max_tokens=20, seed=1,
                                          extra_body={"grammar": 'root ::= ("cat" | "dog") " " [0-9]{2}'})
            self.assertRegex(r.choices[0].text, r"^(cat|dog) [0-9]{2}$")
            self.assertEqual(r.choices[0].finish_reason, "stop")
            r = client.completions.create(model="m", prompt="x", max_tokens=50, seed=2,
                                          extra_body={"response_format": {"type": "json_schema", "json_schema": {
                                              "name": "b", "schema": {"type": "boolean"}}}})
            self.assertIn(r.choices[0].text, ("true", "false"))
            # Ollama's format: "json" or a schema, on /api/chat and /api/generate.
            s, r = srv.post("/api/chat", {"model": "m", "messages": msgs, "stream": False, "format": schema,
                                          "options": {"seed": 3}})
            self.assertEqual(s, 200, r)
            self.assertIn(json.loads(r["message"]["content"])["n"], (1, 2, 3))
            s, r = srv.post("/api/generate", {"model": "m", "prompt": "x", "stream": False, "format": "json",
                                              "options": {"seed": 1, "num_predict": 300}})
            self.assertEqual(s, 200, r)
            self.assertTrue(r["response"].startswith("{"), r)
            # Bad grammars and schemas: 400 naming the field, the line and column or the keyword's path.
            chat = "/v1/chat/completions"
            msg = assert_error(self, srv.post(chat, {"messages": msgs, "grammar": 'root ::= "a" b'}), 400,
                               "invalid_grammar", "grammar")
            self.assertIn("line 1, column 14: rule 'b' is not defined", msg)
            msg = assert_error(self, srv.post(chat, {"messages": msgs, "grammar": "root ::= root \"a\""}), 400,
                               "invalid_grammar", "grammar")
            self.assertIn("left-recursive", msg)
            msg = assert_error(self, srv.post(chat, {"messages": msgs, "response_format": {
                "type": "json_schema", "json_schema": {"name": "x", "schema": {
                    "type": "object", "properties": {"a": {"type": "number", "multipleOf": 2}}}}}}), 400,
                "unsupported_schema", "response_format.json_schema.schema")
            self.assertIn("$.properties.a.multipleOf", msg)
            assert_error(self, srv.post(chat, {"messages": msgs, "grammar": "root ::= \"a\"",
                                               "response_format": {"type": "json_object"}}), 400, "invalid_value",
                         "grammar")
            assert_error(self, srv.post(chat, {"messages": msgs, "grammar": 5}), 400, "invalid_type", "grammar")
            r = client.completions.create(model="m", prompt="hi", max_tokens=2)
            self.assertEqual(r.usage.completion_tokens, 2)
        finally:
            srv.stop()


class Choices(unittest.TestCase):
    """n choices a request: a sequence each, the prompt computed once (its cells shared)."""

    @classmethod
    def setUpClass(cls):
        cls.srv = Server("-m", TINY_LLAMA, "-np", "3", "-c", "1024")
        cls.model = "tiny-llama-q8_0"

    @classmethod
    def tearDownClass(cls):
        cls.srv.stop()

    def streamed(self, stream):
        """The texts, finish reasons and usage of a stream of choices, by index."""
        texts, reasons, usage = {}, {}, []
        for chunk in stream:
            if chunk.usage:
                usage.append(chunk.usage)
            for ch in chunk.choices:
                piece = ch.delta.content if hasattr(ch, "delta") else ch.text
                texts[ch.index] = texts.get(ch.index, "") + (piece or "")
                if ch.finish_reason:
                    self.assertNotIn(ch.index, reasons, "a second finish_reason")
                    reasons[ch.index] = ch.finish_reason
        self.assertEqual(len(usage), 1)
        return texts, reasons, usage[0]

    def test_three_choices_whole_and_streamed(self):
        c = self.srv.client()
        msgs = [{"role": "user", "content": "Tell me a story about three whole choices"}]
        one = c.chat.completions.create(model=self.model, messages=msgs, max_tokens=8, temperature=0)
        r = c.chat.completions.create(model=self.model, messages=msgs, max_tokens=8, temperature=0, n=3)
        self.assertEqual([ch.index for ch in r.choices], [0, 1, 2])
        for ch in r.choices:
            self.assertEqual(ch.message.content, one.choices[0].message.content)  # greedy: the same
            self.assertEqual(ch.finish_reason, "length")
        self.assertEqual(r.usage.prompt_tokens, one.usage.prompt_tokens)  # the prompt counted once
        self.assertEqual(r.usage.completion_tokens, 3 * 8)
        self.assertEqual(r.usage.total_tokens, one.usage.prompt_tokens + 24)
        texts, reasons, usage = self.streamed(c.chat.completions.create(
            model=self.model, messages=msgs, max_tokens=8, temperature=0, n=3, stream=True,
            stream_options={"include_usage": True}))
        self.assertEqual(texts, {i: one.choices[0].message.content for i in range(3)})
        self.assertEqual(reasons, {0: "length", 1: "length", 2: "length"})
        self.assertEqual((usage.prompt_tokens, usage.completion_tokens), (one.usage.prompt_tokens, 24))
        # Text completions too, with log probabilities per choice.
        w = c.completions.create(model=self.model, prompt="Three text choices", max_tokens=6, temperature=0, n=3,
                                 logprobs=1)
        self.assertEqual(len(w.choices), 3)
        self.assertEqual(len({ch.text for ch in w.choices}), 1)
        for ch in w.choices:
            self.assertEqual(len(ch.logprobs.token_logprobs), 6)
            self.assertEqual("".join(ch.logprobs.tokens), ch.text)
        texts, reasons, usage = self.streamed(c.completions.create(
            model=self.model, prompt="Three text choices", max_tokens=6, temperature=0, n=3, stream=True,
            stream_options={"include_usage": True}))
        self.assertEqual(texts, {i: w.choices[0].text for i in range(3)})
        self.assertEqual(usage.completion_tokens, 18)

    def test_seeded_choices_differ_and_each_is_its_seed(self):
        # Choice i samples with seed + i: it is what n=1 gives with that seed.
        c = self.srv.client()
        prompt = "Seeded choices differ"
        r = c.completions.create(model=self.model, prompt=prompt, max_tokens=12, temperature=1.0, seed=100, n=3)
        texts = [ch.text for ch in r.choices]
        self.assertEqual(len(set(texts)), 3, texts)
        for i in range(3):
            alone = c.completions.create(model=self.model, prompt=prompt, max_tokens=12, temperature=1.0, seed=100 + i)
            self.assertEqual(alone.choices[0].text, texts[i], f"choice {i}")
        again = c.completions.create(model=self.model, prompt=prompt, max_tokens=12, temperature=1.0, seed=100, n=3)
        self.assertEqual([ch.text for ch in again.choices], texts)

    def test_the_prompt_is_computed_once(self):
        # The other choices take all but the prompt's last token from the first one's cells.
        cached0 = self.srv.metric("fitllm_prompt_tokens_cached_total")
        prompt = "A prompt nobody sent before, long enough to tell computing it once from three times " * 3
        r = self.srv.client().completions.create(model=self.model, prompt=prompt, max_tokens=4, temperature=0, n=3)
        p = r.usage.prompt_tokens
        self.assertGreater(p, 40)
        first = r.usage.prompt_tokens_details.cached_tokens  # what earlier prompts gave the first (BOS, ...)
        self.assertLess(first, 10)
        deadline = time.time() + 5  # the scheduler's stats are published after the step
        while self.srv.metric("fitllm_prompt_tokens_cached_total") - cached0 < first + 2 * (p - 1):
            self.assertLess(time.time(), deadline, "the choices did not share the prompt's cells")
            time.sleep(0.02)
        self.assertEqual(self.srv.metric("fitllm_prompt_tokens_cached_total") - cached0, first + 2 * (p - 1))

    def test_n_over_the_slots_is_refused(self):
        msgs = [{"role": "user", "content": "hi"}]
        with self.assertRaises(openai.BadRequestError) as e:
            self.srv.client().chat.completions.create(model=self.model, messages=msgs, max_tokens=2, n=4)
        self.assertEqual(e.exception.body["param"], "n")
        self.assertIn("-np", e.exception.body["message"])
        assert_error(self, self.srv.post("/v1/completions", {"prompt": "hi", "n": 9}), 400, "invalid_value", "n")
        assert_error(self, self.srv.post("/v1/completions", {"prompt": "hi", "n": 0}), 400, "invalid_value", "n")
        assert_error(self, self.srv.post("/v1/completions", {"prompt": "hi", "n": "2"}), 400, "invalid_type", "n")

    def test_disconnect_cancels_every_choice(self):
        s = socket.create_connection(("127.0.0.1", self.srv.port))
        # End of text banned (the tiny model's id 2), so that no choice ends before the client goes
        # (greedy choices end at the same token, the later admitted ones later), and 3 x 300 tokens
        # fit the cache (no preemption).
        body = json.dumps({"prompt": "Once upon a time", "max_tokens": 300, "stream": True, "n": 3,
                           "temperature": 0, "logit_bias": {"2": -100}})
        s.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                   f"Content-Length: {len(body)}\r\n\r\n{body}").encode())
        got = b""
        while got.count(b'"index":2') < 2:
            got += s.recv(4096)
        deadline = time.time() + 5  # the metric follows the scheduler's steps
        while self.srv.metric("fitllm_slots_busy") != 3:
            self.assertLess(time.time(), deadline, "the three choices were not all running")
            time.sleep(0.01)
        s.close()
        deadline = time.time() + 5
        while self.srv.metric("fitllm_slots_busy") != 0:
            self.assertLess(time.time(), deadline, "slots still busy after the client went away")
            time.sleep(0.05)


# ctest runs the classes in groups, so that the groups run in parallel (tests/CMakeLists.txt): a
# named group runs its classes, "rest" every class no group names, no group name all of them.
GROUPS = {
    "ollama": ("Ollama", "OllamaClient", "ModelsDir", "OllamaManage"),
    "demo": ("DemoModel", "PromptCache", "StructuredOutput"),
}

if __name__ == "__main__":
    group = sys.argv[3] if len(sys.argv) > 3 else None
    cases = [c for c in globals().values() if isinstance(c, type) and issubclass(c, unittest.TestCase)]
    named = {name for names in GROUPS.values() for name in names}
    if group is not None and group != "rest" and group not in GROUPS:
        sys.exit(f"unknown group {group!r} (groups: {', '.join(GROUPS)}, rest)")
    if group == "rest":
        cases = [c for c in cases if c.__name__ not in named]
    elif group is not None:
        cases = [c for c in cases if c.__name__ in GROUPS[group]]
    suite = unittest.TestSuite(unittest.defaultTestLoader.loadTestsFromTestCase(c) for c in cases)
    result = unittest.TextTestRunner(verbosity=2).run(suite)
    sys.exit(0 if result.wasSuccessful() else 1)
