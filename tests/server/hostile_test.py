#!/usr/bin/env python3
"""Hostile input against a real `fitllm serve` on loopback (ctest: ServerHostile): every kind of
oversized request refused by its size before it costs memory or time, request memory inside the
budget and given back, slow clients cut at the whole-request deadline while /health and a chat
still answer, the connection caps, the Host / Origin checks and CORS, the API key, and an
error code of its own for every refusal. Short versions of bench/server_edges.py's runs.

Run: python3 tests/server/hostile_test.py BUILD_DIR/fitllm SOURCE_DIR
"""
import http.client
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import unittest

FITLLM = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else "build/fitllm"
SOURCE = os.path.abspath(sys.argv[2]) if len(sys.argv) > 2 else "."
TINY_LLAMA = os.path.join(SOURCE, "tests", "model", "data", "tiny-llama-q8_0.gguf")
MODEL = "tiny-llama-q8_0"


class Server:
    """fitllm serve on a free loopback port, stopped with SIGTERM."""

    def __init__(self, *args):
        self.proc = subprocess.Popen([FITLLM, "serve", "--port", "0", "-t", "2", "-m", TINY_LLAMA, *args],
                                     stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
        self.log = [self.proc.stderr.readline()]
        m = re.search(r"listening on http://[\d.]+:(\d+)", self.log[0])
        if not m:
            self.proc.kill()
            raise RuntimeError("fitllm serve did not start: " + self.log[0] + self.proc.stderr.read())
        self.port = int(m.group(1))
        threading.Thread(target=self._drain, daemon=True).start()
        deadline = time.time() + 30
        while self.request("GET", "/health")[0] != 200:
            if time.time() > deadline or self.proc.poll() is not None:
                raise RuntimeError("not ready: " + "".join(self.log))
            time.sleep(0.05)

    def _drain(self):
        for line in self.proc.stderr:
            self.log.append(line)

    def request(self, method, path, body=None, headers=None, timeout=30):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        data = body if isinstance(body, (bytes, str)) or body is None else json.dumps(body)
        conn.request(method, path, body=data, headers=headers or {})
        r = conn.getresponse()
        raw = r.read()
        conn.close()
        try:
            return r.status, json.loads(raw), dict(r.getheaders())
        except ValueError:
            return r.status, raw.decode(errors="replace"), dict(r.getheaders())

    def raw(self, data, timeout=10, read_until=b"\r\n\r\n"):
        """Sends bytes on a fresh connection; returns the status and what came back (the answer's
        head and whatever of its body arrived with it)."""
        s = socket.create_connection(("127.0.0.1", self.port), timeout=timeout)
        try:
            s.sendall(data)
            got = b""
            deadline = time.time() + timeout
            while time.time() < deadline:
                chunk = s.recv(65536)
                if not chunk:
                    break
                got += chunk
                if read_until in got and b"}" in got.split(b"\r\n\r\n", 1)[-1]:
                    break
            m = re.match(rb"HTTP/1\.[01] (\d+)", got)
            return (int(m.group(1)) if m else None), got.decode(errors="replace")
        finally:
            s.close()

    def metric(self, name, headers=None):
        _, text, _ = self.request("GET", "/metrics", headers=headers)
        total, found = 0.0, False
        for line in text.splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                total += float(line.rsplit(" ", 1)[1])
                found = True
        return total if found else None

    def rss_kib(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))

    def alive(self):
        return self.proc.poll() is None and self.request("GET", "/health")[0] == 200

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stderr.close()


def code_of(test, answer, status, code):
    s, body = answer[0], answer[1]
    test.assertEqual(s, status, body)
    test.assertIsInstance(body, dict, body)
    test.assertEqual(body["error"]["code"], code, body)
    return body["error"]["message"]


def chat(msg="hi", **kw):
    return {"messages": [{"role": "user", "content": msg}], "max_tokens": 4, **kw}


class Oversized(unittest.TestCase):
    """-c 512 (body limit 1 MiB by default), --mem 40M (the tiny model takes about 12 MiB)."""

    @classmethod
    def setUpClass(cls):
        cls.srv = Server("-np", "1", "-c", "512", "--max-queue", "2", "--mem", "40M")

    @classmethod
    def tearDownClass(cls):
        cls.srv.stop()

    def test_body_over_the_limit_is_refused_before_it_is_read(self):
        t = time.time()
        status, got = self.srv.raw(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                   b"Content-Length: 31457280\r\n\r\n")  # 30 MB announced, none sent
        self.assertEqual(status, 413, got)
        self.assertIn("request_too_large", got)
        self.assertIn("--max-body", got)
        self.assertLess(time.time() - t, 5)
        status, got = self.srv.raw(b"POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nExpect: 100-continue\r\n"
                                   b"Content-Length: 2000000\r\n\r\n")
        self.assertEqual(status, 413, got)
        self.assertTrue(self.srv.alive())

    def test_prompt_over_the_context_refused_by_its_size(self):
        t = time.time()
        msg = code_of(self, self.srv.request("POST", "/v1/completions", {"prompt": "x" * 900_000}), 400,
                      "context_length_exceeded")
        self.assertIn("bytes of text", msg)
        self.assertIn("512", msg)
        msg = code_of(self, self.srv.request("POST", "/v1/chat/completions", chat("y" * 900_000)), 400,
                      "context_length_exceeded")
        self.assertIn("bytes of text", msg)
        self.assertLess(time.time() - t, 5)
        # Within the size bound, over by count: tokenized and counted.
        msg = code_of(self, self.srv.request("POST", "/v1/completions", {"prompt": "word " * 1200}), 400,
                      "context_length_exceeded")
        self.assertRegex(msg, r"has \d+ tokens")
        code_of(self, self.srv.request("POST", "/v1/completions", {"prompt": list(range(1, 200)) * 3}), 400,
                "context_length_exceeded")

    def test_tokenize_and_detokenize_are_bounded(self):
        status, body, _ = self.srv.request("POST", "/tokenize", {"content": "hello " * 100})
        self.assertEqual(status, 200)
        self.assertGreater(len(body["tokens"]), 50)
        # 900 KB of text: the tokenizer's work (96 bytes a byte) is more than the budget holds.
        msg = code_of(self, self.srv.request("POST", "/tokenize", {"content": "z" * 900_000}), 413,
                      "request_too_large")
        self.assertIn("budget", msg)
        msg = code_of(self, self.srv.request("POST", "/detokenize", {"tokens": [5] * 300_000}), 413,
                      "request_too_large")
        self.assertIn("budget", msg)
        status, body, _ = self.srv.request("POST", "/detokenize", {"tokens": body["tokens"]})
        self.assertEqual(status, 200)

    def test_malformed_json_of_every_kind_is_a_400(self):
        post = lambda raw: self.srv.request("POST", "/v1/chat/completions", raw)
        code_of(self, post('{"messages": [{"role": "user", "content": "hi"}], "temperature": 1e400}'), 400,
                "invalid_json")
        code_of(self, post('{"messages": "\xff"}'.encode("latin-1")), 400, "invalid_json")
        code_of(self, post('{"messages": [{"role": "user", "content": "\\ud800"}]}'), 400, "invalid_json")
        code_of(self, post(""), 400, "invalid_json")
        code_of(self, post("[" * 100_000 + "]" * 100_000), 400, "invalid_json")
        code_of(self, post('{"a": ' + "{\"b\": " * 70 + "1" + "}" * 71), 400, "invalid_json")
        code_of(self, post('{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1e300}'), 400,
                "invalid_type")
        code_of(self, post('{"messages": [{"role": "user", "content": "hi"}], "seed": 99999999999999999999}'), 400,
                "invalid_type")
        self.assertTrue(self.srv.alive())

    def test_requests_stay_inside_the_budget_together(self):
        # Eight concurrent /tokenize requests of 60 KB each need 8 x 5.8 MB of tokenizer work, more
        # than the ~28 MB the model leaves: some are refused (503, try again), none crash, and the
        # device never goes past --mem.
        results = []

        def one():
            results.append(self.srv.request("POST", "/tokenize", {"content": "ab" * 30_000})[0])

        threads = [threading.Thread(target=one) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertTrue(set(results) <= {200, 503}, results)
        self.assertIn(200, results)
        _, mem, _ = self.srv.request("GET", "/v1/memory")
        dev = mem["devices"][0]
        self.assertLessEqual(dev["peak"], dev["capacity"])
        pools = {p["name"]: p for p in dev["pools"]}
        self.assertGreater(pools["requests"]["peak"], 5_000_000)


class MemoryGivenBack(unittest.TestCase):
    def test_a_large_request_leaves_nothing_resident(self):
        if os.environ.get("FITLLM_SANITIZED"):
            self.skipTest("AddressSanitizer's quarantine keeps freed memory resident; the Release run checks this")
        srv = Server("-c", "512", "--max-body", "64M", "--mem", "2G")
        try:
            body = json.dumps({"prompt": "a" * (30 << 20)})  # 30 MB: parsed, refused by its size
            srv.request("POST", "/v1/completions", {"prompt": "warm up"})
            base = srv.rss_kib()
            for _ in range(3):
                code_of(self, srv.request("POST", "/v1/completions", body), 400, "context_length_exceeded")
            grown = srv.rss_kib() - base
            self.assertLess(grown, 16 << 10, f"{grown} KiB stayed resident after three 30 MB requests")
            self.assertTrue(srv.alive())
        finally:
            srv.stop()


class SlowClients(unittest.TestCase):
    def test_slow_clients_are_cut_and_do_not_hold_up_others(self):
        srv = Server("-np", "1", "-c", "512", "--request-timeout", "2")
        socks = []
        try:
            for _ in range(64):
                socks.append(socket.create_connection(("127.0.0.1", srv.port)))
            head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            start = time.time()
            for i in range(4):  # one byte every 0.4 s from each
                for s in socks:
                    s.sendall(head[i:i + 1])
                t = time.time()
                self.assertEqual(srv.request("GET", "/health", timeout=5)[0], 200)
                self.assertLess(time.time() - t, 1.0, "/health waited behind slow clients")
                t = time.time()
                status, body, _ = srv.request("POST", "/v1/chat/completions", chat(), timeout=10)
                self.assertEqual(status, 200, body)
                self.assertLess(time.time() - t, 3.0)
                time.sleep(0.4)
            for s in socks:
                s.settimeout(5)
                try:
                    self.assertEqual(s.recv(100), b"", "a dribbling client outlived the deadline")
                except ConnectionResetError:
                    pass
            self.assertGreater(time.time() - start, 1.5)
            self.assertGreaterEqual(srv.metric("fitllm_timeouts_total"), 64)
        finally:
            for s in socks:
                s.close()
            srv.stop()

    def test_connection_cap_per_client_evicts_the_oldest_waiting(self):
        srv = Server("--max-connections-per-client", "8")
        socks = []
        try:
            for _ in range(8):
                socks.append(socket.create_connection(("127.0.0.1", srv.port)))
                time.sleep(0.02)
            self.assertEqual(srv.request("GET", "/health")[0], 200)  # the 9th: room made
            socks[0].settimeout(3)
            self.assertEqual(socks[0].recv(10), b"")
            self.assertGreaterEqual(srv.metric("fitllm_connections_evicted_total"), 1)
        finally:
            for s in socks:
                s.close()
            srv.stop()


class WebSafety(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.srv = Server("--api-key", "k3y", "--cors-origin", "http://good.example:3000", "--allowed-hosts",
                         "my.box")
        cls.key = {"Authorization": "Bearer k3y"}

    @classmethod
    def tearDownClass(cls):
        cls.srv.stop()

    def test_host_must_be_one_the_server_serves(self):
        for path in ("/", "/health", "/v1/models"):
            msg = code_of(self, self.srv.request("GET", path, headers={"Host": "evil.example:8080", **self.key}), 403,
                          "host_not_allowed")
            self.assertIn("--allowed-hosts", msg)
        for host in (f"localhost:{self.srv.port}", f"127.0.0.1:{self.srv.port}", "my.box"):
            self.assertEqual(self.srv.request("GET", "/v1/models", headers={"Host": host, **self.key})[0], 200)

    def test_cross_origin_requests_are_refused_unless_allowed(self):
        generated = self.srv.metric("fitllm_generated_tokens_total", self.key)
        # A page elsewhere posting text/plain (no preflight): refused before the body is read.
        msg = code_of(self, self.srv.request("POST", "/v1/completions", json.dumps({"prompt": "hi", "max_tokens": 2}),
                                             headers={"Origin": "http://evil.example", "Content-Type": "text/plain",
                                                      **self.key}), 403, "origin_not_allowed")
        self.assertIn("--cors-origin", msg)
        self.assertEqual(self.srv.metric("fitllm_generated_tokens_total", self.key), generated)
        # The server's own page is same-origin.
        own = f"http://127.0.0.1:{self.srv.port}"
        self.assertEqual(self.srv.request("GET", "/v1/models", headers={"Origin": own, **self.key})[0], 200)
        # An allowed origin: the preflight and the answers carry the CORS headers.
        good = "http://good.example:3000"
        status, _, headers = self.srv.request("OPTIONS", "/v1/chat/completions", headers={
            "Origin": good, "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type"})
        self.assertEqual(status, 204)
        self.assertEqual(headers.get("Access-Control-Allow-Origin"), good)
        self.assertIn("POST", headers.get("Access-Control-Allow-Methods", ""))
        self.assertIn("authorization", headers.get("Access-Control-Allow-Headers", ""))
        status, body, headers = self.srv.request("POST", "/v1/chat/completions", chat(),
                                                 headers={"Origin": good, **self.key})
        self.assertEqual(status, 200, body)
        self.assertEqual(headers.get("Access-Control-Allow-Origin"), good)
        status, _, headers = self.srv.request("GET", "/v1/models", headers={"Origin": good})  # no key
        self.assertEqual(status, 401)
        self.assertEqual(headers.get("Access-Control-Allow-Origin"), good)  # the page can read the error
        status, _, headers = self.srv.request("OPTIONS", "/v1/models", headers={"Origin": "http://evil.example"})
        self.assertEqual(status, 403)
        self.assertNotIn("Access-Control-Allow-Origin", headers)

    def test_pages_on_this_machine_by_default_or_none(self):
        # Without --cors-origin a local front end (any port on localhost) may call the API, another
        # site may not; --cors-origin none refuses every other origin.
        local = "http://localhost:5173"
        srv = Server()
        try:
            status, _, headers = srv.request("OPTIONS", "/v1/chat/completions", headers={
                "Origin": local, "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "content-type"})
            self.assertEqual((status, headers.get("Access-Control-Allow-Origin")), (204, local))
            self.assertIn("POST", headers.get("Access-Control-Allow-Methods", ""))
            self.assertEqual(headers.get("Access-Control-Allow-Headers"), "content-type")
            status, body, headers = srv.request("POST", "/v1/chat/completions", chat(),
                                                headers={"Origin": local, "Content-Type": "application/json"})
            self.assertEqual((status, headers.get("Access-Control-Allow-Origin")), (200, local), body)
            code_of(self, srv.request("POST", "/v1/chat/completions", chat(),
                                      headers={"Origin": "http://localhost.evil.example"}), 403, "origin_not_allowed")
        finally:
            srv.stop()
        srv = Server("--cors-origin", "none")
        try:
            code_of(self, srv.request("POST", "/v1/chat/completions", chat(), headers={"Origin": local}), 403,
                    "origin_not_allowed")
            status, _, headers = srv.request("OPTIONS", "/v1/models", headers={"Origin": local})
            self.assertEqual(status, 403)
            self.assertNotIn("Access-Control-Allow-Origin", headers)
            own = f"http://127.0.0.1:{srv.port}"  # the server's own page still works
            self.assertEqual(srv.request("GET", "/v1/models", headers={"Origin": own})[0], 200)
        finally:
            srv.stop()

    def test_api_key(self):
        code_of(self, self.srv.request("GET", "/v1/models"), 401, "invalid_api_key")
        code_of(self, self.srv.request("GET", "/v1/models", headers={"Authorization": "Bearer k3x"}), 401,
                "invalid_api_key")
        code_of(self, self.srv.request("GET", "/v1/models", headers={"Authorization": "Bearer k3y-and-more"}), 401,
                "invalid_api_key")
        self.assertEqual(self.srv.request("GET", "/v1/models", headers={"Authorization": "bearer k3y"})[0], 200)
        self.assertEqual(self.srv.request("GET", "/health")[0], 200)


class ErrorCodes(unittest.TestCase):
    def test_every_refusal_has_its_own_code(self):
        srv = Server("-c", "256")
        try:
            code_of(self, srv.request("GET", "/v1/nothing"), 404, "not_found")
            code_of(self, srv.request("GET", "/v1/completions"), 405, "method_not_allowed")
            code_of(self, srv.request("POST", "/health", "{}"), 405, "method_not_allowed")
            status, got = srv.raw(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"b" * 40000 + b"\r\n\r\n")
            self.assertEqual(status, 431, got)
            self.assertIn("headers_too_large", got)
            status, got = srv.raw(b"BLAH\r\n\r\n")
            self.assertEqual(status, 400, got)
            self.assertIn("bad_request", got)
            status, got = srv.raw(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 9999999\r\n\r\n")
            self.assertEqual(status, 413, got)
            self.assertIn("request_too_large", got)
            self.assertTrue(srv.alive())
        finally:
            srv.stop()


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0], "-v"])
