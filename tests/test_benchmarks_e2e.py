"""The runner on the real benchmark samples in ../shared/data (skipped, with the reason, when the folder is absent)."""
import os

import pandas as pd
import pytest

from conftest import ROOT, read_json, run_cli

DATA = ROOT.parent / "shared" / "data"
pytestmark = pytest.mark.skipif(not DATA.is_dir(), reason=f"../shared/data not found at {DATA}: benchmark runs need the staged files")


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench_run")
    os.environ["STEALTH_EVAL_DATA"] = str(DATA)
    try:
        # What these tests read: the loaders, the cards, the tables and fast_detectgpt's metrics of the datasets' own
        # conditions (PADBen's paraphrase task, APT-Eval's polish levels, DetectRL's attacks). So the originals alone
        # (m0), one detector, 6 texts per stratum and 64-token windows: the tiny profile's attacks, panel and 256-token
        # windows on 12 per stratum scored 764 texts in 1,322 s on 2 cores (1.7 s each; a quarter of the suite).
        # fast_detectgpt's own window is the model's (Gemma: 32k tokens, its reference scores the whole text), so it is
        # cut here too: whole texts took 524 s of this run's 560 s on an idle core, 64 tokens take ~35 s.
        run_cli("--profile", "tiny", "--datasets", "padben", "apt_eval", "detectrl", "--methods", "m0",
                "--detectors", "fast_detectgpt", "--set", "data.benchmark_n_per_class=6", "n_bootstrap=50",
                "score_max_tokens=64", "score_windows.fast_detectgpt=64", "--out_dir", out, "--offline")
    finally:
        os.environ.pop("STEALTH_EVAL_DATA", None)
    return out


def test_each_benchmark_has_its_table_and_card(bench_run):
    m = read_json(bench_run / "metrics.json")
    assert set(m) == {"padben", "apt_eval", "detectrl"}
    for ds in m:
        assert (bench_run / "tables" / f"table_main_{ds}.md").read_text().startswith(f"## {ds}: main results")
        card = read_json(bench_run / "data" / f"{ds}.card.json")
        assert card["n_rows"] > 0 and card["dropped"]["sample"] > 0
    assert "## padben: main results" in (bench_run / "tables" / "table_padben.md").read_text()


def test_padben_tasks_share_one_human_set(bench_run):
    data = pd.read_json(bench_run / "data" / "padben.jsonl", lines=True)
    card = read_json(bench_run / "data" / "padben.card.json")
    assert card["dropped"]["repeated_human_text"] == 8117          # task 5 repeats task 2's human sentences
    assert set(data.loc[data.label == "ai", "edit"].fillna("")) == {"", "paraphrase:llm_x3"}
    m = read_json(bench_run / "metrics.json")["padben"]["fast_detectgpt"]
    assert {"m0", "m0:paraphrase:llm_x3"} <= set(m)


def test_apt_polished_texts_are_human_and_never_calibrate(bench_run):
    s = pd.read_parquet(bench_run / "scores.parquet")
    apt = s[(s.dataset == "apt_eval") & (s.detector_name == "fast_detectgpt") & (s.defense == "none")]
    polished = apt[(apt.label == "human") & (apt.condition != "m0")]
    assert len(polished) > 0 and polished["condition"].str.startswith("m0:polish:").all()
    th = read_json(bench_run / "thresholds.json")["apt_eval"]["fast_detectgpt"]["none"]["fpr=0.01"]
    assert th["n_human"] == len(apt[(apt.label == "human") & (apt.condition == "m0") & apt.valid])
    m = read_json(bench_run / "metrics.json")["apt_eval"]["fast_detectgpt"]
    rates = {c: v["flag_rate1"] for c, v in m.items() if v["label"] == "human"}
    assert rates and all(0 <= r <= 1 for r in rates.values())


def test_detectrl_labels_and_attacks(bench_run):
    data = pd.read_json(bench_run / "data" / "detectrl.jsonl", lines=True)
    assert set(data["label"]) == {"human", "ai"}                    # upstream "llm" -> "ai"
    assert any(str(e).startswith("paraphrase:") for e in data["edit"].dropna())
