"""Shared fixtures: end-to-end runs of the real command line on the tiny profile (real offline models, small sample).

The runs use the user cache (converted models and cached generations/scores) unless a test asks for `--no_cache`.
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
    "One end-to-end run of the tiny profile; returns (run folder, nbs digests before, after)."
    out = tmp_path_factory.mktemp("tiny_run")
    before = nbs_digest()
    p = run_cli("--profile", "tiny", "--out_dir", out)
    return {"out": out, "stdout": p.stdout, "stderr": p.stderr, "nbs_before": before, "nbs_after": nbs_digest()}


def read_json(p):
    return json.loads(Path(p).read_text(encoding="utf-8"))
