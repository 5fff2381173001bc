#!/usr/bin/env python3
"""The chat page at `/` of `fitllm serve`, driven in headless Chromium.

  .venv/bin/python tests/server/page_test.py --fitllm build/fitllm --model tests/model/data/tiny-llama-q8_0.gguf
  .venv/bin/python tests/server/page_test.py --url http://127.0.0.1:8080   # a server already running
  ... --screenshot page.png                                                 # also save what the page looked like

Starts the server on a free loopback port, opens the page in Chromium (Debian's `chromium`,
--headless) and drives it through the Chrome DevTools Protocol (PyPI `websocket-client`): the
model picker fills from /v1/models, the memory panel shows numbers from /v1/memory, one chat
message gets a reply streamed in more than one chunk, Stop aborts a long reply and the server
keeps serving, and a request the server refuses shows its error message in the page.
Exits 77 (ctest's SKIP_RETURN_CODE) with the reason when Chromium, websocket-client or the
`serve` command is unavailable; 1 on a failed check.
"""
import argparse
import base64
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

SKIP = 77


def skip(reason):
    print(f"SKIP: {reason}")
    sys.exit(SKIP)


class CheckFailed(Exception):
    pass


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(what, predicate, timeout, interval=0.1):
    """Polls predicate() until it returns a truthy value (returned), or fails after timeout s."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise CheckFailed(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})")


def http_status(url):
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


class DevTools:
    """The Chrome DevTools Protocol over the page target's websocket: call() sends a command and
    returns its result; events that arrive meanwhile are dropped (the test polls the DOM)."""

    def __init__(self, ws_url):
        import websocket  # PyPI websocket-client

        self.ws = websocket.create_connection(ws_url, timeout=30, suppress_origin=True)
        self.next_id = 0

    def call(self, method, **params):
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv())
            if message.get("id") == self.next_id:
                if "error" in message:
                    raise CheckFailed(f"DevTools {method}: {message['error']}")
                return message.get("result", {})

    def eval(self, expression):
        """The value of a JavaScript expression in the page (awaited if it is a promise)."""
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text")
            raise CheckFailed(f"JavaScript error in {expression!r}: {text}")
        return result["result"].get("value")

    def close(self):
        self.ws.close()


class Chromium:
    """Headless Chromium with a DevTools port, in a throw-away profile."""

    def __init__(self, binary, log_path):
        self.profile = tempfile.mkdtemp(prefix="fitllm-page-test-")
        self.log = open(log_path, "wb")
        args = [binary, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--no-first-run", "--no-default-browser-check", "--disable-extensions",
                "--remote-debugging-port=0", "--remote-allow-origins=*", "--window-size=1200,800",
                f"--user-data-dir={self.profile}", "about:blank"]
        self.process = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        port_file = os.path.join(self.profile, "DevToolsActivePort")

        def port():
            if self.process.poll() is not None:
                raise CheckFailed(f"chromium exited with {self.process.returncode}; its output is in {log_path}")
            try:
                with open(port_file) as f:
                    return int(f.readline())
            except (OSError, ValueError):
                return None

        self.port = wait_until("chromium's DevTools port", port, 60)

    def page_websocket(self):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/json/list", timeout=10) as r:
            targets = json.load(r)
        pages = [t for t in targets if t.get("type") == "page"]
        if not pages:
            raise CheckFailed(f"chromium has no page target: {targets}")
        return pages[0]["webSocketDebuggerUrl"]

    def close(self):
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()
        shutil.rmtree(self.profile, ignore_errors=True)


def start_server(fitllm, model, log_path):
    if not os.access(fitllm, os.X_OK):
        skip(f"{fitllm} is not built")
    help_run = subprocess.run([fitllm, "serve", "--help"], capture_output=True, text=True)
    if help_run.returncode != 0:
        skip(f"`{fitllm} serve` is unavailable: {(help_run.stderr or help_run.stdout).strip()[:200]}")
    if not os.path.exists(model):
        raise CheckFailed(f"model {model} not found")
    port = free_port()
    log = open(log_path, "wb")
    # --strict-model-names: a single model answers to any name otherwise, and the page's refused
    # request below asks for a model the server does not have.
    process = subprocess.Popen([fitllm, "serve", "-m", model, "--host", "127.0.0.1", "--port", str(port),
                                "-np", "2", "-c", "1024", "--strict-model-names"],
                               stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"

    def healthy():
        if process.poll() is not None:
            raise CheckFailed(f"fitllm serve exited with {process.returncode}; its output is in {log_path}")
        return http_status(url + "/health") == 200

    wait_until("GET /health to answer 200", healthy, 120)
    return process, log, url


def check(condition, message):
    if not condition:
        raise CheckFailed(message)
    print(f"ok: {message}")


def bubbles(tools):
    return tools.eval("""[...document.querySelectorAll('#messages .msg')].map(b => ({
        role: b.classList.contains('user') ? 'user' : 'assistant', state: b.dataset.state || '',
        chunks: +(b.dataset.chunks || 0), text: b.textContent}))""")


def last_reply(tools, done_states):
    """The last assistant bubble once its state is one of done_states."""
    replies = [b for b in bubbles(tools) if b["role"] == "assistant"]
    return replies[-1] if replies and replies[-1]["state"] in done_states else None


def send(tools, text, max_tokens, temperature=0):
    tools.eval(f"""(() => {{
        document.getElementById('max-tokens').value = {max_tokens};
        document.getElementById('temperature').value = {temperature};
        document.getElementById('input').value = {json.dumps(text)};
        document.getElementById('send').click(); }})()""")


def drive_page(tools, url, screenshot):
    tools.call("Page.enable")
    tools.call("Page.navigate", url=url + "/")

    # The model picker, filled from GET /v1/models.
    models = wait_until("the model picker to fill from /v1/models",
                        lambda: tools.eval("[...document.querySelectorAll('#model option')].map(o => o.value)"), 30)
    check(len(models) >= 1 and all(models), f"the model picker lists {models}")

    # The memory panel, from GET /v1/memory: a device with a pool, and a loaded model's plan.
    memory_rows = """[...document.querySelectorAll('#memory .bar-row')].map(r => ({
        kind: r.dataset.kind, used: +r.dataset.used, plan: r.dataset.plan === undefined ? null : +r.dataset.plan,
        text: r.textContent.replace(/\\s+/g, ' ').trim()}))"""
    rows = wait_until("the memory panel to show /v1/memory",
                      lambda: tools.eval(f"document.getElementById('memory').dataset.state === 'ok' && {memory_rows}"), 30)
    devices = [r for r in rows if r["kind"] == "device"]
    pools = [r for r in rows if r["kind"] == "pool"]
    plans = [r for r in rows if r["kind"] == "model"]
    check(devices and devices[0]["used"] > 0 and "iB" in devices[0]["text"],
          f"the memory panel shows a device in use: {devices[:1]}")
    check(any(p["used"] > 0 for p in pools), f"the memory panel shows pools in use: {[p['text'] for p in pools]}")
    check(plans and plans[0]["plan"] and plans[0]["plan"] > 0,
          f"the memory panel shows a model's plan: {[p['text'] for p in plans]}")

    # One chat message, its reply streamed into the page.
    send(tools, "Hello! Tell me a story about a cat.", max_tokens=24)
    reply = wait_until("a streamed reply", lambda: last_reply(tools, ("done", "error", "stopped")), 120)
    check(reply["state"] == "done", f"the reply finished ({reply['state']}: {reply['text'][:200]!r})")
    check(reply["chunks"] >= 2, f"the reply arrived in {reply['chunks']} streamed chunks")
    check("tokens" in reply["text"], f"the reply shows its token count: {reply['text'][-60:]!r}")
    memory_after = tools.eval(f"{memory_rows}")
    check(any(r["kind"] == "device" and r["used"] > 0 for r in memory_after), "the memory panel still shows numbers")

    # Stop: a long reply aborted as soon as its first chunk shows (clicked from a DOM observer in
    # the page, so however fast the model is); the page and the server go on.
    tools.eval("""(() => { const observer = new MutationObserver(() => {
        const b = [...document.querySelectorAll('#messages .msg.assistant')].pop();
        if (b && b.dataset.state === 'streaming' && +b.dataset.chunks >= 1) {
          observer.disconnect(); document.getElementById('stop').click(); } });
      observer.observe(document.getElementById('messages'), {subtree: true, childList: true, attributes: true}); })()""")
    send(tools, "Count from one to one thousand.", max_tokens=400, temperature=1)
    reply = wait_until("the stopped reply", lambda: last_reply(tools, ("done", "error", "stopped")), 60)
    check(reply["state"] == "stopped" and reply["chunks"] == 1,
          f"Stop ended the reply after its first chunk ({reply['state']}, {reply['chunks']} chunks: {reply['text'][-200:]!r})")
    check(tools.eval("!document.getElementById('send').disabled"), "Send is enabled again after Stop")
    send(tools, "Hello again.", max_tokens=8)
    reply = wait_until("a reply after Stop", lambda: last_reply(tools, ("done", "error", "stopped")), 120)
    check(reply["state"] == "done", f"the server answers after a stopped reply ({reply['state']})")
    # The third turn starts from the cells the earlier turns left (the prompt cache, on by default).
    cached = re.search(r"(\d+) cached", reply["text"])
    check(cached and int(cached.group(1)) > 0, f"the reply shows cached prompt tokens: {reply['text'][-80:]!r}")
    kept = wait_until("the memory panel to show kept prompts", lambda: tools.eval(
        "[...document.querySelectorAll('#memory .kv-cache')].map(p => +p.dataset.cachedPrompts)"
        ".some(n => n > 0)"), 10)
    check(kept, "the memory panel shows the prompts kept in the KV cache")

    # A request the server refuses: its OpenAI-style error message shows in the page.
    tools.eval("""(() => { const s = document.getElementById('model');
        s.append(new Option('no-such-model.gguf', 'no-such-model.gguf')); s.value = 'no-such-model.gguf'; })()""")
    send(tools, "Hello?", max_tokens=8)
    reply = wait_until("the refused request's reply", lambda: last_reply(tools, ("done", "error", "stopped")), 30)
    check(reply["state"] == "error" and "Error: " in reply["text"] and "no-such-model" in reply["text"],
          f"the server's error shows in the page: {reply['text']!r}")

    if screenshot:
        shot = tools.call("Page.captureScreenshot", format="png")
        with open(screenshot, "wb") as f:
            f.write(base64.b64decode(shot["data"]))
        print(f"screenshot: {screenshot}")


def main():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fitllm", default=os.path.join(root, "build", "fitllm"))
    parser.add_argument("--model", default=os.path.join(root, "tests", "model", "data", "tiny-llama-q8_0.gguf"))
    parser.add_argument("--url", help="test a server already running there instead of starting one")
    parser.add_argument("--chromium", help="the browser (default: chromium or chromium-browser on PATH)")
    parser.add_argument("--screenshot", help="save a PNG of the page at the end")
    args = parser.parse_args()

    browser = args.chromium or shutil.which("chromium") or shutil.which("chromium-browser")
    if not browser:
        skip("no chromium on PATH (Debian: apt install chromium; scripts/setup.sh --browser installs it)")
    try:
        import websocket  # noqa: F401
    except ImportError:
        skip("PyPI websocket-client is not installed (.venv/bin/pip install -r requirements.txt)")

    logs = tempfile.mkdtemp(prefix="fitllm-page-test-logs-")
    server = chromium = tools = None
    failed = False
    try:
        if args.url:
            url = args.url.rstrip("/")
        else:
            server, server_log, url = start_server(args.fitllm, args.model, os.path.join(logs, "server.log"))
        chromium = Chromium(browser, os.path.join(logs, "chromium.log"))
        tools = DevTools(chromium.page_websocket())
        drive_page(tools, url, args.screenshot)
    except CheckFailed as e:
        failed = True
        print(f"FAILED: {e}")
    finally:
        if tools:
            tools.close()
        if chromium:
            chromium.close()
        if server:
            server.terminate()
            try:
                server.wait(20)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
            server_log.close()
            if server.returncode not in (0, -15):
                failed = True
                print(f"FAILED: fitllm serve exited with {server.returncode} on SIGTERM")
    if failed:
        for name in sorted(os.listdir(logs)):
            with open(os.path.join(logs, name), errors="replace") as f:
                print(f"--- {name} (last 40 lines) ---\n" + "".join(f.readlines()[-40:]))
    shutil.rmtree(logs, ignore_errors=True)
    print("FAILED" if failed else "PASSED")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
