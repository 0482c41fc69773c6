"""Robust runs: cache reuse counted by the cache's own log, resume after SIGKILL, hostile input, offline mode."""
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from conftest import read_json, run_cli, same_artifacts


def stats(out, stage):
    return read_json(Path(out) / "cache_stats" / f"{stage}.json")


def unique_valid_texts(out):
    raw = pd.read_json(Path(out) / "raw_outputs.jsonl", lines=True)
    return set(raw.loc[raw["valid"], "text_out"])


def test_added_method_and_detector_recompute_only_new_work(tmp_path):
    store = tmp_path / "store"
    a, b = tmp_path / "a", tmp_path / "b"
    n = 3                                                                      # texts per class: the mechanism, not the sample
    run_cli("--profile", "tiny", "--methods", "m0", "--detectors", "fast_detectgpt", "--cache_dir", store, "--out_dir", a,
            "--set", f"data.n_per_class={n}")
    assert stats(a, "00_data")["generation"] == {"hits": 0, "misses": n}
    run_cli("--profile", "tiny", "--methods", "m0", "m5", "--detectors", "fast_detectgpt", "log_rank",
            "--cache_dir", store, "--out_dir", b, "--set", f"data.n_per_class={n}")
    assert stats(b, "00_data")["generation"] == {"hits": n, "misses": 0}      # no text regenerated
    new_texts = unique_valid_texts(b) - unique_valid_texts(a)
    assert len(new_texts) == 2 * n                                             # n texts x 2 homoglyph rates
    # one forward pass per new text, none for the added detector (it reads the same panel)
    assert stats(b, "20_detectors")["lm_panel"] == {"hits": len(unique_valid_texts(a)), "misses": len(new_texts)}


def test_resume_after_sigkill_gives_identical_artifacts(small_run_resumed, small_run_nocache):
    "A run killed mid-scoring (SIGKILL) and run again on its store: nothing lost, nothing recomputed, the same artifacts."
    r, out = small_run_resumed, small_run_resumed["out"]
    assert r["alive_at_kill"], "the run ended before it could be killed part-way"
    assert 10 <= r["n_stored"]
    assert not r["metrics_after_kill"]
    same_artifacts(out, small_run_nocache)
    assert stats(out, "00_data")["generation"]["misses"] == 0                 # nothing generated twice
    assert stats(out, "20_detectors")["lm_panel"]["hits"] >= r["n_stored"] - 1   # stored scores reused


HOSTILE = [
    ("h_ok", "human", "The council said on Tuesday that the new bridge over the river would open to traffic next month, "
                      "after two years of delays caused by flooding and a dispute over the contract."),
    ("h_empty", "human", ""),
    ("h_space", "human", " \t\n  "),
    ("a_same1", "ai", "The minister said the government would announce a new plan for the region in the coming weeks, officials said."),
    ("a_same2", "ai", "The minister said the government would announce a new plan for the region in the coming weeks, officials said."),
    ("a_huge", "ai", ("Police said the fire started in the kitchen and spread quickly through the house. " * 1250)[:100_000]),
    ("a_ctrl", "ai", "Rescue\x00 crews\x07 worked\x1b through the night to reach the\x08 stranded hikers on the ridge, police said."),
    ("a_short", "ai", "Too short."),
]


def test_hostile_corpus_every_row_accounted(tmp_path):
    f = tmp_path / "hostile.jsonl"
    f.write_text("".join(json.dumps({"id": i, "label": l, "domain": "news", "generator": "x", "text": t}) + "\n"
                         for i, l, t in HOSTILE), encoding="utf-8")
    out = tmp_path / "run"
    # the rows' accounting is under test, not the panel: one detector, through a 256-token window (the tiny profile's
    # seven detectors and fast_detectgpt's whole-text window over the 100k-character row cost minutes)
    run_cli("--profile", "tiny", "--datasets", f, "--out_dir", out, "--detectors", "fast_detectgpt",
            "--set", "homoglyph_rates=[0.01]", "score_windows.fast_detectgpt=256")
    card = read_json(out / "data" / "hostile.card.json")
    assert card["n_rows"] == len(HOSTILE)
    assert card["invalid_reasons"] == {"empty text": 2, "too short: 2 words < 10": 1}
    s = pd.read_parquet(out / "scores.parquet")
    m0 = s[(s.condition == "m0") & (s.detector_name == "fast_detectgpt")].set_index("sample_id")
    assert set(m0.index) == {i for i, _, _ in HOSTILE}                        # every input row is in the scores
    assert not m0.loc[["h_empty", "h_space", "a_short"], "valid"].any()
    assert m0.loc[["h_empty", "h_space", "a_short"], "detector_score_ai"].isna().all()
    assert m0.loc["a_huge", "truncated"] and m0.loc["a_huge", "valid"]        # 100k characters: scored, truncation recorded
    assert m0.loc["a_ctrl", "valid"]
    assert m0.loc["a_same1", "detector_score_ai"] == m0.loc["a_same2", "detector_score_ai"]
    th = read_json(out / "thresholds.json")["hostile"]["fast_detectgpt"]["none"]["fpr=0.01"]
    assert th["n_human"] == 1 and th["n_human_invalid"] == 2 and not th["resolved"]
    m = read_json(out / "metrics.json")["hostile"]["fast_detectgpt"]
    assert m["m0"]["n_ai"] == 4 and m["m0"]["n_ai_invalid"] == 1
    assert m["m5:homoglyph_p=0.01"]["n_ai"] + m["m5:homoglyph_p=0.01"]["n_ai_invalid"] == 5
    assert 0 <= m["m0"]["tpr1"] <= 1 and 0 <= m["m0"]["auc"] <= 1
    q = pd.read_parquet(out / "quality.parquet")
    assert set(q.loc[q.condition == "m0", "sample_id"]) == {i for i, l, _ in HOSTILE if l == "ai"}


@pytest.mark.parametrize("rows, message", [
    ([{"id": "1", "label": "human", "domain": "n", "generator": "g", "text": "t"}, {"id": "2", "domain": "n", "generator": "g", "text": "t"}],
     "missing label for id(s) '2'"),
    ([{"id": "1", "label": None, "domain": "n", "generator": "g", "text": "t"}], "missing label for id(s) '1'"),
    ([{"id": "1", "label": "machine", "domain": "n", "generator": "g", "text": "t"}], "unknown label value(s) 'machine'"),
    ([{"id": "1", "label": "ai", "domain": "n", "generator": "g", "text": "t"}, {"id": "1", "label": "ai", "domain": "n", "generator": "g", "text": "u"}],
     "duplicate id(s) '1'"),
    ([{"id": None, "label": "ai", "domain": "n", "generator": "g", "text": "t"}], "without an id"),
])
def test_hostile_rows_that_stop_the_run_before_it_starts(tmp_path, rows, message):
    f = tmp_path / "bad.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    p = run_cli("--datasets", f, "--out_dir", tmp_path / "run", check=False)
    assert p.returncode == 2 and message in p.stderr and str(f) in p.stderr
    assert not (tmp_path / "run" / "notebooks").exists()


def test_nan_label_in_csv(tmp_path):
    f = tmp_path / "bad.csv"
    f.write_text("id,label,domain,generator,text\n1,human,n,g,some text\n2,,n,g,other text\n")
    p = run_cli("--datasets", f, "--out_dir", tmp_path / "run", check=False)
    assert p.returncode == 2 and "missing label for id(s) '2'" in p.stderr


def test_offline_refuses_hub_models_before_any_stage(tmp_path):
    p = run_cli("--profile", "paper", "--offline", "--out_dir", tmp_path, check=False)
    assert p.returncode == 2 and "--offline" in p.stderr and "Qwen/Qwen3-4B-Instruct-2507" in p.stderr
    assert not (tmp_path / "notebooks").exists()


@pytest.mark.parametrize("setting, message", [
    ("n_bootstrap=abc", "--set n_bootstrap=abc: expects an integer (e.g. 1000), got a string"),
    ("data.n_per_class=-3", "--set data.n_per_class=-3: must be a positive count, got -3"),
    ("fpr_targets=0.01", "--set fpr_targets=0.01: expects a list of numbers (e.g. [0.01, 0.05]), got a number"),
    ("device=tpu", "--set device=tpu: 'tpu' is not allowed; use auto, cpu, mps, cuda or cuda:N"),
])
def test_bad_configuration_stops_the_run_before_it_starts(tmp_path, setting, message):
    p = run_cli("--profile", "tiny", "--set", setting, "--out_dir", tmp_path / "run", check=False)
    assert p.returncode == 2 and message in p.stderr and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert len([l for l in p.stderr.splitlines() if l.strip()]) == 1
    assert not (tmp_path / "run" / "notebooks").exists()


def test_list_settings_prints_every_key_with_the_profiles_value_and_version_prints_the_version():
    p = run_cli("--list_settings", "--profile", "paper")
    lines = p.stdout.splitlines()
    assert lines[0] == "settings of profile paper (change with --set KEY=VALUE):"
    row = next(l for l in lines if l.split()[:1] == ["data.n_per_class"])
    assert row.split()[1] == "150" and "(an integer)" in row
    assert not any(l.split()[:1] == ["seed"] for l in lines)        # the runner's own options are not --set keys
    from stealth_eval import __version__
    assert run_cli("--version").stdout.strip() == f"stealth-eval {__version__}"
