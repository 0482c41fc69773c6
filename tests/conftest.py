"""Shared fixtures: end-to-end runs of the real command line on the tiny profile (real offline models, small sample).

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

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"


def run_cli(*args, check=True, timeout=1800):
    "Run `python -m stealth_eval.run ARGS` as a user would; return the CompletedProcess."
    env = {**os.environ, "STEALTH_EVAL_PROGRESS": "0", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    p = subprocess.run([sys.executable, "-m", "stealth_eval.run", *map(str, args)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"stealth-eval {' '.join(map(str, args))} exited {p.returncode}\nSTDOUT:\n{p.stdout[-4000:]}\nSTDERR:\n{p.stderr[-6000:]}")
    return p


def nbs_digest():
    import hashlib
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted((ROOT / "nbs").glob("*.ipynb"))}


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    "One end-to-end run of the tiny profile with its own store; returns its folder, store, output and nbs digests."
    out, store = tmp_path_factory.mktemp("tiny_run"), tmp_path_factory.mktemp("tiny_store")
    before = nbs_digest()
    p = run_cli("--profile", "tiny", "--out_dir", out, "--offline", "--cache_dir", store)
    return {"out": out, "store": store, "stdout": p.stdout, "stderr": p.stderr, "nbs_before": before, "nbs_after": nbs_digest()}


@pytest.fixture(scope="session")
def tiny_run_nocache(tmp_path_factory):
    "The same run recomputing everything (the cache neither read nor written): the reference for determinism and resume."
    out = tmp_path_factory.mktemp("tiny_run_nocache")
    run_cli("--profile", "tiny", "--out_dir", out, "--no_cache")
    return out


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
