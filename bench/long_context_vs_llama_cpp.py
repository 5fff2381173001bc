#!/usr/bin/env python3
"""Long-context prompt processing, fitllm against llama.cpp (flash attention off and on): tokens/s
and peak RSS of one prompt of 4k, 16k and 32k random tokens (issue 5's benchmark).

  .venv/bin/python tools/gen_bench_models.py --shape 156m          # models/bench/llama-156m-q8_0.gguf
  .venv/bin/python bench/long_context_vs_llama_cpp.py [MODEL.gguf] [--lengths 4096,16384,32768]
      [--threads 2] [--ctk f16 --ctv f16] [--fa off,on] [--skip-llama-cpp] [--fitllm build/fitllm]

Every measurement runs in a fresh child process, so its peak RSS (VmHWM, model load included) is
its own: llama.cpp runs in a Python child (llama-cpp-python's C API: n_ctx = length,
n_batch = n_ubatch = 512, a 512-token warm-up, the memory cleared, then the timed prompt in
512-token llama_decode calls) that reports VmHWM from /proc/self/status (which includes the
interpreter's own ~40 MiB, printed first); fitllm runs as
`fitllm bench -m MODEL -p LENGTH -n 0 -r 1 -t THREADS -o json` under a Python child that reports
getrusage(RUSAGE_CHILDREN).ru_maxrss. --ctk/--ctv go to both runtimes (to fitllm only when
given; llama.cpp's quantized V needs flash attention, a run that fails gets a row saying why).

weights + KV = the tensor bytes of the file + length x n_layer x n_head_kv x head_dim x
(bytes per K element + bytes per V element). The last column is the 1-minute load average as each
run ends (speeds taken on a busy machine are not comparable; peak RSS is). Issue 5's targets: fitllm's peak RSS at most
1.1 x (weights + KV) at every length, and its speed at least llama.cpp's without flash attention.
"""
import argparse
import json
import os
import random
import resource
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_MODEL = os.path.join(ROOT, "models/bench/llama-156m-q8_0.gguf")

# KV type -> (ggml type id, bytes per element)
KV_TYPES = {
    "f32": (0, 4.0), "f16": (1, 2.0), "bf16": (30, 2.0), "q8_0": (8, 34 / 32), "q4_0": (2, 18 / 32),
    "q4_1": (3, 20 / 32), "q5_0": (6, 22 / 32), "q5_1": (7, 24 / 32), "iq4_nl": (20, 18 / 32),
}
MiB = 1024 * 1024


def vm_hwm_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise RuntimeError("no VmHWM in /proc/self/status")


# ---------------------------------------------------------------- children (one measurement each)

def child_llama_cpp(model_path: str, length: int, threads: int, flash: bool, ctk: str, ctv: str) -> dict:
    import ctypes

    import llama_cpp

    llama_cpp.llama_log_set(ctypes.cast(None, llama_cpp.llama_log_callback), None)  # quiet
    llama_cpp.llama_backend_init()
    model = llama_cpp.llama_model_load_from_file(model_path.encode(), llama_cpp.llama_model_default_params())
    if not model:
        raise RuntimeError("llama.cpp cannot load the model")
    n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
    p = llama_cpp.llama_context_default_params()
    p.n_ctx = length
    p.n_batch = p.n_ubatch = 512
    p.n_threads = p.n_threads_batch = threads
    p.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
    p.type_k = KV_TYPES[ctk][0]
    p.type_v = KV_TYPES[ctv][0]
    ctx = llama_cpp.llama_init_from_model(model, p)
    if not ctx:
        raise RuntimeError(f"llama.cpp cannot create the context (flash attention {'on' if flash else 'off'}, "
                           f"K {ctk}, V {ctv})")
    rng = random.Random(42)
    toks = [rng.randrange(n_vocab) for _ in range(length)]
    arr = (llama_cpp.llama_token * length)(*toks)

    def decode(n_tokens: int) -> None:
        for start in range(0, n_tokens, 512):
            n = min(512, n_tokens - start)
            batch = llama_cpp.llama_batch_get_one(
                ctypes.cast(ctypes.addressof(arr) + 4 * start, ctypes.POINTER(llama_cpp.llama_token)), n)
            rc = llama_cpp.llama_decode(ctx, batch)
            if rc != 0:
                raise RuntimeError(f"llama_decode returned {rc} at token {start}")

    decode(min(512, length))  # warm-up: weights paged in, compute buffers touched
    llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)
    t0 = time.perf_counter()
    decode(length)
    dt = time.perf_counter() - t0
    llama_cpp.llama_free(ctx)
    llama_cpp.llama_model_free(model)
    return {"tps": length / dt, "seconds": dt, "peak_rss_kib": vm_hwm_kib()}


def child_fitllm(fitllm: str, model_path: str, length: int, threads: int, ctk: str | None,
                 ctv: str | None) -> dict:
    cmd = [fitllm, "bench", "-m", model_path, "-p", str(length), "-n", "0", "-r", "1", "-t", str(threads),
           "-o", "json"]
    if ctk:
        cmd += ["-ctk", ctk]
    if ctv:
        cmd += ["-ctv", ctv]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        raise RuntimeError(lines[-1] if lines else f"fitllm bench exited with {proc.returncode}")
    rows = [r for r in json.loads(proc.stdout) if r["test"] == f"pp{length}"]
    if not rows:
        raise RuntimeError(f"fitllm bench printed no pp{length} row")
    tps = rows[0]["avg_ts"]
    # ru_maxrss of the waited-for children only (fitllm), in KiB on Linux
    return {"tps": tps, "seconds": length / tps, "wall": wall,
            "peak_rss_kib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}


def child_main(spec: dict) -> None:
    try:
        if spec["runtime"] == "python":  # the llama.cpp child's own floor: the interpreter and llama_cpp
            import llama_cpp  # noqa: F401

            out = {"peak_rss_kib": vm_hwm_kib()}
        elif spec["runtime"] == "llama.cpp":
            out = child_llama_cpp(spec["model"], spec["length"], spec["threads"], spec["flash"], spec["ctk"],
                                  spec["ctv"])
        else:
            out = child_fitllm(spec["fitllm"], spec["model"], spec["length"], spec["threads"], spec["ctk"],
                               spec["ctv"])
    except Exception as e:  # reported to the parent, which prints a row saying why
        out = {"error": str(e)}
    sys.stdout.write("RESULT " + json.dumps(out) + "\n")


def run_child(spec: dict, timeout: float | None) -> dict:
    # its own process group, so that a timeout also ends the fitllm grandchild
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child", json.dumps(spec)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return {"error": f"over the {timeout:.0f} s limit"}
    for line in stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    lines = (stderr or stdout).strip().splitlines()
    return {"error": lines[-1] if lines else f"child exited with {proc.returncode}"}


# ---------------------------------------------------------------- parent

def model_facts(path: str) -> dict:
    import gguf

    r = gguf.GGUFReader(path)

    def val(key):
        f = r.fields.get(key)
        return None if f is None else f.contents()

    arch = val("general.architecture")
    n_head = val(f"{arch}.attention.head_count")
    n_embd = val(f"{arch}.embedding_length")
    head_k = val(f"{arch}.attention.key_length") or n_embd // n_head
    head_v = val(f"{arch}.attention.value_length") or n_embd // n_head
    return {
        "weights": sum(int(t.n_bytes) for t in r.tensors),
        "n_layer": val(f"{arch}.block_count"),
        "n_head_kv": val(f"{arch}.attention.head_count_kv") or n_head,
        "head_k": head_k,
        "head_v": head_v,
    }


def kv_bytes(facts: dict, length: int, ctk: str, ctv: str) -> float:
    per_layer = facts["n_head_kv"] * (facts["head_k"] * KV_TYPES[ctk][1] + facts["head_v"] * KV_TYPES[ctv][1])
    return length * facts["n_layer"] * per_layer


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child_main(json.loads(sys.argv[2]))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", nargs="?", default=DEFAULT_MODEL,
                    help="GGUF model (default models/bench/llama-156m-q8_0.gguf, tools/gen_bench_models.py --shape 156m)")
    ap.add_argument("--lengths", default="4096,16384,32768", help="prompt lengths, comma-separated")
    ap.add_argument("--threads", "-t", type=int, default=2)
    ap.add_argument("--ctk", choices=sorted(KV_TYPES), help="K cache type (default f16)")
    ap.add_argument("--ctv", choices=sorted(KV_TYPES), help="V cache type (default f16)")
    ap.add_argument("--fa", default="off,on", help="llama.cpp flash attention settings to run: off, on or off,on")
    ap.add_argument("--skip-llama-cpp", action="store_true", help="fitllm only")
    ap.add_argument("--skip-fitllm", action="store_true", help="llama.cpp only")
    ap.add_argument("--fitllm", default=os.path.join(ROOT, "build/fitllm"), help="the fitllm binary")
    ap.add_argument("--timeout", type=float, default=None, help="seconds per measurement (default: none)")
    args = ap.parse_args()

    model = os.path.abspath(args.model)
    if not os.path.exists(model):
        sys.exit(f"{args.model}: missing (.venv/bin/python tools/gen_bench_models.py --shape 156m)")
    lengths = [int(x) for x in args.lengths.split(",") if x]
    flashes = [{"off": False, "on": True}[x.strip()] for x in args.fa.split(",") if x.strip()]
    ctk, ctv = args.ctk or "f16", args.ctv or "f16"
    facts = model_facts(model)
    print(f"{os.path.basename(model)}: weights {facts['weights'] / MiB:.1f} MiB, {facts['n_layer']} layers x "
          f"{facts['n_head_kv']} KV heads x {facts['head_k']}/{facts['head_v']}, K {ctk}, V {ctv}, "
          f"{args.threads} threads; one prompt per run, each run in its own process", flush=True)
    if not args.skip_llama_cpp:
        floor = run_child({"runtime": "python"}, 60)
        if "peak_rss_kib" in floor:
            print(f"llama.cpp's peak RSS includes its Python child's own {floor['peak_rss_kib'] / 1024:.0f} MiB "
                  "(interpreter + llama_cpp imported)", flush=True)
    print("| length | runtime | tok/s | peak RSS MiB | weights + KV MiB | RSS / (W+KV) | vs llama.cpp FA off | "
          "vs llama.cpp FA on | load |\n|---:|---|---:|---:|---:|---:|---:|---:|---:|", flush=True)

    base = {"model": model, "threads": args.threads, "ctk": args.ctk, "ctv": args.ctv, "fitllm": args.fitllm}
    for length in lengths:
        budget = (facts["weights"] + kv_bytes(facts, length, ctk, ctv)) / MiB
        runs = []
        if not args.skip_llama_cpp:
            runs += [(f"llama.cpp FA {'on' if fl else 'off'}",
                      dict(base, runtime="llama.cpp", length=length, flash=fl, ctk=ctk, ctv=ctv)) for fl in flashes]
        if not args.skip_fitllm:
            runs.append(("fitllm", dict(base, runtime="fitllm", length=length)))
        speeds = {}
        for name, spec in runs:
            res = run_child(spec, args.timeout)
            load = os.getloadavg()[0]  # the machine's 1-minute load average as the run ends
            if "error" in res:
                msg = res["error"].replace("|", "/")
                print(f"| {length} | {name} | fails: {msg} | | {budget:.0f} | | | | {load:.1f} |", flush=True)
                continue
            speeds[name] = res["tps"]
            rss = res["peak_rss_kib"] / 1024
            ratios = ["", ""]
            if name == "fitllm":
                ratios = [f"{res['tps'] / speeds[k]:.2f}x" if k in speeds else "-"
                          for k in ("llama.cpp FA off", "llama.cpp FA on")]
            print(f"| {length} | {name} | {res['tps']:.1f} | {rss:.1f} | {budget:.1f} | {rss / budget:.3f} | "
                  f"{ratios[0]} | {ratios[1]} | {load:.1f} |", flush=True)


if __name__ == "__main__":
    main()
