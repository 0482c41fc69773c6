"""Ctrl-C and SIGTERM at any moment of a run, and exit codes that say whose fault a failure is (issues #29, #24.5, #25.5).

Every interruption is placed by what the run has written, never by a guess about how long something takes: the test
reads the run's stderr and signals right after the k-th line (the runner's log lines and the stages' output), or a
random delay after a stage's start line. A CPU-burning companion process runs beside, the load under which a Ctrl-C
used to be lost. Each interrupted run must exit 130 with exactly one line besides the log, and mark the stage it
stopped in (or was about to start) as `interrupted` in run_info.json, every earlier stage `ok`.

Two pipelines are interrupted. Stand-in stage notebooks (`--nbs_dir`: each logs three lines from three cells) make a
whole run take ~10 s through the real runner, papermill and kernels, so every phase (before a stage, the kernel's
start, a cell, between cells, writing the executed notebook, between stages) is hit at every line. The real tiny
pipeline (`--methods m0 m5`, two detectors, a warm copy of the session's `tiny_run` store) is interrupted at a few
points, and its last rerun must reproduce an uninterrupted run's artifacts byte for byte.
By default a subset of the points runs (CI); `STEALTH_EVAL_STRESS=1` runs every line and 20 random delays.
"""
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, run_cli, same_artifacts

STRESS = os.environ.get("STEALTH_EVAL_STRESS") == "1"
STAGES = ["00_data", "10_methods", "20_detectors", "30_calibration_metrics", "40_figures"]
LOG_LINE = re.compile(r"^\d\d:\d\d:\d\d (DEBUG|INFO|WARNING) ")     # the log format of the runner and of the stages
ENV = {**os.environ, "STEALTH_EVAL_PROGRESS": "0", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def _args(out, store, *extra):
    return ["--profile", "tiny", "--methods", "m0", "m5", "--detectors", "log_likelihood", "fast_detectgpt",
            "--offline", "--out_dir", str(out), "--cache_dir", str(store), *map(str, extra)]


def _start(args, env=None):
    "The command line as a user starts it from a terminal: its own process group, which Ctrl-C signals as a whole."
    return subprocess.Popen([sys.executable, "-m", "stealth_eval.run", *args], cwd=ROOT, env=env or ENV, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)


@pytest.fixture(scope="module")
def warm(tiny_run, tmp_path_factory):
    "A copy of the tiny run's store, and the artifacts of one uninterrupted run of the restricted configuration on it."
    base = tmp_path_factory.mktemp("interrupts")
    store, ref = base / "store", base / "ref"
    shutil.copytree(tiny_run["store"], store)
    p = run_cli(*_args(ref, store))
    return {"store": store, "ref": ref, "lines": [l for l in p.stderr.splitlines() if l.strip()]}


@pytest.fixture
def busy():
    "A companion process that burns one core for as long as the test runs."
    p = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    yield p
    p.kill(); p.wait()


def _write_stand_in_stages(d: Path) -> Path:
    "Five stage notebooks that each log three lines from three cells (the last one writes an empty metrics.json)."
    import nbformat
    d.mkdir(parents=True, exist_ok=True)
    for nb in STAGES:
        cells = [nbformat.v4.new_code_cell("#| hide\nimport time\nfrom pathlib import Path\nfrom stealth_eval.core import get_logger"),
                 nbformat.v4.new_code_cell('config_path: str = ""  # the run', metadata={"tags": ["parameters"]})]
        cells += [nbformat.v4.new_code_cell(f'#| notest\nget_logger().info("{nb} cell {i}")\ntime.sleep(0.3)') for i in range(3)]
        if nb == STAGES[-1]: cells.append(nbformat.v4.new_code_cell('#| notest\n(Path(config_path).parent / "metrics.json").write_text("{}")'))
        nbformat.write(nbformat.v4.new_notebook(cells=cells, metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}),
                       str(d / f"{nb}.ipynb"))
    return d


@pytest.fixture(scope="module")
def stand_in(tmp_path_factory):
    "Stand-in stages and the stderr lines of one uninterrupted run of them."
    base = tmp_path_factory.mktemp("stand_in")
    nbs = _write_stand_in_stages(base / "nbs")
    p = run_cli("--profile", "tiny", "--nbs_dir", nbs, "--no_cache", "--out_dir", base / "ref")
    return {"nbs": nbs, "lines": [l for l in p.stderr.splitlines() if l.strip()]}


def _interrupted(proc, seen, signum=signal.SIGINT):
    "Signal the run's process group; return (stderr after the signal, whole stderr) once it has exited."
    os.killpg(proc.pid, signum)
    rest = proc.stderr.read()
    proc.wait(timeout=120)
    return rest, "".join(seen) + rest


def _check(proc, rest, stderr, out, args, kept, first_possible: str, code=130, word="interrupted") -> str:
    "Exit status, exactly one line besides the log naming where it stopped, and run_info.json agreeing with that line."
    assert proc.returncode == code, stderr[-4000:]
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr[-4000:]
    extra = [l for l in rest.splitlines() if l.strip() and not LOG_LINE.match(l)]
    assert len(extra) == 1, rest[-4000:]
    m = re.fullmatch(rf"stealth-eval: {re.escape(word)} (in|before) stage (\S+); {re.escape(kept)}; "
                     rf"resume with: stealth-eval {re.escape(' '.join(args))}", extra[0])
    assert m, extra[0]
    stage = m.group(2)
    assert STAGES.index(stage) >= STAGES.index(first_possible), (stage, first_possible)
    stages = json.loads((out / "run_info.json").read_text())["stages"]
    i = STAGES.index(stage)
    assert [stages.get(s, {}).get("status") for s in STAGES] == ["ok"] * i + ["interrupted"] + [None] * (len(STAGES) - i - 1), stages
    return f"{m.group(1)} {stage}"


def _run_to_line(args, until):
    """Start a run and read its stderr up to its `until`-th non-empty line (an int, 1-based) or up to the first line
    containing `until` (a string), never past the start of the last stage; return the process, the lines, the stage."""
    proc = _start(args)
    seen, n, stage = [], 0, STAGES[0]
    for line in proc.stderr:
        seen.append(line)
        if (m := re.search(r"stage (\S+) \.\.\.$", line.rstrip())): stage = m.group(1)
        if line.strip(): n += 1
        if (n == until if isinstance(until, int) else until in line) or stage == STAGES[-1]: break
    assert proc.poll() is None, "".join(seen)[-3000:]
    return proc, seen, stage


def _points(lines, n_default: int, n_delays: int, seed: int = 29):
    """Interruption points: line numbers up to the last stage's start line (after it the run may end before the signal
    lands, and then 0 is right) and (stage, delay) pairs; all lines and 20 delays under STEALTH_EVAL_STRESS=1."""
    last = next(i for i, l in enumerate(lines) if f"stage {STAGES[-1]} ..." in l) + 1
    every = list(range(1, last + 1))
    chosen = every if STRESS else sorted({every[round(i * (last - 1) / max(n_default - 1, 1))] for i in range(n_default)})
    rng = random.Random(int(os.environ.get("STEALTH_EVAL_STRESS_SEED", seed)))
    return chosen, [(rng.choice(STAGES[:-1]), round(rng.uniform(0, 3), 2)) for _ in range(20 if STRESS else n_delays)]


def _interrupt_everywhere(args, lines, out, kept, n_default, n_delays) -> list:
    "Interrupt a run at each point of `_points`; check each; return what stopped where."
    chosen, delays = _points(lines, n_default, n_delays)
    done = []
    for k in chosen:
        proc, seen, stage = _run_to_line(args, k)
        rest, stderr = _interrupted(proc, seen)
        done.append((f"line {k}", _check(proc, rest, stderr, out, args, kept, stage)))
    for stage, delay in delays:
        proc, seen, _ = _run_to_line(args, f"stage {stage} ...")
        time.sleep(delay)                          # a random moment in the stage or after it: any moment must work
        rest, stderr = _interrupted(proc, seen)
        if proc.returncode == 0: continue          # the run ended before the signal (only after the last stage)
        done.append((f"{stage} + {delay} s", _check(proc, rest, stderr, out, args, kept, stage)))
    print(f"interrupted at {len(done)} points ({len(chosen)} lines, {len(delays)} delays):", done)
    assert len(done) >= len(chosen) + len(delays) // 2
    return done


def test_ctrl_c_at_every_line_of_a_stand_in_run_under_load(stand_in, busy, tmp_path):
    "Stand-in stages, a busy core beside: a Ctrl-C after any line of the run, or at random moments, stops it right."
    out = tmp_path / "run"
    args = ["--profile", "tiny", "--nbs_dir", str(stand_in["nbs"]), "--no_cache", "--out_dir", str(out)]
    _interrupt_everywhere(args, stand_in["lines"], out, "nothing was cached (--no_cache)", n_default=8, n_delays=4)


def test_ctrl_c_in_the_tiny_pipeline_then_the_rerun_is_identical(warm, busy, tmp_path):
    "The real stages, a busy core beside: interrupted at a few points, each time right; the last rerun is identical."
    store, out = warm["store"], tmp_path / "run"
    args = _args(out, store)
    _interrupt_everywhere(args, warm["lines"], out, f"finished work is kept in the cache ({store})", n_default=3, n_delays=1)
    busy.kill(); busy.wait()                       # the load is for the interruptions: the rerun checks the artifacts
    run_cli(*args)
    same_artifacts(out, warm["ref"])


def _children(pid: int) -> list:
    "Pids of the processes whose parent is `pid`."
    kids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try: stat = (d / "stat").read_text()
            except OSError: continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid: kids.append(int(d.name))
    return kids


def _gone(pid: int) -> bool:
    "No such process, or only its zombie (dead, not yet reaped)."
    try: return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError: return True


def _kernels(pid: int) -> list:
    kernels = []
    for k in _children(pid):
        try:
            if b"ipykernel" in Path(f"/proc/{k}/cmdline").read_bytes(): kernels.append(k)
        except OSError: pass
    return kernels


@pytest.mark.parametrize("stage", ["00_data", "20_detectors"])
def test_sigterm_stops_the_kernel_one_line_143(stand_in, busy, tmp_path, stage):
    "SIGTERM while a stage's kernel runs: the kernel is gone within 2 s, one line, exit 143, the stage interrupted."
    out = tmp_path / "run"
    args = ["--profile", "tiny", "--nbs_dir", str(stand_in["nbs"]), "--no_cache", "--out_dir", str(out)]
    proc, seen, _ = _run_to_line(args, f"{stage} cell 0")          # the kernel has started and runs the stage's cells
    kernels = _kernels(proc.pid)
    assert kernels, "".join(seen)
    t0 = time.monotonic()
    os.killpg(proc.pid, signal.SIGTERM)
    while not all(_gone(k) for k in kernels):
        assert time.monotonic() - t0 < 2.0, f"stage kernel {kernels} still running 2 s after SIGTERM"
        time.sleep(0.02)
    rest = proc.stderr.read()
    proc.wait(timeout=60)
    assert _check(proc, rest, "".join(seen) + rest, out, args, "nothing was cached (--no_cache)", stage, code=143,
                  word="terminated (SIGTERM)") == f"in {stage}"


PLUGIN = '''
"Two detectors that fail inside the scoring stage: one with a bug, one with a check the user can act on."
from dataclasses import dataclass

from stealth_eval.components import DETECTORS, Detector
from stealth_eval.core import StealthEvalError


@DETECTORS.register
@dataclass(frozen=True, kw_only=True)
class Buggy(Detector):
    name: str = "buggy"
    family: str = "lexical"
    direction: int = 1
    stat: str = "x"
    label: str = "buggy"
    reference: str = "a test plugin"

    def compute(self, texts, cfg, cache):
        return {t: 1 / 0 for t in texts}


@DETECTORS.register
@dataclass(frozen=True, kw_only=True)
class Picky(Buggy):
    name: str = "picky"

    def compute(self, texts, cfg, cache):
        raise StealthEvalError("picky: set picky.threshold (the user can fix this)")
'''


@pytest.mark.parametrize("detector, code, kind", [("buggy", 1, "internal"), ("picky", 2, "user")])
def test_a_failing_stage_exits_1_for_a_bug_and_2_for_a_user_error(warm, tmp_path, detector, code, kind):
    "An exception inside a stage: exit 1 with the traceback in the run log unless it is the library's user error (2)."
    plugin = tmp_path / "failing_plugin.py"
    plugin.write_text(PLUGIN, encoding="utf-8")
    out = tmp_path / "run"
    p = run_cli("--profile", "tiny", "--methods", "m5", "--detectors", "log_likelihood", detector, "--plugin", plugin,
                "--offline", "--out_dir", out, "--cache_dir", warm["store"], check=False)
    assert p.returncode == code, p.stderr[-4000:]
    extra = [l for l in p.stderr.splitlines() if l.strip() and not LOG_LINE.match(l)]
    assert len(extra) == 1 and "Traceback" not in p.stderr, p.stderr[-4000:]
    stage = json.loads((out / "run_info.json").read_text())["stages"]["20_detectors"]
    assert stage["status"] == "failed"
    if kind == "internal":
        assert extra[0] == (f"stealth-eval: error: stage 20_detectors failed with an internal error (a bug: please report "
                            f"it): ZeroDivisionError: division by zero; the traceback is in "
                            f"{out / 'notebooks' / '20_detectors.ipynb'} and {out / 'run.log'}")
        log = (out / "run.log").read_text()
        assert "Traceback" in log and "1 / 0" in log and "ZeroDivisionError: division by zero" in log
        assert stage["error"] == "ZeroDivisionError: division by zero"
    else:
        assert extra[0].startswith("stealth-eval: error: stage 20_detectors failed: StealthEvalError: picky: set "
                                   "picky.threshold (the user can fix this)"), extra[0]


def test_the_stage_kernels_own_stderr_goes_to_run_log_not_the_terminal(tmp_path):
    """What a stage kernel's process writes to its own stderr (ipykernel's and tornado's news at shutdown, such as a
    ZMQError racing the closed sockets, once seen in CI) lands in run.log: the terminal keeps the log lines only."""
    import nbformat
    nbs = _write_stand_in_stages(tmp_path / "nbs")
    path = nbs / "10_methods.ipynb"
    nb = nbformat.read(str(path), as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(      # past ipykernel's capture of the cells' output: the process's own fd 2
        '#| notest\nimport os, sys\nos.write(getattr(sys.stderr, "_original_stdstream_copy", None) or 2, '
        'b"ERROR:tornado.general:kernel noise on its own stderr\\n")'))
    nbformat.write(nb, str(path))
    out = tmp_path / "run"
    p = run_cli("--profile", "tiny", "--nbs_dir", nbs, "--no_cache", "--out_dir", out)
    assert "kernel noise" not in p.stderr, p.stderr[-4000:]
    assert [l for l in p.stderr.splitlines() if l.strip() and not LOG_LINE.match(l)] == [], p.stderr[-4000:]
    assert "ERROR:tornado.general:kernel noise on its own stderr" in (out / "run.log").read_text()
