"""The rehearsal profile: the paper configuration on random-weight stand-ins of its models (nbs/06_rehearsal).

The end-to-end test runs the reduced shapes on the CPU through the command line with tiny samples and checks that every
artifact says REHEARSAL; the parameter test builds the full configurations on the meta device (nothing allocated).
"""
import json

import pandas as pd
import pytest

from conftest import read_json, run_cli
from stealth_eval.rehearsal import BANNER, MARKER, REAL_CONFIGS, STANDS_FOR, count_params, make_word_tokenizer

# parameters of the real models (tied embeddings counted once), in billions
EXPECTED_B = {"falcon-7b": (6.9, 7.2), "falcon-7b-instruct": (6.9, 7.2), "qwen3-4b-instruct-2507": (3.95, 4.1),
              "t5-large": (0.73, 0.75), "roberta-large-openai-detector": (0.35, 0.36), "e5-base-v2": (0.105, 0.115),
              "roberta-base": (0.12, 0.13), "authormist-originality-rehearsal-standin": (3.0, 3.2)}


@pytest.mark.parametrize("name", sorted(REAL_CONFIGS))
def test_full_configs_have_the_real_parameter_counts(name):
    lo, hi = EXPECTED_B[name]
    assert lo <= count_params(name, "full") / 1e9 <= hi


def test_reduced_shapes_keep_the_vocabularies():
    from stealth_eval.rehearsal import model_config
    for name in REAL_CONFIGS:
        assert model_config(name, "reduced").vocab_size == model_config(name, "full").vocab_size
        assert count_params(name, "reduced") < 20e6


def test_tokenizer_covers_the_vocabulary_and_round_trips():
    tok = make_word_tokenizer("causal", 65024, 2048)
    assert len(tok) == 65024
    ids = list(range(3, 40)) + list(range(64000, 65024, 37))    # corpus words and fillers, as a random model samples
    assert tok(tok.decode(ids), add_special_tokens=False).input_ids == ids


REHEARSAL_ARGS = ["--set", "data.n_per_class=2", "perturbation.n_perturbations=2", "n_bootstrap=20",
                  "data.max_tokens=70", "paraphrase_chunk_tokens=48", "paraphrase_max_new_ratio=1.0",
                  "--n_candidates", "1",
                  "--detectors", "roberta_openai", "log_likelihood", "fast_detectgpt", "detectgpt", "binoculars"]


@pytest.fixture(scope="module")
def rehearsal_run(tmp_path_factory):
    out, store = tmp_path_factory.mktemp("rehearsal_run"), tmp_path_factory.mktemp("rehearsal_store")
    p = run_cli("--profile", "rehearsal", "--out_dir", out, "--offline", "--cache_dir", store, "--set", "device=cpu",
                *REHEARSAL_ARGS)
    return {"out": out, "stdout": p.stdout, "stderr": p.stderr}


def test_rehearsal_runs_the_paper_pipeline_on_stand_ins(rehearsal_run):
    out = rehearsal_run["out"]
    cfg = read_json(out / "config.json")
    assert cfg["rehearsal"]["scale"] == "reduced"
    for key in ("generator", "paraphraser", "scoring_model", "binoculars_observer", "binoculars_performer", "embedder",
                "classifier_model", "authormist_model"):
        marker = read_json(f"{cfg[key]}/{MARKER}")
        assert marker["rehearsal"] is True and marker["stands_for"] in STANDS_FOR.values(), key
    assert "hub" not in json.dumps(cfg["rehearsal"]) and "tiiuae/" not in json.dumps(cfg)
    s = pd.read_parquet(out / "scores.parquet")
    assert set(s["detector_name"]) == {"roberta_openai", "log_likelihood", "fast_detectgpt", "detectgpt", "binoculars"}
    assert {"m0", "m1", "m3", "m4", "m5"} <= set(s["method"])              # M4 on the AuthorMist stand-in
    assert read_json(out / "skipped.json")["methods"].keys() == {"m2"}     # no adapter: skipped with its reason
    assert s.loc[s.detector_name == "detectgpt", "detector_score_raw"].notna().any()   # T5 stand-in fills parse


def test_every_rehearsal_artifact_says_so(rehearsal_run):
    out = rehearsal_run["out"]
    assert "REHEARSAL" in rehearsal_run["stdout"] and "REHEARSAL" in rehearsal_run["stderr"]   # headline and log
    info = read_json(out / "run_info.json")
    assert info["rehearsal"] is True
    for st in info["stages"].values():
        assert st["status"] == "ok" and st["seconds"] >= 0 and st["peak_rss_gb"] > 0
    tables = sorted((out / "tables").glob("*.md")) + [out / "qual_examples.md"]
    assert tables and all(BANNER in t.read_text().splitlines()[0] for t in tables)
    assert all(BANNER in t.read_text() for t in (out / "tables").glob("*.tex"))
    assert (out / "figures" / "fig_heatmap_t1f.png").stat().st_size > 0
    report = (out / "rehearsal_report.md").read_text()
    assert report.splitlines()[0] == f"# {BANNER}"
    for stage in info["stages"]: assert f"| {stage} | ok |" in report
    rows = {m["model"]: m for m in info["rehearsal_models"]}
    assert rows["falcon-7b"]["per_s"] > 0 and rows["qwen3-4b-instruct-2507"]["unit"] == "new tokens/s"
    assert rows["e5-base-v2"]["per_s"] > 0 and rows["roberta-large-openai-detector"]["per_s"] > 0
