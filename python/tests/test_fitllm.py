"""The Python bindings against the fitllm executable: the same engine, the same text."""
import os
import subprocess

import pytest

import fitllm

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FITLLM = os.environ.get("FITLLM_EXE", os.path.join(ROOT, "build", "fitllm"))
DEMO = os.path.join(ROOT, "models", "gemma-3-270m-q4_k_m.gguf")
TINY = os.path.join(ROOT, "tests", "model", "data", "tiny-llama-q8_0.gguf")
MODEL = DEMO if os.path.exists(DEMO) else TINY
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def engine():
    return fitllm.Engine(MODEL, mem="1G", n_ctx=512)


def cli_run(prompt, n):
    r = subprocess.run([FITLLM, "run", "-m", MODEL, "-p", prompt, "-n", str(n), "--temp", "0", "-c", "512"],
                       capture_output=True, text=True, timeout=120, check=True)
    return r.stdout


def test_greedy_text_is_fitllm_runs(engine):
    if not os.path.exists(FITLLM):
        pytest.skip(f"{FITLLM} is not built (scripts/setup.sh builds it)")
    text = engine.generate(PROMPT, max_tokens=24, temperature=0)
    assert PROMPT + text + "\n" == cli_run(PROMPT, 24)


def test_streamed_pieces_make_the_whole_text(engine):
    whole = engine.generate(PROMPT, max_tokens=16, temperature=0)
    pieces = list(engine.generate(PROMPT, max_tokens=16, temperature=0, stream=True))
    assert len(pieces) > 1
    assert "".join(pieces) == whole


def test_a_longer_prompt_reuses_the_cached_one():
    # The cache holds the prompt and the tokens generated after it; a longer prompt computes only
    # its new tokens, after the generated ones are dropped. The result is what an engine gets that
    # had fed the same prompt in the same pieces without generating after it (a prompt fed in other
    # pieces may round differently: the kernels' arithmetic depends on the batch).
    engine = fitllm.Engine(MODEL, mem="1G", n_ctx=512)
    first = engine.generate(PROMPT, max_tokens=4, temperature=0, details=True)
    assert first["n_prompt_fed"] == first["n_prompt"]
    longer = PROMPT + " a city"
    again = engine.generate(longer, max_tokens=12, temperature=0, details=True)
    n_new = len(engine.tokenize(longer)) - len(engine.tokenize(PROMPT))
    assert again["n_prompt_fed"] == n_new > 0
    other = fitllm.Engine(MODEL, mem="1G", n_ctx=512)
    other.generate(PROMPT, max_tokens=1, temperature=0)
    assert other.generate(longer, max_tokens=12, temperature=0) == again["text"]


def test_stop_strings_end_the_text(engine):
    whole = engine.generate(PROMPT, max_tokens=24, temperature=0)
    stop = whole[len(whole) // 2:len(whole) // 2 + 3]
    if not stop.strip():
        pytest.skip("no stop string to take from this model's text")
    cut = engine.generate(PROMPT, max_tokens=24, temperature=0, stop=[stop], details=True)
    assert cut["finish_reason"] == "stop"
    assert cut["text"] == whole[:whole.find(stop)]


def test_chat_goes_through_the_template(engine):
    messages = [{"role": "user", "content": "Say hello."}]
    prompt = engine.apply_chat_template(messages)
    assert "Say hello." in prompt
    reply = engine.chat(messages, max_tokens=8, temperature=0)
    assert reply == engine.generate(prompt, max_tokens=8, temperature=0, add_special=False)


def test_tokenize_and_detokenize(engine):
    ids = engine.tokenize("Hello world", add_special=False)
    assert ids and all(isinstance(i, int) for i in ids)
    assert engine.detokenize(ids) == "Hello world"


def test_plan_and_memory(engine):
    plan = engine.plan()
    assert plan["fits"] and plan["total"] <= plan["budget"] == 1 << 30
    assert "weights resident" in plan["text"]
    assert plan["details"]["devices"][0]["name"] == "host"
    mem = engine.memory()
    host = mem["devices"][0]
    assert host["name"] == "host" and host["peak"] <= host["capacity"]
    assert {p["name"] for p in host["pools"]} >= {"overhead", "weights", "kv", "logits"}
    assert mem["plan_total"] == plan["total"]


def test_several_sequences_at_once(engine):
    out = engine.generate_parallel(PROMPT, 3, max_tokens=6, temperature=0.9, seed=5)
    assert len(out) == 3
    assert all(len(c["tokens"]) >= 1 for c in out)


def test_a_budget_too_small_raises_with_the_numbers():
    with pytest.raises(fitllm.DoesNotFitError) as e:
        fitllm.Engine(MODEL, mem="4M")
    assert e.value.needed > e.value.budget == 4 << 20
    assert "fits               no" in e.value.plan_text
    assert isinstance(e.value, fitllm.Error)


def test_bad_settings_raise_config_errors():
    with pytest.raises(fitllm.ConfigError, match="q9_9"):
        fitllm.Engine(MODEL, type_k="q9_9")
    with pytest.raises(fitllm.ConfigError):
        fitllm.Engine(MODEL, n_seq=0)
    with pytest.raises(fitllm.Error):
        fitllm.Engine(os.path.join(ROOT, "no-such-model.gguf"))


def test_one_generation_at_a_time(engine):
    it = engine.generate(PROMPT, max_tokens=8, temperature=0, stream=True)
    next(it)
    with pytest.raises(fitllm.Error, match="one generation at a time"):
        engine.generate(PROMPT, max_tokens=2)
    it.close()
    assert engine.generate(PROMPT, max_tokens=2, temperature=0)
