"""The Ray engine against the local one (#15): the same run (`--no_cache`, same seed) with `--engine local`, then with
`--engine ray` and 1 and 2 workers on a local Ray instance; prints each stage's seconds from run_info.json, the ratios
to the local engine, and whether the artifacts are byte-identical. Not part of the tests (it takes several runs).

    python bench/bench_engine.py --profile tiny [--workers 1 2] [--out /tmp/bench_engine]
"""
import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from conftest import ARTIFACTS  # noqa: E402  the artifacts the equality tests compare


def run(profile: str, out: Path, engine: str, workers: int = 0) -> dict:
    args = [sys.executable, "-m", "stealth_eval.run", "--profile", profile, "--out_dir", str(out), "--no_cache", "--engine", engine]
    if engine == "ray": args += ["--set", f"engine.workers={workers}"]
    env = {**os.environ, "STEALTH_EVAL_PROGRESS": "0", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env.pop("RAY_ADDRESS", None)
    t0 = time.perf_counter()
    p = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode: raise SystemExit(f"{' '.join(args)} exited {p.returncode}:\n{p.stderr[-3000:]}")
    stages = {k: v["seconds"] for k, v in json.loads((out / "run_info.json").read_text())["stages"].items()}
    return {"wall": wall, "stages": stages}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="tiny")
    ap.add_argument("--workers", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--out", default="/tmp/bench_engine")
    a = ap.parse_args()
    out = Path(a.out) / a.profile
    res = {"local": run(a.profile, out / "local", "local")}
    for w in a.workers: res[f"ray x{w}"] = run(a.profile, out / f"ray{w}", "ray", w)
    base = res["local"]
    print(f"profile {a.profile}, {os.cpu_count()} CPUs; seconds per stage (ratio to the local engine)")
    names = list(base["stages"]) + ["wall"]
    print(f"{'stage':<26}" + "".join(f"{k:>20}" for k in res))
    for n in names:
        cells = []
        for r in res.values():
            v = r["wall"] if n == "wall" else r["stages"].get(n, float("nan"))
            b = base["wall"] if n == "wall" else base["stages"][n]
            cells.append(f"{v:8.1f} ({v / b:4.2f}x)")
        print(f"{n:<26}" + "".join(f"{c:>20}" for c in cells))
    for k in res:
        if k == "local": continue
        d = out / ("ray" + k.split("x")[1])
        diff = [f for f in ARTIFACTS if (d / f).read_bytes() != (out / "local" / f).read_bytes()]
        print(f"{k}: artifacts {'byte-identical to local' if not diff else 'DIFFER: ' + ', '.join(diff)}")


if __name__ == "__main__":
    main()
