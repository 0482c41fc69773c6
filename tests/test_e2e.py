"""End to end: the runner on the tiny profile writes every artifact with the spec's schemas and sane values."""
import json
import math

import numpy as np
import pandas as pd
import pytest

from conftest import read_json, run_cli, same_artifacts

SCORE_COLS = ["sample_id", "dataset", "label", "method", "setting", "candidate_rank", "text_out", "len_tokens_out",
              "len_ratio", "detector_name", "detector_score_raw", "detector_score_ai"]
QUALITY_COLS = ["sample_id", "dataset", "method", "setting", "sim", "ppl_score", "edit_rate", "valid", "fail_reason"]
from stealth_eval.config import PROFILES

DETECTORS = PROFILES["tiny"]["detectors"]   # the tiny profile's panel (all from one forward pass)


def test_artifacts_exist(tiny_run):
    out = tiny_run["out"]
    for f in ["scores.parquet", "quality.parquet", "metrics.json", "thresholds.json", "raw_outputs.jsonl",
              "figures/fig_heatmap_t1f.png", "figures/fig_sanitize.png", "tables/table_main_lee_news.md",
              "tables/table_main_lee_news.tex", "tables/table_sanitize.md", "qual_examples.md", "data/lee_news.jsonl",
              "data/lee_news.card.json", "config.json", "run_info.json"]:
        assert (out / f).is_file() and (out / f).stat().st_size > 0, f
    for nb in ["00_data", "10_methods", "20_detectors", "30_calibration_metrics", "40_figures"]:
        assert (out / "notebooks" / f"{nb}.ipynb").is_file()
    png = (out / "figures" / "fig_heatmap_t1f.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_nbs_not_modified_by_a_run(tiny_run):
    assert tiny_run["nbs_before"] == tiny_run["nbs_after"]


def test_data_schema_and_balance(tiny_run):
    df = pd.read_json(tiny_run["out"] / "data" / "lee_news.jsonl", lines=True)
    assert {"id", "label", "domain", "generator", "text"} <= set(df.columns)
    assert set(df["label"]) == {"human", "ai"}
    assert (df["label"] == "human").sum() == (df["label"] == "ai").sum() == 16
    assert df["id"].is_unique
    # every AI text continues the first tokens of its paired human document (same source_id)
    pairs = df.pivot(index="source_id", columns="label", values="text")
    assert all(a.split()[:3] == h.split()[:3] for h, a in zip(pairs["human"], pairs["ai"]))
    assert set(df.loc[df.label == "ai", "generator"]) == {"smollm2-135m-instruct"}


def test_scores_schema_and_accounting(tiny_run):
    out = tiny_run["out"]
    s = pd.read_parquet(out / "scores.parquet")
    assert set(SCORE_COLS) <= set(s.columns)
    raw = pd.read_json(out / "raw_outputs.jsonl", lines=True)
    assert len(s) == len(raw) * len(DETECTORS)          # every output row is scored by every detector
    assert set(s["detector_name"]) == set(DETECTORS)
    np.testing.assert_allclose(s["detector_score_ai"], s["detector_direction"] * s["detector_score_raw"])
    assert (s.loc[s.detector_name == "log_rank", "detector_direction"] == -1).all()
    assert s.loc[s["valid"], "detector_score_ai"].notna().all()
    assert set(s["condition"]) >= {"m0", "m0+sanitize", "m5:homoglyph_p=0.005", "m5:homoglyph_p=0.02+sanitize"}
    # the metrics stage reads this one table: each row carries its source id and its output's facts (as JSON)
    key = ["dataset", "sample_id", "condition", "candidate_rank"]
    from stealth_eval.core import read_jsonl          # exact floats (pandas' read_json rounds them)
    exact = pd.DataFrame(read_jsonl(out / "raw_outputs.jsonl"))
    by_row = exact.assign(facts=exact["facts"].map(lambda f: json.dumps(f, sort_keys=True, ensure_ascii=False))).set_index(key)
    got = s[s.detector_name == DETECTORS[0]].set_index(key)
    assert by_row.index.is_unique and (got["source_id"] == by_row.loc[got.index, "source_id"]).all()
    assert (got["facts"] == by_row.loc[got.index, "facts"]).all()
    assert json.loads(got.loc[got.index.get_level_values(2) == "m5:homoglyph_p=0.02", "facts"].iloc[0])["rate_target"] == 0.02


def test_quality(tiny_run):
    q = pd.read_parquet(tiny_run["out"] / "quality.parquet")
    assert set(QUALITY_COLS) <= set(q.columns)
    m0 = q[q.condition == "m0"]
    assert (m0["sim"] == 1.0).all() and (m0["edit_rate"] == 0).all()
    m5 = q[q.condition == "m5:homoglyph_p=0.02"]
    assert (m5["edit_rate"] > 0).all() and (m5["sim"] < 1).all()
    assert q["ppl_score"].between(1, 1e5).all()


def test_thresholds_are_calibrated_on_human_text(tiny_run):
    out = tiny_run["out"]
    s = pd.read_parquet(out / "scores.parquet")
    th = read_json(out / "thresholds.json")
    for det in DETECTORS:
        for defense in ("none", "sanitize"):
            t = th["lee_news"][det][defense]["fpr=0.01"]
            h = s[(s.detector_name == det) & (s.label == "human") & (s.defense == defense)]["detector_score_ai"]
            assert t["n_human"] == len(h) == 16
            assert (h >= t["threshold"]).mean() <= 0.01 and t["fpr_achieved"] <= 0.01
            # the smallest such threshold: the largest human score sits just below it
            assert t["threshold"] == np.nextafter(h.max(), np.inf)
            assert not t["resolved"] and "not resolved" in t["note"]


def test_metrics_schema_and_values(tiny_run):
    m = read_json(tiny_run["out"] / "metrics.json")
    assert list(m) == ["lee_news"]
    assert set(m["lee_news"]) == set(DETECTORS) | {"mean"}
    for det in DETECTORS:
        for cond, v in m["lee_news"][det].items():
            for k in ("auc", "tpr1", "asr"):
                assert {f"{k}_mean", f"{k}_ci_low", f"{k}_ci_high"} <= set(v)
                assert 0 <= v[k] <= 1 and v[f"{k}_ci_low"] <= v[f"{k}_ci_high"]
            assert math.isclose(v["asr"], 1 - v["tpr1"])
            assert "threshold1" in v and v["n_human"] == 16
    fdg = m["lee_news"]["fast_detectgpt"]
    assert fdg["m0"]["auc"] > 0.5                          # the original AI texts are detected above chance
    # sanitize() undoes the homoglyphs exactly on this English text: the defended scores equal M0's
    assert fdg["m5:homoglyph_p=0.02+sanitize"]["auc"] == fdg["m0+sanitize"]["auc"]
    # and the homoglyphs change detection
    assert fdg["m5:homoglyph_p=0.02"]["auc"] != fdg["m0"]["auc"]


def test_run_info_provenance(tiny_run):
    info = read_json(tiny_run["out"] / "run_info.json")
    assert info["parameters"]["profile"] == "tiny"
    assert info["versions"]["torch"] and info["versions"]["transformers"]
    assert "commit" in info["git"]
    assert set(info["data_sha256"]) == {"lee_news.jsonl"}
    assert all(v["status"] == "ok" for v in info["stages"].values()) and len(info["stages"]) == 5
    assert "scores.parquet" in info["files"]
    from stealth_eval.run import is_run_output      # a user's file there is refused before a run (the namespace covers a run)
    assert [f for f in info["files"] if not is_run_output(f)] == [], info["files"]
    assert "lee_news: mean over detectors" in tiny_run["stdout"]


def test_same_seed_same_scores_without_cache(small_run_resumed, small_run_nocache):
    """Determinism: a run that recomputes everything (no cache) gives the scores, metrics and tables of one that writes
    its store as it computes and reads back what it stored (the SMALL configuration, killed mid-scoring and run again:
    `small_run_resumed`; every panel detector reads the same pass)."""
    small_run = small_run_resumed["out"]
    assert small_run_resumed["n_stored"] >= 10                 # values read from the store as well as computed
    a = pd.read_parquet(small_run / "scores.parquet")
    b = pd.read_parquet(small_run_nocache / "scores.parquet")
    pd.testing.assert_frame_equal(a, b, check_exact=True)
    assert read_json(small_run / "metrics.json") == read_json(small_run_nocache / "metrics.json")
    same_artifacts(small_run, small_run_nocache)
    stats = read_json(small_run_nocache / "cache_stats" / "20_detectors.json")
    assert stats["lm_panel"]["hits"] == 0                 # really recomputed
