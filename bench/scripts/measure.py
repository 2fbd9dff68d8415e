#!/usr/bin/env python3
"""Reproducible measurements of `infergate-bench bench` against `infergate-bench mock`.

    bench/scripts/measure.py accuracy     # make bench-accuracy
    bench/scripts/measure.py capacity     # make bench-capacity
    bench/scripts/measure.py crosscheck   # make bench-crosscheck (AIPerf)

Each run starts its own `bin/infergate-bench mock` on a free loopback port, runs
`bin/infergate-bench bench --json` (or AIPerf) against it, scrapes the mock's
/metrics, stops the mock, and prints markdown tables (the ones in
docs/benchmarking.md). Every run holds /tmp/infergate-measure.lock (flock(2),
the same lock as `flock /tmp/infergate-measure.lock CMD`) so measurements on a
shared machine never overlap, and first waits for the machine to be quiet
(other processes using under --quiet-busy cores), so a compile next door does
not end up in the numbers. Each configuration is repeated --reps times and
the median of each figure is reported.

Only the Python standard library is used (AIPerf itself lives in its own
venv, see bench/scripts/install-aiperf.sh).
"""

import argparse
import contextlib
import fcntl
import functools
import json
import os
import platform
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("INFERGATE_BENCH_BIN", os.path.join(ROOT, "bin", "infergate-bench"))
LOCK = "/tmp/infergate-measure.lock"
CLK_TCK = os.sysconf("SC_CLK_TCK")


def log(*a):
    print("[measure]", *a, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------
# The machine
# ---------------------------------------------------------------------------


def machine():
    model = "?"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    go = subprocess.run(["go", "version"], capture_output=True, text=True).stdout.strip()
    return f"{os.cpu_count()} cores (`nproc`), {model}, Linux {platform.release()}, {go}"


def cpu_times():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + v[4]
    return idle, sum(v[:8])  # user nice system idle iowait irq softirq steal


def busy_cores(interval=1.0):
    i0, t0 = cpu_times()
    time.sleep(interval)
    i1, t1 = cpu_times()
    return (1 - (i1 - i0) / max(t1 - t0, 1)) * os.cpu_count()


def wait_quiet(max_busy, timeout):
    """Wait until the machine uses at most max_busy cores (1 s samples)."""
    start = time.monotonic()
    said = -1
    while True:
        b = busy_cores()
        waited = time.monotonic() - start
        if b <= max_busy:
            return b
        if waited > timeout:
            log(f"machine still busy ({b:.2f} cores) after {timeout:.0f} s; measuring anyway")
            return b
        if int(waited) // 30 != said:
            said = int(waited) // 30
            log(f"waiting for a quiet machine: {b:.2f} of {os.cpu_count()} cores busy")


@contextlib.contextmanager
def measurement(opts):
    """Hold the shared measurement lock, on a quiet machine."""
    with open(LOCK, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            wait_quiet(opts.quiet_busy, opts.quiet_timeout)
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


class Foreign:
    """CPU the rest of the machine used during a run: all busy CPU time
    (/proc/stat) minus what our own processes used."""

    def __init__(self):
        self.i0, self.t0 = cpu_times()
        self.w0 = time.monotonic()

    def cores(self, own_cpu_s):
        i1, t1 = cpu_times()
        busy_s = ((t1 - self.t0) - (i1 - self.i0)) / CLK_TCK
        return max(busy_s - own_cpu_s, 0) / max(time.monotonic() - self.w0, 1e-9)


def proc_cpu(pid):
    """utime + stime of pid, in seconds (/proc/<pid>/stat fields 14 and 15)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


# ---------------------------------------------------------------------------
# Processes
# ---------------------------------------------------------------------------


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


class Mock:
    def __init__(self, args, env=None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.TemporaryFile()
        self.p = subprocess.Popen([BIN, "mock", "--listen", f"127.0.0.1:{self.port}", *args],
                                  stdout=subprocess.DEVNULL, stderr=self.log, env=env)
        for _ in range(200):
            with contextlib.suppress(OSError):
                get(self.url + "/healthz", 1)
                return
            if self.p.poll() is not None:
                break
            time.sleep(0.025)
        self.stop()
        self.log.seek(0)
        raise RuntimeError("mock did not start: " + self.log.read().decode())

    def metrics(self):
        return get(self.url + "/metrics")

    def cpu(self):
        return proc_cpu(self.p.pid)

    def stop(self):
        if self.p.poll() is None:
            self.p.terminate()
            try:
                self.p.wait(10)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()


def run_timed(cmd, env=None, stdout=subprocess.DEVNULL):
    """Run cmd; return (exit status, CPU seconds of the process and its
    children, wall seconds, stderr text)."""
    err = tempfile.TemporaryFile()
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=stdout, stderr=err, env=env)
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.monotonic() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    err.seek(0)
    return p.returncode, ru.ru_utime + ru.ru_stime, wall, err.read().decode(errors="replace")


def bench(target, args, env=None):
    """Run `infergate bench` against target; return its report, plus the
    bench process's CPU seconds and wall time."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        code, cpu, wall, err = run_timed([BIN, "bench", "--target", target, "--json", out.name, *args], env=env)
        if code != 0:
            raise RuntimeError(f"bench failed ({code}): {err[-2000:]}")
        rep = json.load(out)
    rep["_cpu_s"], rep["_wall_s"] = cpu, wall
    return rep


def histogram(text, name):
    """Cumulative buckets [(le, count)] of a Prometheus histogram."""
    out = []
    for m in re.finditer(rf'^{re.escape(name)}_bucket{{le="([^"]+)"}} (\S+)$', text, re.M):
        out.append((float(m.group(1)), float(m.group(2))))
    return out


def hist_quantile(buckets, q):
    """Prometheus' histogram_quantile: linear within the bucket."""
    if not buckets or buckets[-1][1] == 0:
        return float("nan")
    rank = q * buckets[-1][1]
    lo, below = 0.0, 0.0
    for le, c in buckets:
        if c >= rank:
            if le == float("inf"):
                return lo
            return lo + (le - lo) * (rank - below) / max(c - below, 1e-12)
        lo, below = le, c
    return lo


def lateness(mock):
    b = histogram(mock.metrics(), "infergate_mock_emit_lateness_seconds")
    return {"p50": hist_quantile(b, 0.5) * 1e3, "p99": hist_quantile(b, 0.99) * 1e3, "n": b[-1][1] if b else 0}


def med(xs):
    xs = [x for x in xs if x == x]
    return statistics.median(xs) if xs else float("nan")


def fmt(x, nd=2):
    if isinstance(x, str):
        return x
    if x != x:
        return "–"
    return f"{x:,.{nd}f}"


def table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---:" if i else "---" for i in range(len(header))) + "|"]
    for r in rows:
        lines.append("| " + " | ".join(fmt(c) for c in r) + " |")
    return "\n".join(lines)


def need_binary():
    if not os.access(BIN, os.X_OK):
        sys.exit(f"{BIN} missing: run `make build-bench` first")


# ---------------------------------------------------------------------------
# One measured run
# ---------------------------------------------------------------------------


def measured(opts, mock_args, client):
    """Run client(mock) against a fresh mock, holding the lock on a quiet
    machine. If other processes used more than --max-foreign cores during
    the run, it is done again (at most --retries times)."""
    for attempt in range(opts.retries + 1):
        with measurement(opts):
            fo = Foreign()
            m = Mock(mock_args)
            try:
                out = client(m)
                late = lateness(m)
                mcpu = m.cpu()
            finally:
                m.stop()
            foreign = fo.cores(mcpu + out["_cpu_s"])
        out.update(_late=late, _mock_cpu=mcpu, _foreign=foreign)
        if foreign <= opts.max_foreign:
            break
        log(f"other processes used {foreign:.2f} cores during the run" +
            ("; again" if attempt < opts.retries else "; keeping it"))
    return out


def run_bench(opts, mock_args, bench_args, save_as):
    def client(m):
        rep = bench(m.url, bench_args)
        with open(os.path.join(opts.save, save_as), "w") as f:
            json.dump(rep, f)
        return rep
    return measured(opts, mock_args, client)


def errors(mt):
    return f"{mt['errors']['total']}/{mt['requests']['sent']}"


def build_transit(opts):
    path = os.path.join(opts.save, "transit")
    subprocess.run(["go", "build", "-o", path, "./scripts/transit"], cwd=os.path.join(ROOT, "bench"), check=True)
    return path


def run_transit(opts, transit, mock_args, ttft, itl, args, save_as):
    """The bench run of args again, through bench/scripts/transit against a
    mock stamping every event: the error split into the mock's and the
    generator's."""
    flags = dict(zip(args[::2], args[1::2]))

    def client(m):
        cmd = [transit, "--target", m.url, "--ttft", f"{ttft}ms", "--itl", f"{itl}ms",
               "--concurrency", flags["--concurrency"], "--requests", flags["--requests"],
               "--warmup", flags["--warmup"], "--ramp-up", flags.get("--ramp-up", "0s")]
        with tempfile.TemporaryFile() as out:
            code, cpu, wall, err = run_timed(cmd, stdout=out)
            if code != 0:
                raise RuntimeError(f"transit failed ({code}): {err[-2000:]}")
            out.seek(0)
            rep = json.load(out)
        with open(os.path.join(opts.save, save_as), "w") as f:
            json.dump(rep, f)
        rep["_cpu_s"], rep["_wall_s"] = cpu, wall
        return rep
    return measured(opts, mock_args + ["--emit-timestamps"], client)


def pick(reps, *path):
    return med([functools.reduce(lambda d, k: d[k], path, x) for x in reps])


WORKLOAD = ["--input-tokens", "32", "--output-tokens", "32", "--model", "demo"]
CADENCE = ["--ttft", "100ms", "--itl", "20ms"]
NO_DELAY = ["--ttft", "-1ns", "--itl", "-1ns"]  # negative: no delay at all (mock.Config.WithDefaults)


def header(opts, title, command):
    print(f"### {title}\n")
    print(f"`{command}` on {machine()}; each figure is the median of {opts.reps} runs "
          f"(raw reports in {opts.save}).\n")


# ---------------------------------------------------------------------------
# accuracy
# ---------------------------------------------------------------------------


def accuracy(opts):
    runs = [
        ("256 streams, starts spread over 1 s", CADENCE, 100, 20,
         ["--concurrency", "256", "--ramp-up", "1s", "--warmup", "256", "--requests", "1024"]),
        ("256 streams, all started at once", CADENCE, 100, 20,
         ["--concurrency", "256", "--warmup", "256", "--requests", "1024"]),
        ("open loop: 355 requests/s, constant arrivals (≈ 256 streams)", CADENCE, 100, 20,
         ["--rate", "355", "--arrival", "constant", "--warmup", "2s", "--requests", "1024"]),
        ("noise floor: zero-delay mock, 1 stream", NO_DELAY, 0, 0,
         ["--concurrency", "1", "--warmup", "100", "--requests", "2000"]),
    ]
    rows, verdicts = [], []
    for i, (name, mock_args, ttft, itl, args) in enumerate(runs):
        reps = []
        for r in range(opts.reps):
            log(f"accuracy: {name}, run {r + 1}/{opts.reps}")
            reps.append(run_bench(opts, mock_args, args + WORKLOAD, f"accuracy-{i}-{r}.json"))
        m = [x["metrics"] for x in reps]
        col = lambda f: med([f(x) for x in m])
        ttft50, ttft99 = col(lambda x: x["ttft_ms"]["p50"]), col(lambda x: x["ttft_ms"]["p99"])
        itl50, itl99 = col(lambda x: x["itl_ms"]["p50"]), col(lambda x: x["itl_ms"]["p99"])
        late50, late99 = med([x["_late"]["p50"] for x in reps]), med([x["_late"]["p99"] for x in reps])
        rows.append([name, ttft, ttft50, ttft99, itl, itl50, itl99, ttft50 - ttft, itl99 - itl,
                     col(lambda x: x["schedule_lag_ms"]["p50"]), col(lambda x: x["schedule_lag_ms"]["p99"]),
                     late50, late99, " ".join(errors(x) for x in m), med([x["_foreign"] for x in reps])])
        if ttft:
            verdicts.append(
                f"- {name}: TTFT p50 error **{ttft50 - ttft:.2f} ms** (target < 1 ms: "
                f"{'met' if ttft50 - ttft < 1 else 'NOT met'}), ITL p99 error **{itl99 - itl:.2f} ms** "
                f"(target < 2 ms: {'met' if itl99 - itl < 2 else 'NOT met'}); the mock's own emit lateness "
                f"p50 {late50:.3f} ms, p99 {late99:.3f} ms is part of both.")
    # The same two 256-stream runs again with the mock stamping each event
    # (--emit-timestamps) and bench/scripts/transit comparing every event's
    # arrival with its stamp: the error split into the mock's and the
    # generator's.
    transit = build_transit(opts)
    split = []
    for i, (name, mock_args, ttft, itl, args) in enumerate(runs[:2]):
        reps = []
        for r in range(opts.reps):
            log(f"accuracy, split by emit stamps: {name}, run {r + 1}/{opts.reps}")
            reps.append(run_transit(opts, transit, mock_args, ttft, itl, args, f"transit-{i}-{r}.json"))
        g = lambda *path: pick(reps, *path)
        split.append([name, g("client", "ttft_err_ms", "p50"), g("mock", "ttft_err_ms", "p50"),
                      g("generator", "ttft_ms", "p50"), g("client", "itl_err_ms", "p99"),
                      g("mock", "itl_err_ms", "p99"), g("generator", "itl_err_ms", "p99"),
                      g("generator", "transit_ms", "p50"), g("generator", "transit_ms", "p99"),
                      med([x["_foreign"] for x in reps])])

    header(opts, "Accuracy against the fixed-cadence mock", "make bench-accuracy")
    print(table(["run", "TTFT set", "TTFT p50", "TTFT p99", "ITL set", "ITL p50", "ITL p99",
                 "TTFT p50 − set", "ITL p99 − set", "send lag p50", "send lag p99", "mock late p50",
                 "mock late p99", "errors",
                 "others' load (cores)"], rows))
    print()
    for i, v in enumerate(verdicts):
        if i < len(split):
            v += (f" The generator's own part, from the emit stamps: TTFT p50 {split[i][3]:.2f} ms, "
                  f"ITL p99 {split[i][6]:.2f} ms.")
        print(v)
    print("\n**Where the error comes from**, event by event: the same runs with the mock stamping every "
          "event with its clock just before writing it (`--emit-timestamps`), read by the same load "
          "generator (`bench/scripts/transit`, which keeps each stream as read and compares each event's "
          "arrival with its stamp).\n")
    print(table(["run", "TTFT p50 − set", "mock: 1st token − role chunk − set",
                 "generator: way in + parse + way back", "ITL p99 − set", "mock: emit gap p99 − set",
                 "generator: arrival gap − emit gap, p99", "transit p50", "transit p99",
                 "others' load (cores)"], split))
    print("\nAll times in ms. 32-word prompts, 32 output tokens (one token per event), streaming. "
          "*mock late* is the mock's own emit lateness (deadline → flush, from its /metrics histogram), "
          "which the client sees as part of TTFT and ITL. *send lag* is the generator's schedule lag "
          "(intended → actual send: the open loop's schedule, or a closed-loop user becoming free). "
          "Client percentiles are HDR buckets (at 100 ms "
          "a bucket is 64 µs wide and the top of the bucket is reported).")


# ---------------------------------------------------------------------------
# capacity
# ---------------------------------------------------------------------------


def capacity(opts):
    rows, best, best_gen = [], None, None
    transit = build_transit(opts)
    for c in opts.levels:
        reps = []
        for r in range(opts.reps):
            log(f"capacity: {c} streams, run {r + 1}/{opts.reps}")
            args = ["--concurrency", str(c), "--ramp-up", "1s", "--warmup", str(c), "--requests", str(3 * c)]
            reps.append(run_bench(opts, CADENCE, args + WORKLOAD, f"capacity-{c}-{r}.json"))
        m = [x["metrics"] for x in reps]
        col = lambda f: med([f(x) for x in m])
        # Steady state of a closed loop (Little's law): each of the c users
        # has one request in flight, 32 content events per request.
        events = col(lambda x: c * 32 / ((x["e2e_ms"]["mean"] + x["schedule_lag_ms"]["mean"]) / 1000))
        # CPU per 1000 content events over the whole run (ramp, warm-up and
        # cool-down included): the mock counts every event it emitted.
        per_k = med([x["_cpu_s"] / x["_late"]["n"] * 1000 * 1000 for x in reps])
        mock_per_k = med([x["_mock_cpu"] / x["_late"]["n"] * 1000 * 1000 for x in reps])
        ttft_err, itl_err = col(lambda x: x["ttft_ms"]["p50"]) - 100, col(lambda x: x["itl_ms"]["p99"]) - 20
        split = []
        for r in range(opts.reps):
            log(f"capacity, split by emit stamps: {c} streams, run {r + 1}/{opts.reps}")
            split.append(run_transit(opts, transit, CADENCE, 100, 20, args, f"capacity-transit-{c}-{r}.json"))
        failed = sum(x["errors"]["total"] for x in m)
        ok = ttft_err < 1 and itl_err < 2 and failed == 0
        if ok:
            best = (c, events)
        lag99 = col(lambda x: x["schedule_lag_ms"]["p99"])
        if pick(split, "generator", "itl_err_ms", "p99") < 2 and lag99 < 1 and failed == 0:
            best_gen = (c, events)
        rows.append([str(c), f"{events:,.0f}", ttft_err, itl_err, col(lambda x: x["schedule_lag_ms"]["p99"]),
                     med([x["_late"]["p99"] for x in reps]), pick(split, "mock", "itl_err_ms", "p99"),
                     pick(split, "generator", "itl_err_ms", "p99"), pick(split, "generator", "transit_ms", "p99"),
                     med([x["_cpu_s"] / x["_wall_s"] for x in reps]), per_k,
                     med([x["_mock_cpu"] / x["_wall_s"] for x in reps]), mock_per_k,
                     " ".join(errors(x) for x in m), "yes" if ok else "no",
                     med([x["_foreign"] for x in reps])])
    header(opts, "Capacity of the generator (bench and mock sharing the machine)", "make bench-capacity")
    print(table(["streams", "content events/s (c·32/E2E)", "TTFT p50 err", "ITL p99 err", "send lag p99",
                 "mock late p99", "split: mock ITL p99 err", "split: generator ITL p99 err", "split: transit p99",
                 "bench CPU (cores)", "bench CPU ms / 1000 events", "mock CPU (cores)",
                 "mock CPU ms / 1000 events", "errors", "accurate", "others' load (cores)"], rows))
    print()
    if best:
        print(f"Most streams meeting the accuracy targets (TTFT p50 error < 1 ms, ITL p99 error < 2 ms, "
              f"no errors): **{best[0]} streams, {best[1]:,.0f} content events/s**.")
    else:
        print("No level met the accuracy targets.")
    if best_gen:
        print(f"\nMost streams at which the generator's own part stays within them (its ITL p99 error from "
              f"the emit stamps < 2 ms, send lag p99 < 1 ms, no errors): **{best_gen[0]} streams, "
              f"{best_gen[1]:,.0f} content events/s**.")
    print("\nMock: TTFT 100 ms, ITL 20 ms, 32 output tokens (one per event); bench: closed loop, users "
          "started over 1 s, warm-up of one request per user, 3 measured requests per user. Errors are "
          "TTFT p50 − 100 ms and ITL p99 − 20 ms, in ms. *send lag* is the closed loop's schedule lag "
          "(a user free → its next request written). CPU is utime + stime of each process over its "
          "whole run (getrusage for the bench, /proc/<pid>/stat for the mock) per 1000 content events "
          "the mock emitted; each request also carries 4 framing events (role, finish, usage, [DONE]). "
          "The *split* columns come from the same runs again with the mock stamping its events and "
          "`bench/scripts/transit` comparing arrivals with stamps (see the accuracy section): the ITL "
          "error of the mock's emission, the generator's own (arrival gap − emit gap) and the events' "
          "transit (arrival − stamp).")


# ---------------------------------------------------------------------------
# crosscheck: the same workload through NVIDIA AIPerf
# ---------------------------------------------------------------------------


def install_aiperf():
    out = subprocess.run([os.path.join(ROOT, "bench", "scripts", "install-aiperf.sh")],
                         stdout=subprocess.PIPE, text=True, check=True).stdout
    env = dict(line.split("=", 1) for line in out.split())
    return env["AIPERF"], env["AIPERF_TOKENIZER"]


def aiperf_version(aiperf):
    py = os.path.join(os.path.dirname(aiperf), "python")
    return subprocess.run([py, "-c", "import importlib.metadata as m; print(m.version('aiperf'))"],
                          capture_output=True, text=True).stdout.strip()


def run_aiperf(opts, aiperf, tokenizer, concurrency, requests, save_as):
    def client(m):
        art = os.path.join(opts.save, save_as)
        shutil.rmtree(art, ignore_errors=True)
        cmd = [aiperf, "profile", "--model", "demo", "--url", m.url, "--endpoint-type", "chat", "--streaming",
               "--concurrency", str(concurrency), "--request-count", str(requests),
               "--warmup-request-count", str(concurrency),
               "--isl", "32", "--isl-stddev", "0", "--osl", "32", "--osl-stddev", "0",
               # what `infergate bench` sends with max_tokens: exactly that many tokens
               "--extra-inputs", "min_tokens:32", "--extra-inputs", "ignore_eos:true",
               "--tokenizer", tokenizer, "--random-seed", "1",
               "--no-server-metrics", "--no-gpu-telemetry", "--ui-type", "none", "--artifact-dir", art]
        env = dict(os.environ, HF_HUB_DISABLE_TELEMETRY="1", DO_NOT_TRACK="1")
        code, cpu, wall, err = run_timed(cmd, env=env)
        path = os.path.join(art, "profile_export_aiperf.json")
        if code != 0 or not os.path.exists(path):
            raise RuntimeError(f"aiperf failed ({code}): {err[-3000:]}")
        with open(path) as f:
            rep = json.load(f)
        rep["_cpu_s"], rep["_wall_s"] = cpu, wall
        return rep
    return measured(opts, CADENCE, client)


def crosscheck(opts):
    aiperf, tokenizer = install_aiperf()
    version = aiperf_version(aiperf)
    header(opts, f"Cross-check with NVIDIA AIPerf {version}", "make bench-crosscheck")
    print(f"Both tools against the same mock (TTFT 100 ms, ITL 20 ms), one after the other (order alternating "
          f"run by run), with the same workload: closed loop, warm-up of one request per user, 32-token "
          f"prompts, exactly 32 output tokens, streaming. AIPerf counts tokens with a word-level tokenizer "
          f"(one token per word, as the mock and `infergate bench` do; built offline by "
          f"`bench/scripts/install-aiperf.sh`). *Truth* is what the mock did: its schedule plus its own "
          f"emit lateness (median).\n")
    for concurrency, requests in opts.crosscheck:
        ours, theirs = [], []
        for r in range(opts.reps):
            log(f"crosscheck: concurrency {concurrency}, run {r + 1}/{opts.reps}")
            args = ["--concurrency", str(concurrency), "--warmup", str(concurrency), "--requests", str(requests)]
            jobs = [lambda: ours.append(run_bench(opts, CADENCE, args + WORKLOAD, f"cross-{concurrency}-{r}.json")),
                    lambda: theirs.append(run_aiperf(opts, aiperf, tokenizer, concurrency, requests,
                                                     f"aiperf-{concurrency}-{r}"))]
            for job in (jobs if r % 2 == 0 else jobs[::-1]):
                job()
        o = lambda f: med([f(x["metrics"]) for x in ours])
        a = lambda f: med([f(x) for x in theirs])
        late = med([x["_late"]["p50"] for x in ours + theirs])
        rows = []

        def row(name, mine, aip, truth, note, judge=True):
            d = (aip - mine) / mine * 100 if mine else float("nan")
            rows.append([name, mine, aip, truth, f"{d:+.1f} %", ("yes" if abs(d) <= 5 else "no") if judge else "—",
                         note])

        row("TTFT p50 (ms)", o(lambda m: m["ttft_ms"]["p50"]), a(lambda x: x["time_to_first_token"]["p50"]),
            100 + late, "same definition (first content chunk)")
        late99 = med([x["_late"]["p99"] for x in ours + theirs])
        row("TTFT p99 (ms)", o(lambda m: m["ttft_ms"]["p99"]), a(lambda x: x["time_to_first_token"]["p99"]),
            100 + late99, "truth: the mock's p99 lateness over all events")
        row("TTFT mean (ms)", o(lambda m: m["ttft_ms"]["mean"]), a(lambda x: x["time_to_first_token"]["avg"]),
            float("nan"), "")
        row("ITL p50 (ms): ours `itl_ms` = AIPerf ICL", o(lambda m: m["itl_ms"]["p50"]),
            a(lambda x: x["inter_chunk_latency"]["p50"]), 20, "same definition (every gap, pooled)")
        row("ITL p99 (ms): ours `itl_ms` = AIPerf ICL", o(lambda m: m["itl_ms"]["p99"]),
            a(lambda x: x["inter_chunk_latency"]["p99"]), float("nan"), "")
        row("TPOT p50 (ms): ours `tpot_ms` = AIPerf ITL", o(lambda m: m["tpot_ms"]["p50"]),
            a(lambda x: x["inter_token_latency"]["p50"]), 20,
            "(E2E − TTFT)/(N − 1); our E2E ends at [DONE], AIPerf's at the last content chunk")
        row("E2E p50 (ms): ours `e2e_ms` = AIPerf request latency", o(lambda m: m["e2e_ms"]["p50"]),
            a(lambda x: x["request_latency"]["p50"]), 100 + 31 * 20 + late, "ends at [DONE] / last chunk")
        row("requests/s", o(lambda m: m["throughput"]["requests_per_s"]),
            a(lambda x: x["request_throughput"]["avg"]), float("nan"),
            "both: first measured send → last measured response")
        row("output tokens/s", o(lambda m: m["throughput"]["output_tokens_per_s"]),
            a(lambda x: x["output_token_throughput"]["avg"]), float("nan"),
            "ours from `usage`, AIPerf from its tokenizer")
        row("output tokens per request", o(lambda m: m["output_tokens"] / max(m["requests"]["succeeded"], 1)),
            a(lambda x: x["output_sequence_length"]["avg"]), 32, "")
        row("client CPU, s per run", med([x["_cpu_s"] for x in ours]), med([x["_cpu_s"] for x in theirs]),
            float("nan"), "whole process, start-up included (AIPerf: with its service processes)", judge=False)
        print(f"**Concurrency {concurrency}, {requests} requests**\n")
        print(table(["metric", "infergate bench", "AIPerf", "truth (mock)", "AIPerf − ours", "within 5 %", "note"],
                    rows))
        send = a(lambda x: x.get("http_req_sending", {}).get("p50", float("nan")))
        wait = a(lambda x: x.get("http_req_waiting", {}).get("p50", float("nan")))
        print(f"\nAIPerf's own HTTP trace, p50: sending {send:.2f} ms, waiting (to the first byte, which the "
              f"mock sends at once) {wait:.2f} ms. Others' load during the runs: "
              f"{med([x['_foreign'] for x in ours + theirs]):.2f} cores.\n")


# ---------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["accuracy", "capacity", "crosscheck"])
    ap.add_argument("--reps", type=int, default=3, help="runs per configuration; the median is reported (3)")
    ap.add_argument("--levels", default="128,256,320,384,448,512,768,1024,1536",
                    help="capacity: concurrency levels (128,256,320,384,448,512,768,1024,1536)")
    ap.add_argument("--crosscheck", default="1:32,16:256",
                    help="crosscheck: CONCURRENCY:REQUESTS workloads (1:32,16:256)")
    ap.add_argument("--quiet-busy", type=float, default=0.3,
                    help="before a run, wait until the machine uses at most this many cores (0.3)")
    ap.add_argument("--quiet-timeout", type=float, default=600, help="... for at most this many seconds (600)")
    ap.add_argument("--max-foreign", type=float, default=0.15,
                    help="redo a run if other processes used more than this many cores during it (0.15)")
    ap.add_argument("--retries", type=int, default=3, help="... at most this many times (3)")
    ap.add_argument("--save", help="directory for the raw reports (default: a new one under $TMPDIR)")
    opts = ap.parse_args()
    opts.levels = [int(x) for x in opts.levels.split(",")]
    opts.crosscheck = [tuple(int(y) for y in x.split(":")) for x in opts.crosscheck.split(",")]
    need_binary()
    if not opts.save:
        opts.save = tempfile.mkdtemp(prefix=f"infergate-{opts.what}-")
    os.makedirs(opts.save, exist_ok=True)
    {"accuracy": accuracy, "capacity": capacity, "crosscheck": crosscheck}[opts.what](opts)


if __name__ == "__main__":
    main()
