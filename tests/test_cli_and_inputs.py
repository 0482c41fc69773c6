"""The command line's failure behaviour and bad input: clear errors before a run starts, invalid rows accounted for."""
import json

import pandas as pd
import pytest

from conftest import ROOT, read_json, run_cli

COLS = ["id", "label", "domain", "generator", "text"]


def test_unknown_names_fail_at_once_with_the_valid_ones(tmp_path):
    p = run_cli("--methods", "m0", "m9", "--out_dir", tmp_path, check=False)
    assert p.returncode == 2
    from stealth_eval.methods import METHODS
    assert "unknown method 'm9'" in p.stderr and f"Valid methods: {', '.join(METHODS.names())}" in p.stderr
    p = run_cli("--detectors", "fast_detectgtp", "--out_dir", tmp_path, check=False)
    assert p.returncode == 2 and "Did you mean 'fast_detectgpt'" in p.stderr
    assert not (tmp_path / "notebooks").exists()           # nothing ran


def test_missing_column_names_file_and_column(tmp_path):
    f = tmp_path / "mine.jsonl"
    f.write_text("".join(json.dumps({"id": str(i), "label": "human", "domain": "news", "text": "w " * 20}) + "\n" for i in range(4)))
    p = run_cli("--datasets", f, "--out_dir", tmp_path / "run", check=False)
    assert p.returncode == 2
    assert str(f) in p.stderr and "missing column(s) 'generator'" in p.stderr
    assert not (tmp_path / "run" / "notebooks").exists()


def test_invalid_utf8_and_duplicates_are_errors(tmp_path):
    f = tmp_path / "bad.jsonl"
    f.write_bytes(b'{"id": "1", "label": "human", "domain": "n", "generator": "h", "text": "ok"}\n{"id": "2", "label": "ai", "domain": "n", "generator": "g", "text": "\xff"}\n')
    p = run_cli("--datasets", f, "--out_dir", tmp_path / "run", check=False)
    assert p.returncode == 2 and "bad.jsonl:2: invalid UTF-8" in p.stderr
    f.write_text("".join(json.dumps({"id": "x", "label": "human", "domain": "n", "generator": "h", "text": "t"}) + "\n" for _ in range(2)))
    p = run_cli("--datasets", f, "--out_dir", tmp_path / "run", check=False)
    assert p.returncode == 2 and "duplicate id(s) 'x'" in p.stderr


def test_empty_and_short_texts_are_kept_marked_and_counted(tiny_run, warm_store, tmp_path):
    "A user dataset with an empty and a too-short AI text runs to the end; both rows are invalid with a reason."
    data = pd.read_json(tiny_run["out"] / "data" / "lee_news.jsonl", lines=True)[COLS]
    bad = pd.DataFrame([{"id": "bad_empty", "label": "ai", "domain": "news", "generator": "x", "text": "   "},
                        {"id": "bad_short", "label": "ai", "domain": "news", "generator": "x", "text": "Too short to judge."},
                        {"id": "bad_human", "label": "human", "domain": "news", "generator": "human", "text": ""}])
    f = tmp_path / "mixed.jsonl"
    pd.concat([data, bad]).to_json(f, orient="records", lines=True)
    out = tmp_path / "run"
    run_cli("--profile", "tiny", "--datasets", f, "--out_dir", out, "--cache_dir", warm_store)   # the tiny run's texts: cached
    card = read_json(out / "data" / "mixed.card.json")
    assert card["n_rows"] == len(data) + 3 and card["n_invalid"] == 3
    assert card["invalid_reasons"] == {"empty text": 2, "too short: 4 words < 10": 1}
    s = pd.read_parquet(out / "scores.parquet")
    rows = s[s.sample_id.isin(["bad_empty", "bad_short", "bad_human"])]
    assert len(rows) > 0 and not rows["valid"].any() and rows["detector_score_ai"].isna().all()
    assert set(rows.loc[rows.sample_id == "bad_empty", "fail_reason"]) == {"input: empty text"}
    m = read_json(out / "metrics.json")["mixed"]["fast_detectgpt"]
    assert m["m0"]["n_ai_invalid"] == 2 and m["m0"]["n_ai"] == 16 and m["m0"]["n_human"] == 16
    q = pd.read_parquet(out / "quality.parquet")
    assert set(q.loc[q.sample_id == "bad_short", "fail_reason"]) == {"input: too short: 4 words < 10"}


def test_readme_is_the_index_notebook():
    from stealth_eval.run import readme_from_index
    assert (ROOT / "README.md").read_text(encoding="utf-8") == readme_from_index(), "run `stealth-eval readme`"


def test_readme_first_commands_are_what_ci_runs():
    readme = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    block = readme[readme.index("```bash") + 1: readme.index("```bash") + 3]
    assert block[0].startswith("make run") and block[1].startswith("make test")
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_a_detector_that_cannot_run_is_skipped_with_its_reason(warm_store, tmp_path):
    "The two-model Binoculars needs a model pair no offline package ships: reported as skipped, never replaced."
    out = tmp_path / "run"
    run_cli("--profile", "tiny", "--detectors", "fast_detectgpt", "binoculars", "--out_dir", out, "--cache_dir", warm_store)
    skipped = read_json(out / "skipped.json")["detectors"]
    assert list(skipped) == ["binoculars"] and "binoculars_single" in skipped["binoculars"]
    s = pd.read_parquet(out / "scores.parquet")
    assert set(s["detector_name"]) == {"fast_detectgpt"}
    assert "**Skipped** (not run, not replaced): binoculars:" in (out / "tables" / "table_main_lee_news.md").read_text()
