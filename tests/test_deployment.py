"""Thresholds as a deployment sets them (issue #28): per-domain thresholds, threshold transfer and length strata.

The numbers are checked on constructed scores whose answers are known exactly; one CLI run over two datasets checks
that the views reach metrics.parquet, the tables and the realised-FPR heatmap.
"""
import json
import math
import shutil

import numpy as np
import pandas as pd
import pytest

from conftest import run_cli
from stealth_eval.metrics import compute_deployment, metrics_long


def _constructed():
    """Dataset C: 1,000 humans scoring 0..999 (a 1% threshold flags exactly 990..999) and 200 AI texts at 2,000.
    Dataset E: 500 humans, 50 of them far above every C score and 450 far below, so the threshold fitted on C flags
    exactly 10% of E's humans in every resample of C; 100 AI texts at 2,000."""
    rows = [("C", "human", f"c{i}", float(i)) for i in range(1000)] + [("C", "ai", f"ca{i}", 2000.0) for i in range(200)]
    rows += [("E", "human", f"e{i}", 5000.0 if i < 50 else -5000.0) for i in range(500)]
    rows += [("E", "ai", f"ea{i}", 2000.0) for i in range(100)]
    df = pd.DataFrame(rows, columns=["dataset", "label", "sample_id", "detector_score_ai"])
    return df.assign(condition="m0", method="m0", setting="", defense="none", candidate_rank=0, detector_name="d",
                     domain="x", len_tokens_out=300, truncated=False)


CFG = {"ci_level": 0.95, "n_bootstrap": 2000, "fpr_targets": [0.01], "seed": 0, "calibrate_on": "C",
       "length_bins": [0, 128, 512]}


def _rows(recs, **kw):
    out = [r for r in recs if all(r[k] == v for k, v in kw.items())]
    assert len(out) == 1, (kw, len(out))
    return out[0]["entry"]


def test_transferred_fpr_is_reported_with_its_value_and_a_binomial_ci():
    recs = compute_deployment(_constructed(), CFG)
    home = _rows(recs, family="transfer", dataset="C", group="calibrated on C", label="human")
    assert home["fpr_realised"] == pytest.approx(0.01, abs=1e-12)                      # in distribution: the target
    away = _rows(recs, family="transfer", dataset="E", group="calibrated on C", label="human")
    assert away["fpr_realised"] == pytest.approx(0.10, abs=1e-12)                      # 50 of 500, known by construction
    se = math.sqrt(0.1 * 0.9 / 500)                                                    # only E's humans vary here
    assert away["fpr_realised_ci_low"] == pytest.approx(0.1 - 1.96 * se, abs=0.006)
    assert away["fpr_realised_ci_high"] == pytest.approx(0.1 + 1.96 * se, abs=0.006)
    back = _rows(recs, family="transfer", dataset="C", group="calibrated on E", label="human")
    assert back["fpr_realised"] == pytest.approx(0.0, abs=1e-12)   # E's 1% threshold lies above every C score
    ai = _rows(recs, family="transfer", dataset="E", group="calibrated on C", label="ai", condition="m0")
    assert ai["tpr"] == 1.0 and ai["asr"] == 0.0
    t = metrics_long(_constructed(), {}, {}, deployment=recs)
    r = t[(t["family"] == "transfer") & (t["metric"] == "transfer:fpr_realised") & (t["dataset"] == "E")
          & (t["group"] == "calibrated on C")].iloc[0]
    assert r["value"] == pytest.approx(0.1) and r["higher_is_better"] == False and r["has_ci"] and r["n_human"] == 500


def test_a_domain_with_too_few_humans_has_no_threshold_and_says_why():
    s = _constructed()
    s.loc[(s["dataset"] == "C") & (s["sample_id"].isin([f"c{i}" for i in range(40)]) | s["sample_id"].isin([f"ca{i}" for i in range(20)])), "domain"] = "tiny"
    recs = compute_deployment(s, CFG)
    e = _rows(recs, family="domain", dataset="C", group="tiny", label="human")
    assert e["threshold"] is None and "fewer than 100" in e["note"] and e["n_human"] == 40
    big = _rows(recs, family="domain", dataset="C", group="x", label="human")
    assert big["threshold"] is not None and big["fpr_human"] <= 0.01
    # the pooled threshold (990) flags none of the tiny domain's humans (0..39) and 10 of the other 960
    assert e["fpr_human_pooled"] == 0.0 and big["fpr_human_pooled"] == pytest.approx(10 / 960)


def test_a_run_over_two_datasets_with_calibrate_on_writes_the_views(tiny_run, tmp_path):
    "The CLI: two datasets, `--set calibrate_on=lee_news`: transfer, domain and length rows, their tables and the heatmap."
    store = tmp_path / "store"
    shutil.copytree(tiny_run["store"], store)
    rows = [json.loads(l) for l in (tiny_run["out"] / "data" / "lee_news.jsonl").read_text().splitlines() if l.strip()]
    b = tmp_path / "news_b.jsonl"
    b.write_text("".join(json.dumps({**r, "id": "b_" + r["id"], "domain": "blogs" if k % 2 else "news"}) + "\n"
                         for k, r in enumerate(rows)), encoding="utf-8")
    out = tmp_path / "run"
    run_cli("--profile", "tiny", "--datasets", "lee_news", b, "--methods", "m0", "--detectors", "log_likelihood",
            "--set", "calibrate_on=lee_news", "--offline", "--out_dir", out, "--cache_dir", store)
    t = pd.read_parquet(out / "metrics.parquet")
    fpr = t[(t["family"] == "transfer") & (t["metric"] == "transfer:fpr_realised")]
    assert set(zip(fpr["group"], fpr["dataset"])) >= {("calibrated on lee_news", "news_b"), ("calibrated on news_b", "lee_news")}
    tpr = t[(t["family"] == "transfer") & (t["metric"] == "transfer:tpr")]
    assert set(tpr["group"]) == {"calibrated on lee_news"} and set(tpr["dataset"]) == {"lee_news", "news_b"}
    assert set(t.loc[t["family"] == "domain", "group"]) == {"blogs", "news"}
    assert (t["family"] == "length").any()
    assert (out / "figures" / "fig_fpr_transfer.png").stat().st_size > 10_000
    md = (out / "tables" / "table_fpr_transfer.md").read_text()
    assert "calibrated on" in md and "news_b" in md
    assert (out / "tables" / "table_domain.md").exists() and (out / "tables" / "table_length.md").exists()
