"""Shared fixtures: end-to-end runs of the real command line on the tiny profile (real offline models, small sample).

The suite runs on two pytest-xdist workers (`make test`: `-n 2`). A run that several test files read is made once per
test session, whichever worker asks first (`shared_run`: a file lock in the session's common temporary folder; the
other worker waits for it and reads the same folder), so read-only tests of one configuration share one run. Each
worker's torch uses one thread (`OMP_NUM_THREADS=1`, set before any test imports torch, and inherited by every run
the tests start), so two workers share the machine's two cores without oversubscribing them.

The runs use the user's converted models. `tiny_run` keeps its generations and scores in a store of its own: float32
forward passes differ in their last bits across torch thread counts (see the README's Determinism), so scores cached in
the user store by another process (an `nbdev_test` kernel, a run with another OMP_NUM_THREADS) would make the
cached-versus-recomputed comparison below fail for a reason that is not this run's.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from filelock import FileLock

if os.environ.get("PYTEST_XDIST_WORKER"):   # parallel workers: one torch thread each (numerics of runs are per-thread-count)
    for _v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"): os.environ.setdefault(_v, "1")

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"


# ---------------------------------------------------------------- the order of the tests: longest files first, two halves
# pytest-xdist's `worksteal` hands the first half of the collected tests to one worker and the second half to the other;
# a worker that runs out steals the tail of the other's queue. The suite is a few dozen command-line runs of 1-8
# minutes among ~500 tests of a second, so in collection order one worker could end minutes after the other, or wait
# idle for a shared run the other is making. Ordered by the durations measured in a full run (tests/durations.json;
# `STEALTH_EVAL_DURATIONS=FILE make test` writes a new one), the test files are dealt longest first, each to the half
# with less work so far, and each half runs its longest files first: the tails that get stolen are short. A file stays
# whole (its module fixtures, such as a benchmark run, are made once), and nothing about a test changes but when it runs.
DURATIONS = Path(__file__).with_name("durations.json")


def order_by_duration(ids: list, durations: dict) -> list:
    """`ids` (node ids, a file's tests consecutive) reordered: the files dealt longest first to two halves by their
    measured seconds, each half longest file first; the first half holds at least len(ids) // 2 tests (xdist's first
    worker takes exactly that many: the rest of the first half, its shortest files, go to the second worker first)."""
    files: dict = {}
    for i in ids: files.setdefault(i.split("::")[0], []).append(i)
    secs = {f: sum(durations.get(i, 0.0) for i in t) for f, t in files.items()}
    halves, work = ([], []), [0.0, 0.0]
    for f in sorted(files, key=lambda f: (-secs[f], f)):
        k = 0 if work[0] <= work[1] else 1
        halves[k].append(f); work[k] += secs[f]
    while sum(len(files[f]) for f in halves[0]) < len(ids) // 2 and halves[1]:   # too few in the first half: its
        halves[0].append(halves[1].pop())                                          # worker would take the second's longest
    return [i for h in halves for f in h for i in files[f]]


def pytest_collection_modifyitems(config, items):
    "Run order: `order_by_duration` with the measured durations (collection order where none are recorded)."
    if not DURATIONS.exists(): return
    durations = json.loads(DURATIONS.read_text())
    by_id = {it.nodeid: it for it in items}
    items[:] = [by_id[i] for i in order_by_duration([it.nodeid for it in items], durations)]


_SPENT: dict = {}


def pytest_runtest_logreport(report):
    _SPENT[report.nodeid] = _SPENT.get(report.nodeid, 0.0) + report.duration   # setup + call + teardown


def pytest_sessionfinish(session):
    "`STEALTH_EVAL_DURATIONS=FILE`: the controller writes each test's seconds (setup, call and teardown) to FILE."
    path = os.environ.get("STEALTH_EVAL_DURATIONS")
    if path and not hasattr(session.config, "workerinput") and _SPENT:
        Path(path).write_text(json.dumps({k: round(v, 1) for k, v in sorted(_SPENT.items())}, indent=0) + "\n")


def cli_env() -> dict:
    "The environment of a command-line run started by a test: no progress bars, no hub."
    return {**os.environ, "STEALTH_EVAL_PROGRESS": "0", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def run_cli(*args, check=True, timeout=1800):
    "Run `python -m stealth_eval.run ARGS` as a user would; return the CompletedProcess."
    p = subprocess.run([sys.executable, "-m", "stealth_eval.run", *map(str, args)], cwd=ROOT, env=cli_env(),
                       capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"stealth-eval {' '.join(map(str, args))} exited {p.returncode}\nSTDOUT:\n{p.stdout[-4000:]}\nSTDERR:\n{p.stderr[-6000:]}")
    return p


def one_error_line(p, prog: str = "") -> str:
    "The one line of a command refused for a user error (exit 2, `stealth-eval[ PROG]: error: ...`): returned for its words."
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    head = f"stealth-eval {prog}: error: " if prog else "stealth-eval: error: "
    assert p.returncode == 2 and len(lines) == 1 and lines[0].startswith(head), (p.returncode, p.stderr[-3000:])
    return lines[0]


def nbs_digest():
    import hashlib
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted((ROOT / "nbs").glob("*.ipynb"))}


def shared_dir(tmp_path_factory) -> Path:
    "The temporary folder every xdist worker of this test session sees (the session's own folder without xdist)."
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def shared_run(tmp_path_factory, name: str, make) -> dict:
    """`make(folder) -> dict` (JSON-serialisable) run once per test session under a lock, whichever worker asks first;
    every caller gets the same dict. A failed `make` leaves no record, so each caller sees the failure itself."""
    root = shared_dir(tmp_path_factory) / "shared_runs"
    root.mkdir(exist_ok=True)
    with FileLock(str(root / f"{name}.lock")):
        rec = root / f"{name}.json"
        if rec.exists(): return json.loads(rec.read_text())
        folder = root / name
        folder.mkdir()
        res = make(folder)
        rec.write_text(json.dumps(res, default=str))
        return json.loads(rec.read_text())


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    "One end-to-end run of the tiny profile with its own store; returns its folder, store, output and nbs digests."
    def make(d):
        out, store = d / "out", d / "store"
        before = nbs_digest()
        p = run_cli("--profile", "tiny", "--out_dir", out, "--offline", "--cache_dir", store)
        return {"out": out, "store": store, "stdout": p.stdout, "stderr": p.stderr, "nbs_before": before, "nbs_after": nbs_digest()}
    r = shared_run(tmp_path_factory, "tiny_run", make)
    return {**r, "out": Path(r["out"]), "store": Path(r["store"])}


# The smallest configuration that still shows a whole run's mechanisms (generation, a homoglyph attack with its
# sanitize defense, two detectors that read one panel pass, calibration, every table and figure): for tests that compare
# a run made another way (Ray, a resume after SIGKILL) with a reference run, byte for byte. A third of the tiny run's work.
SMALL = ["--profile", "tiny", "--methods", "m0", "m5", "--detectors", "log_likelihood", "fast_detectgpt",
         "--set", "data.n_per_class=4"]


@pytest.fixture(scope="session")
def small_run_nocache(tmp_path_factory):
    "The SMALL configuration computed from scratch (the cache neither read nor written): the reference of those tests."
    def make(d):
        run_cli(*SMALL, "--out_dir", d / "out", "--no_cache")
        return {"out": d / "out"}
    return Path(shared_run(tmp_path_factory, "small_run_nocache", make)["out"])


@pytest.fixture(scope="session")
def small_run_resumed(tmp_path_factory):
    """The SMALL configuration with a store of its own, written as it computes, killed (SIGKILL: the runner and its
    stage kernel) once 10 panel scores are stored, then run again to the end on that store. Beside `small_run_nocache`:
    a run resumed after a kill, and a run whose values come from its store (those stored before the kill) and from the
    computation (the rest), against one that recomputes everything (resume; determinism)."""
    import signal
    import time
    def make(d):
        store, out = d / "store", d / "out"
        proc = subprocess.Popen([sys.executable, "-m", "stealth_eval.run", *SMALL, "--cache_dir", str(store), "--out_dir", str(out)],
                                cwd=ROOT, env=cli_env(), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
        panel, deadline = store / "lm_panel", time.time() + 600
        while time.time() < deadline and proc.poll() is None and len(list(panel.rglob("*.json"))) < 10:
            time.sleep(0.2)
        alive = proc.poll() is None
        if alive: os.killpg(proc.pid, signal.SIGKILL)          # mid-scoring: the runner and its notebook kernel
        proc.wait()
        rec = {"out": out, "alive_at_kill": alive, "n_stored": len(list(panel.rglob("*.json"))),
               "metrics_after_kill": (out / "metrics.json").exists()}
        run_cli(*SMALL, "--cache_dir", store, "--out_dir", out)
        return rec
    r = shared_run(tmp_path_factory, "small_run_resumed", make)
    return {**r, "out": Path(r["out"])}


@pytest.fixture
def warm_store(tiny_run, tmp_path):
    """A copy of the tiny run's content store: a run of the tiny profile on the same texts reads its generations and
    scores instead of recomputing them (for tests of what a run does with its inputs, not of the computation)."""
    import shutil
    return Path(shutil.copytree(tiny_run["store"], tmp_path / "warm_store"))


ARTIFACTS = ["data/lee_news.jsonl", "raw_outputs.jsonl", "scores.parquet", "quality.parquet", "metrics.json",
             "thresholds.json", "quality_summary.json", "tables/table_main_lee_news.md", "tables/table_main_lee_news.tex",
             "tables/table_sanitize.md", "qual_examples.md", "figures/fig_heatmap_t1f.png", "figures/fig_sanitize.png",
             "metrics.parquet", "acceptance.md"]   # results.json is left out: it holds the run's configuration (out_dir, cache_dir)


def same_artifacts(a, b):
    "Byte-identical artifacts (run_info.json and executed notebooks carry timestamps and are left out)."
    diff = [f for f in ARTIFACTS if (Path(a) / f).read_bytes() != (Path(b) / f).read_bytes()]
    assert not diff, f"artifacts differ: {diff}"


def read_json(p):
    return json.loads(Path(p).read_text(encoding="utf-8"))
