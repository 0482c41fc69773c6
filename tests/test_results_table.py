"""The long result table (`metrics.parquet`), metrics.json regenerated from it, results.json (provenance) and quality's
`sim_e5`: on the session's end-to-end tiny run, and on a synthetic scores table with two defenses and three FPR targets.
"""
import json
import math
from pathlib import Path

import pandas as pd
import pytest

from stealth_eval import metrics as M
from stealth_eval.core import file_sha256, to_jsonable

from test_metrics import CFG_SYN, synthetic_scores

COLS = ["family", "dataset", "detector", "aggregate", "condition", "method", "setting", "defense", "label", "group",
        "scenario", "fpr_target", "metric", "value", "boot_mean", "ci_low", "ci_high", "has_ci", "n_human", "n_ai",
        "n_invalid", "n_detectors", "higher_is_better", "detail"]
KEY = ["family", "dataset", "detector", "aggregate", "condition", "defense", "group", "scenario", "fpr_target", "metric"]


def same(a, b, path=""):
    "Recursive equality with the same keys in the same order; None == NaN; floats equal to 1e-12."
    if isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), f"{path}: keys {list(a)[:8]} != {list(b)[:8] if isinstance(b, dict) else b}"
        for k in a: same(a[k], b[k], f"{path}/{k}")
    elif a is None or (isinstance(a, float) and math.isnan(a)):
        assert b is None or (isinstance(b, float) and math.isnan(b)), f"{path}: {a} != {b}"
    elif isinstance(a, float) or isinstance(b, float):
        assert b is not None and abs(a - b) <= 1e-12, f"{path}: {a} != {b}"
    else:
        assert a == b and type(a) is type(b), f"{path}: {a!r} != {b!r}"


def json_text(obj): return json.dumps(to_jsonable(obj), indent=2, ensure_ascii=False, allow_nan=False) + "\n"


def test_table_of_the_tiny_run(tiny_run):
    out = Path(tiny_run["out"])
    assert (out / "metrics.parquet").exists() and (out / "results.json").exists()
    t = pd.read_parquet(out / "metrics.parquet")
    assert list(t.columns) == COLS
    assert "mean" not in set(t["detector"].dropna())                       # the mean is an aggregate row, not a detector
    agg = t[t["aggregate"] == "mean_over_detectors"]
    assert len(agg) and agg["detector"].isna().all() and (agg["n_detectors"] > 1).all()
    assert not t.fillna({"fpr_target": -1.0}).astype(str).duplicated(KEY).any()     # one row per key
    assert {"main", "shield", "tau"} <= set(t["family"])
    # metrics.json is the table's view: equal as data, and byte for byte as the stage writes it
    file_m = json.loads((out / "metrics.json").read_text(encoding="utf-8"))
    got = M.metrics_json_from_table(t)
    same(json.loads(json_text(got)), file_m)
    assert json_text(got) == (out / "metrics.json").read_text(encoding="utf-8")
    # method, setting and defense are the scores rows' own
    sc = pd.read_parquet(out / "scores.parquet").drop_duplicates(["dataset", "condition"]).set_index(["dataset", "condition"])
    rows = t[t["condition"].notna()].drop_duplicates(["dataset", "condition"])
    for r in rows.itertuples(index=False):
        s = sc.loc[(r.dataset, r.condition)]
        assert (r.method, r.setting, r.defense) == (s["method"], s["setting"], s["defense"]), r.condition
    # a TPR row carries the interval and the sample sizes of its metrics.json entry
    r = t[(t["family"] == "main") & (t["metric"] == "tpr") & t["detector"].notna() & t["condition"].notna()].iloc[0]
    e = file_m[r.dataset][r.detector][r.condition]
    assert (r.value, r.ci_low, r.ci_high, r.n_human, r.n_ai, r.fpr_target) == (
        e["tpr1"], e["tpr1_ci_low"], e["tpr1_ci_high"], e["n_human"], e["n_ai"], 0.01)
    assert t.loc[t["metric"] == "auc", "higher_is_better"].all() and not t.loc[t["metric"] == "asr", "higher_is_better"].any()


def test_results_json_of_the_tiny_run(tiny_run):
    out = Path(tiny_run["out"])
    r = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert r["config"] == json.loads((out / "config.json").read_text(encoding="utf-8"))
    assert r["data_sha256"] == {p.name: file_sha256(p) for p in sorted((out / "data").glob("*.jsonl"))} and r["data_sha256"]
    assert set(r["samples"]) == {"lee_news"} and r["samples"]["lee_news"]["human"] > 0 and r["samples"]["lee_news"]["ai"] > 0
    assert r["higher_is_better"]["auc"] is True and r["higher_is_better"]["asr"] is False
    assert r["git"]["commit"] and "python" in r["versions"]
    files = {f["file"]: f for f in r["files"]}
    assert {"metrics.parquet", "metrics.json", "thresholds.json", "quality.parquet"} <= set(files)
    assert files["metrics.parquet"]["columns"] == COLS
    assert files["metrics.parquet"]["rows"] == len(pd.read_parquet(out / "metrics.parquet"))
    assert not {"started", "finished"} & set(r)                             # no wall-clock time (run_info.json has it)
    info = json.loads((out / "run_info.json").read_text(encoding="utf-8"))
    assert {"metrics.parquet", "results.json"} <= set(info["files"])


def test_quality_has_sim_e5(tiny_run):
    q = pd.read_parquet(Path(tiny_run["out"]) / "quality.parquet")
    assert "sim_e5" in q.columns and list(q.columns).index("sim_e5") == list(q.columns).index("sim_model") + 1
    cfg = json.loads((Path(tiny_run["out"]) / "config.json").read_text(encoding="utf-8"))
    if "e5" in cfg["embedder"].lower(): assert q["sim_e5"].equals(q["sim"])
    else: assert q["sim_e5"].isna().all()                                   # the tiny profile's embedder is not E5


@pytest.mark.parametrize("fprs", [[0.01], [0.01, 0.05, 0.1], [0.05, 0.01]])
def test_round_trip_synthetic(tmp_path, fprs):
    "Two defenses, edited human texts, NaN scores, a dataset with too few human texts, several FPR targets."
    cfg = {**CFG_SYN, "fpr_targets": fprs}
    sc = synthetic_scores()
    m, th = M.compute_metrics(sc, cfg)
    t = M.metrics_long(sc, m, th, M.compute_shield(sc, cfg), M.compute_tau(sc, cfg), M.compute_apt(sc, cfg), M.compute_beemo(sc, cfg))
    t.to_parquet(tmp_path / "m.parquet", index=False)
    back = pd.read_parquet(tmp_path / "m.parquet")
    assert json_text(M.metrics_json_from_table(back)) == json_text(m)
    assert {"main", "shield", "tau", "apt", "beemo"} == set(back["family"])
    assert not back.fillna({"fpr_target": -1.0}).astype(str).duplicated(KEY).any()
    assert set(back.loc[back["family"] == "main", "fpr_target"].dropna()) == set(fprs)
    mx = back[back["aggregate"] == "max_over_detectors"]
    assert len(mx) and mx["detector"].isna().all() and set(mx["metric"]) >= {"tau:tau"}
