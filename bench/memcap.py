#!/usr/bin/env python3
"""Run a command inside a memory cap: a child memory cgroup (cgroup v1) with a limit, page cache
included, as if on a smaller machine; report wall time, exit status, the cgroup's peak memory
and OOM kills, then remove the cgroup (also on errors, Ctrl-C and SIGTERM).

  .venv/bin/python bench/memcap.py --limit 900M [--drop-caches] [--timeout S] [--json] -- CMD [ARG...]
  .venv/bin/python bench/memcap.py --selftest        # 200 MB under 100M: killed; under 400M: not
  .venv/bin/python bench/memcap.py --cleanup-stale   # remove memcap-* cgroups left by a killed run

As a module (bench/memcap_vs_llama_cpp.py):

  import memcap
  r = memcap.run_capped(["build/fitllm", "bench", ...], limit_bytes=memcap.parse_size("900M"),
                        drop_caches_first=True, capture=True)
  r.peak_bytes, r.oom_kills, r.returncode, r.signal, r.wall_s, r.stdout

The cgroup is created under this process's own memory cgroup (/proc/self/cgroup's `memory`
line, below the v1 memory mount), named memcap-PID-RANDOM. memory.limit_in_bytes caps RAM,
memory.memsw.limit_in_bytes (when the kernel has swap accounting) caps RAM + swap at the same
value so swap cannot hide the cap. Peak is memory.max_usage_in_bytes (RSS + page cache + kernel
memory charged to the group, over the whole run); OOM kills are memory.oom_control's oom_kill
counter (or, on kernels without it, failcnt > 0 together with the child dying by SIGKILL).
A page is charged to the cgroup that first brought it in, so file pages already cached by someone
else are not counted: --drop-caches runs `sync; echo 3 > /proc/sys/vm/drop_caches` first
(machine-wide: cold runs, and the model file charged to the run). Max RSS is the child's
ru_maxrss from wait4; it includes the ~13 MiB of the forked Python before exec.
Needs root (or write access to the memory cgroup) and cgroup v1; otherwise CgroupUnavailable
says why, and the CLI exits with status 77 (skip).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import time

PREFIX = "memcap-"
SKIP_STATUS = 77


class CgroupUnavailable(RuntimeError):
    """No writable cgroup v1 memory controller here; the message says what is missing."""


def parse_size(text: str) -> int:
    """'900M' -> 900 MiB, '1.5G', '4096K', '123' (bytes). K/M/G/T are binary (KiB, MiB, ...)."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([kmgt]?)(?:i?b)?\s*", text, re.IGNORECASE)
    if not m:
        raise ValueError(f"size: expected a number with an optional K/M/G/T suffix, got '{text}'")
    scale = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}[m.group(2).lower()]
    return int(float(m.group(1)) * scale)


def fmt_mib(n: int | None) -> str:
    return "-" if n is None else f"{n / (1 << 20):.0f} MiB"


def _memory_mount() -> str:
    """The cgroup v1 memory controller's mount point, from /proc/self/mountinfo."""
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                fields = line.split()
                sep = fields.index("-")
                fstype, options = fields[sep + 1], fields[sep + 3] if len(fields) > sep + 3 else ""
                if fstype == "cgroup" and "memory" in options.split(",") + fields[6:sep]:
                    return fields[4]
    except OSError as e:
        raise CgroupUnavailable(f"cannot read /proc/self/mountinfo: {e}") from e
    if os.path.exists("/sys/fs/cgroup/cgroup.controllers"):
        raise CgroupUnavailable("only cgroup v2 is mounted here; memcap.py supports the cgroup v1 memory controller")
    raise CgroupUnavailable("no cgroup v1 memory controller is mounted")


def own_memory_cgroup() -> str:
    """The directory of this process's memory cgroup."""
    mount = _memory_mount()
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                if "memory" in controllers.split(","):
                    d = os.path.join(mount, path.lstrip("/"))
                    if not os.path.isdir(d):
                        raise CgroupUnavailable(f"this process's memory cgroup {d} does not exist")
                    return d
    except OSError as e:
        raise CgroupUnavailable(f"cannot read /proc/self/cgroup: {e}") from e
    raise CgroupUnavailable("/proc/self/cgroup has no memory line")


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _read_int(path: str) -> int | None:
    try:
        return int(_read(path).strip())
    except (OSError, ValueError):
        return None


def _oom_control(path: str) -> dict[str, int]:
    try:
        return {k: int(v) for k, v in (line.split() for line in _read(path).splitlines() if line.strip())}
    except (OSError, ValueError):
        return {}


def drop_caches() -> None:
    """sync, then drop the page cache, dentries and inodes machine-wide (needs root)."""
    os.sync()
    try:
        _write("/proc/sys/vm/drop_caches", "3")
    except OSError as e:
        raise CgroupUnavailable(f"cannot drop caches (/proc/sys/vm/drop_caches: {e.strerror}); run as root") from e


def remove_cgroup(path: str, timeout_s: float = 10.0) -> None:
    """Kill what is left in a memcap group (only processes this harness started live there), then rmdir."""
    deadline = time.monotonic() + timeout_s
    while os.path.isdir(path):
        try:
            pids = [int(x) for x in _read(os.path.join(path, "cgroup.procs")).split()]
        except OSError:
            pids = []
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            os.rmdir(path)
        except FileNotFoundError:
            return
        except OSError as e:
            if time.monotonic() > deadline:
                print(f"memcap: warning: could not remove {path}: {e.strerror}", file=sys.stderr)
                return
            time.sleep(0.05)


class MemCgroup:
    """A child memory cgroup with an optional limit; a context manager that removes it on exit.

    limit_bytes None = no limit (still measured: an uncapped row)."""

    def __init__(self, limit_bytes: int | None, parent: str | None = None, swap_too: bool = True):
        self.parent = parent or own_memory_cgroup()
        self.limit_bytes = limit_bytes
        self.path = os.path.join(self.parent, f"{PREFIX}{os.getpid()}-{secrets.token_hex(4)}")
        self.memsw = False  # whether memory.memsw.limit_in_bytes was set too
        try:
            os.mkdir(self.path)
        except OSError as e:
            raise CgroupUnavailable(f"cannot create a memory cgroup under {self.parent}: {e.strerror}"
                                    " (needs root or a delegated cgroup)") from e
        try:
            if limit_bytes is not None:
                # RAM first (memsw must stay >= RAM), then RAM + swap at the same value.
                _write(self.file("memory.limit_in_bytes"), str(limit_bytes))
                if swap_too and os.path.exists(self.file("memory.memsw.limit_in_bytes")):
                    _write(self.file("memory.memsw.limit_in_bytes"), str(limit_bytes))
                    self.memsw = True
            self.limit_effective = _read_int(self.file("memory.limit_in_bytes"))
        except BaseException:
            self.remove()
            raise

    def file(self, name: str) -> str:
        return os.path.join(self.path, name)

    def pids(self) -> list[int]:
        try:
            return [int(x) for x in _read(self.file("cgroup.procs")).split()]
        except OSError:
            return []

    def add_self(self) -> None:
        """Move the calling process into the group (for a preexec_fn: runs in the child before exec)."""
        _write(self.file("cgroup.procs"), str(os.getpid()))

    def stats(self) -> dict:
        oom = _oom_control(self.file("memory.oom_control"))
        return {
            "peak_bytes": _read_int(self.file("memory.max_usage_in_bytes")),
            "peak_memsw_bytes": _read_int(self.file("memory.memsw.max_usage_in_bytes")),
            "failcnt": _read_int(self.file("memory.failcnt")),
            "oom_kill": oom.get("oom_kill"),  # None on kernels before 4.13
            "under_oom": oom.get("under_oom"),
        }

    def remove(self) -> None:
        remove_cgroup(self.path)

    def __enter__(self) -> "MemCgroup":
        return self

    def __exit__(self, *exc) -> None:
        self.remove()


@dataclasses.dataclass
class Result:
    cmd: list[str]
    limit_bytes: int | None
    memsw_limited: bool
    returncode: int | None  # None: killed for the timeout
    signal: int | None  # the signal that ended the child, if any
    timed_out: bool
    wall_s: float
    peak_bytes: int | None  # memory.max_usage_in_bytes: RSS + page cache + kernel, the whole run
    peak_rss_bytes: int | None  # the child's own ru_maxrss (its largest resident set)
    oom_kills: int
    failcnt: int | None  # times the limit was hit (reclaim happened; not a kill by itself)
    stdout: str | None
    stderr: str | None

    @property
    def status(self) -> str:
        if self.timed_out:
            return "timeout"
        if self.signal is not None:
            return f"killed ({signal.Signals(self.signal).name})" if self.signal in signal.valid_signals() \
                else f"signal {self.signal}"
        return f"exit {self.returncode}"

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["status"] = self.status
        return d


def run_capped(cmd: list[str], limit_bytes: int | None, *, drop_caches_first: bool = False,
               timeout_s: float | None = None, capture: bool = False, env: dict | None = None,
               cwd: str | None = None, parent: str | None = None) -> Result:
    """Run cmd in a fresh child memory cgroup capped at limit_bytes (None: uncapped, measured only).

    The child joins the cgroup before exec, so every page it or its children touch, the page cache
    included, is charged there from the first instruction. Its stdout/stderr are returned when
    capture, else inherited. The cgroup is removed before returning, whatever happens."""
    with MemCgroup(limit_bytes, parent) as cg:
        if drop_caches_first:
            drop_caches()
        with tempfile.TemporaryFile() as fout, tempfile.TemporaryFile() as ferr:
            t0 = time.perf_counter()
            proc = subprocess.Popen(cmd, preexec_fn=cg.add_self, start_new_session=True, env=env, cwd=cwd,
                                    stdout=fout if capture else None, stderr=ferr if capture else None)
            timed_out = False
            try:
                while True:  # wait4 for the child's own rusage (its max RSS), polling for the timeout
                    pid, status, rusage = os.wait4(proc.pid, os.WNOHANG)
                    if pid:
                        break
                    if timeout_s is not None and time.perf_counter() - t0 > timeout_s and not timed_out:
                        timed_out = True
                        os.killpg(proc.pid, signal.SIGKILL)
                    time.sleep(0.02)
            except BaseException:  # Ctrl-C, SIGTERM (as SystemExit): take the child down, then re-raise
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()
                raise
            wall = time.perf_counter() - t0
            proc.returncode = os.waitstatus_to_exitcode(status)  # so Popen does not wait again
            try:  # grandchildren left in the session: end them before reading the peak
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            out = err = None
            if capture:
                fout.seek(0), ferr.seek(0)
                out = fout.read().decode(errors="replace")
                err = ferr.read().decode(errors="replace")
        st = cg.stats()
        rc = proc.returncode
        sig = -rc if rc < 0 else None
        if st["oom_kill"] is not None:
            oom_kills = st["oom_kill"]
        else:  # older kernels: infer from a SIGKILL while the limit was being hit
            oom_kills = int(sig == signal.SIGKILL and not timed_out and (st["failcnt"] or 0) > 0)
        return Result(cmd=list(cmd), limit_bytes=limit_bytes, memsw_limited=cg.memsw,
                      returncode=None if timed_out else rc, signal=None if timed_out else sig, timed_out=timed_out,
                      wall_s=wall, peak_bytes=st["peak_bytes"], peak_rss_bytes=rusage.ru_maxrss * 1024,
                      oom_kills=oom_kills, failcnt=st["failcnt"], stdout=out, stderr=err)


def stale_cgroups(parent: str | None = None) -> list[str]:
    """memcap-* children of this process's memory cgroup whose creating process is gone."""
    parent = parent or own_memory_cgroup()
    out = []
    for name in sorted(os.listdir(parent)):
        m = re.fullmatch(re.escape(PREFIX) + r"(\d+)-[0-9a-f]+", name)
        if m and not os.path.exists(f"/proc/{m.group(1)}"):
            out.append(os.path.join(parent, name))
    return out


def selftest() -> int:
    """A python child touching 200 MB: under a 100M cap it must be OOM-killed, under 400M not."""
    child = [sys.executable, "-c", "b = b'x' * (200 << 20); print(len(b) >> 20, 'MiB touched')"]
    parent = own_memory_cgroup()
    before = set(os.listdir(parent))
    failures = []
    for limit, expect_kill in (("100M", True), ("400M", False)):
        r = run_capped(child, parse_size(limit), capture=True, timeout_s=60)
        killed = r.oom_kills > 0
        ok = killed == expect_kill and (r.signal == signal.SIGKILL if expect_kill else r.returncode == 0)
        print(f"memcap selftest: 200 MB under {limit}: {r.status}, peak {fmt_mib(r.peak_bytes)}, "
              f"OOM kills {r.oom_kills}, memsw limited {r.memsw_limited}: "
              f"{'ok' if ok else 'FAILED'} (expected {'an OOM kill' if expect_kill else 'none'})")
        if not ok:
            failures.append(limit)
        if not expect_kill and r.peak_bytes is not None and r.peak_bytes < (200 << 20):
            print(f"memcap selftest: FAILED: peak {fmt_mib(r.peak_bytes)} is below the 200 MB touched")
            failures.append("peak")
    left = sorted(n for n in set(os.listdir(parent)) - before if n.startswith(PREFIX))
    if left:
        print(f"memcap selftest: FAILED: cgroups left behind: {left}")
        failures.append("cleanup")
    print("memcap selftest: " + ("FAILED" if failures else "passed"))
    return 1 if failures else 0


def _sigterm_to_exit(signum, frame):
    raise SystemExit(128 + signum)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--limit", default=None, help="memory cap, e.g. 900M (binary units); none = uncapped, measured")
    ap.add_argument("--drop-caches", action="store_true", help="sync and drop the page cache first (cold run)")
    ap.add_argument("--timeout", type=float, default=None, help="kill the command after this many seconds")
    ap.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    ap.add_argument("--selftest", action="store_true", help="check OOM detection and cleanup, then exit")
    ap.add_argument("--cleanup-stale", action="store_true", help="remove memcap-* cgroups of dead processes")
    ap.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD [ARG...]")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, _sigterm_to_exit)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    try:
        if args.selftest:
            return selftest()
        if args.cleanup_stale:
            for path in stale_cgroups():
                remove_cgroup(path)
                print(f"removed {path}")
            return 0
        if not cmd:
            ap.error("no command (memcap.py --limit 900M -- CMD ...)")
        limit = parse_size(args.limit) if args.limit else None
        r = run_capped(cmd, limit, drop_caches_first=args.drop_caches, timeout_s=args.timeout)
    except CgroupUnavailable as e:
        print(f"memcap: skipped: {e}", file=sys.stderr)
        return SKIP_STATUS
    except KeyboardInterrupt:
        print("memcap: interrupted; the command was killed and its cgroup removed", file=sys.stderr)
        return 130
    except FileNotFoundError as e:
        print(f"memcap: {e}", file=sys.stderr)
        return 127
    if args.json:
        d = r.to_dict()
        d.pop("stdout"), d.pop("stderr")
        print(json.dumps(d, indent=2))
    print(f"memcap: cap {fmt_mib(limit) if limit else 'none'}{' (RAM+swap)' if r.memsw_limited else ''}: "
          f"{r.status}, {r.wall_s:.2f} s, peak {fmt_mib(r.peak_bytes)} (cgroup, page cache included), "
          f"max RSS {fmt_mib(r.peak_rss_bytes)}, OOM kills {r.oom_kills}, limit hit {r.failcnt} times",
          file=sys.stderr)
    if r.timed_out:
        return 124
    return r.returncode if r.returncode is not None and r.returncode >= 0 else 128 + (r.signal or 0)


if __name__ == "__main__":
    sys.exit(main())
