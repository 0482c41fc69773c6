"""Scores computed elsewhere as a detector (issue #27.2): `--detectors scores:PATH`.

The file is checked before the run (one line naming the file and the row); its scores then go through calibration,
the bootstrap, the tables and the figures like any detector's. The end-to-end run reuses a copy of the session's tiny
run store, and keys the attacked outputs by the SHA-256 of the text, as a user scoring a run's `raw_outputs.jsonl`
elsewhere would.
"""
import hashlib
import json
import shutil

import pandas as pd
import pytest

from conftest import run_cli


def _sha(t: str) -> str: return hashlib.sha256(t.encode("utf-8")).hexdigest()


def test_a_bad_scores_file_is_refused_before_the_run_in_one_line(tmp_path):
    f = tmp_path / "ext.csv"
    f.write_text("id,score,direction\n1,0.5,1\n2,NaN,1\n")
    p = run_cli("--profile", "tiny", "--detectors", f"scores:{f}", "--out_dir", tmp_path / "run", check=False)
    assert p.returncode == 2, p.stderr[-2000:]
    assert p.stderr.strip().splitlines()[-1] == (f"stealth-eval: error: {f}: row 2: score 'NaN' is not a number as JSON writes one "
                                                 "(digits, an optional '.' and exponent: 0.5, -3, 1e-4)")
    assert not (tmp_path / "run" / "config.json").exists()


def test_scores_from_a_file_are_calibrated_and_tabled_like_any_detector(tiny_run, tmp_path):
    store = tmp_path / "store"
    shutil.copytree(tiny_run["store"], store)
    raw = [json.loads(l) for l in (tiny_run["out"] / "raw_outputs.jsonl").read_text().splitlines() if l.strip()]
    data = [json.loads(l) for l in (tiny_run["out"] / "data" / "lee_news.jsonl").read_text().splitlines() if l.strip()]
    # the originals by their dataset id; the homoglyph outputs by the hash of the text as the run wrote it
    rows = [{"id": r["id"], "score": (1.0 if r["label"] == "ai" else 0.0) + k / 1000, "direction": 1} for k, r in enumerate(data)]
    m5 = [r for r in raw if r["method"] == "m5" and r["defense"] == "none" and r["label"] == "ai"]
    rows += [{"text_sha256": _sha(r["text_out"]), "score": 0.5, "direction": 1} for r in m5[: len(m5) // 2]]
    f = tmp_path / "ext.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "run"
    run_cli("--profile", "tiny", "--methods", "m0", "m5", "--detectors", "log_likelihood", f"scores:{f}", "--offline",
            "--out_dir", out, "--cache_dir", store)
    cfg = json.loads((out / "config.json").read_text())
    copy = out / "score_files" / f"{hashlib.sha256(f.read_bytes()).hexdigest()}.jsonl"     # the bytes read before the run
    assert cfg["detectors"] == ["log_likelihood", "scores:ext"] and cfg["score_files"] == {"ext": str(copy)}
    assert json.loads((out / "score_files" / "manifest.json").read_text())[copy.name]["source"] == str(f.resolve())
    s = pd.read_parquet(out / "scores.parquet")
    e = s[s["detector_name"] == "scores:ext"]
    assert set(e["detector_family"]) == {"external"} and e["detector_model"].iloc[0].startswith("scores file ext.jsonl@sha256:")
    orig = e[(e["method"] == "m0") & (e["defense"] == "none")]
    assert orig["valid"].all() and len(orig) == len(data)
    att = e[(e["method"] == "m5") & (e["defense"] == "none") & (e["label"] == "ai")]
    scored = set(_sha(r["text_out"]) for r in m5[: len(m5) // 2])
    assert att["valid"].tolist() == [_sha(t) in scored for t in att["text_out"]]
    assert set(att.loc[~att["valid"], "fail_reason"]) == {"not in the scores file"}     # kept, marked, never scored 0
    m = json.loads((out / "metrics.json").read_text())["lee_news"]["scores:ext"]
    assert m["m0"]["auc"] == pytest.approx(1.0) and m["m0"]["tpr1"] == pytest.approx(1.0)
    assert "ext" in (out / "tables" / "table_main_lee_news.md").read_text()


def test_per_domain_tpr_at_raids_fpr_target_equals_raid_bench():
    """RAID's own evaluation (`raid-bench`, installed by `make install`) and this project's per-domain thresholds
    (`compute_deployment`, family 'domain': RAID's rule) on the same RAID-format scores give the same TPR per domain.
    Scores lie on a grid of 1/400: raid-bench searches its threshold to within 0.0005 of the target FPR, this project
    takes the order statistic, and on grid-aligned scores every threshold that reaches the target flags the same texts."""
    raid = pytest.importorskip("raid.evaluate", reason="raid-bench is installed by `make install` (pip --no-deps raid-bench==0.2.0)")
    import numpy as np
    from stealth_eval.metrics import compute_deployment
    rng = np.random.default_rng(0)
    rows = []
    for d, off in (("news", 0.0), ("reviews", 0.3)):
        for i in range(400):
            rows.append({"id": f"{d}-h{i}", "model": "human", "domain": d, "score": off + i / 400})
        for i in range(300):
            rows.append({"id": f"{d}-a{i}", "model": "gpt4", "domain": d, "score": off + int(rng.integers(300, 440)) / 400})
    df = pd.DataFrame(rows).assign(decoding="sampling", repetition_penalty="no", attack="none")
    results = [{"id": r["id"], "score": r["score"]} for r in rows]
    ev = raid.run_evaluation(results, df.drop(columns=["score"]), target_fpr=0.05, per_domain_tuning=True)
    theirs = {r["domain"]: r["accuracy"]["0.05"]["tp"] / (r["accuracy"]["0.05"]["tp"] + r["accuracy"]["0.05"]["fn"])
              for r in ev["scores"] if r["domain"] != "all" and r["attack"] == "all" and r["model"] == "all"
              and r["decoding"] == "all" and r["repetition_penalty"] == "all"}
    ours_in = df.assign(dataset="raid_slice", label=np.where(df["model"] == "human", "human", "ai"), sample_id=df["id"],
                        condition="m0", method="m0", setting="", defense="none", candidate_rank=0, detector_name="d",
                        detector_score_ai=df["score"], len_tokens_out=np.nan, truncated=False)
    cfg = {"ci_level": 0.95, "n_bootstrap": 50, "fpr_targets": [0.05], "seed": 0, "length_bins": [0]}
    ours = {r["group"]: r["entry"]["tpr"] for r in compute_deployment(ours_in, cfg)
            if r["family"] == "domain" and r["label"] == "ai"}
    assert set(theirs) == set(ours) == {"news", "reviews"}
    assert ours == pytest.approx(theirs, abs=1e-12), (ours, theirs)
    assert all(v == pytest.approx(0.05) for v in ev["fpr"]["0.05"].values())    # both reach the target exactly here


def test_raid_detector_runs_under_raids_own_run_detection(tmp_path):
    "A detector handed to raid-bench's `run_detection` writes RAID's records: its ids, RAID's direction, NaN where unscored."
    raid = pytest.importorskip("raid", reason="raid-bench is installed by `make install` (pip --no-deps raid-bench==0.2.0)")
    from stealth_eval.core import sha256_text
    from stealth_eval.run import raid_detector
    texts = ["first machine text", "a human wrote this", "not in the file"]
    f = tmp_path / "lower_is_ai.jsonl"
    f.write_text("".join(json.dumps({"text_sha256": sha256_text(t), "score": s, "direction": -1}) + "\n" for t, s in zip(texts, (0.5, 4.0))))
    df = pd.DataFrame({"id": ["u1", "u2", "u3"], "generation": texts})
    rec = raid.run_detection(raid_detector(f"scores:{f}", cache_dir=tmp_path / "store"), df)
    assert [r["id"] for r in rec] == ["u1", "u2", "u3"]
    assert [r["score"] for r in rec[:2]] == [-0.5, -4.0] and rec[2]["score"] != rec[2]["score"]   # None -> NaN in RAID's frame


def test_a_detector_with_only_human_scores_is_failed_where_it_has_no_ai_text_and_left_out_of_the_mean(warm_store, tiny_run, tmp_path):
    """Three scores files, one of which scores only the human texts (an API given up after them): the run finishes, that
    detector keeps its threshold (human texts only) and is `failed` in each AI condition with its reason, and the mean,
    criterion 2a and the headline are over the two detectors with numbers, naming the third (#50.1: the mean was null)."""
    data = [json.loads(l) for l in (tiny_run["out"] / "data" / "lee_news.jsonl").read_text().splitlines() if l.strip()]
    files = []
    for name, labels, step in (("a", ("human", "ai"), 1e-3), ("b", ("human", "ai"), 2e-3), ("c", ("human",), 1e-3)):
        rows = [{"id": r["id"], "score": (1.0 if r["label"] == "ai" else 0.0) + k * step, "direction": 1}
                for k, r in enumerate(data) if r["label"] in labels]
        files.append(tmp_path / f"{name}.jsonl"); files[-1].write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "run"
    p = run_cli("--profile", "tiny", "--methods", "m0", "--detectors", *[f"scores:{f}" for f in files], "--offline",
                "--out_dir", out, "--cache_dir", warm_store)
    m = json.loads((out / "metrics.json").read_text())["lee_news"]
    n_ai = sum(r["label"] == "ai" for r in data)
    why = f"no valid score on any of its {n_ai} AI texts of m0: not in the scores file ({n_ai})"
    assert (m["scores:c"]["m0"]["status"], m["scores:c"]["m0"]["reason"], m["scores:c"]["m0"]["auc"]) == ("failed", why, None)
    assert json.loads((out / "thresholds.json").read_text())["lee_news"]["scores:c"]["none"]["fpr=0.01"]["threshold"] is not None
    mean = m["mean"]["m0"]
    assert (mean["n_detectors"], mean["tpr1"], mean["auc"]) == (2, 1.0, 1.0)
    assert mean["note"] == "without scores:c (no valid AI text here: see its reason)"
    (v,) = [x for x in json.loads((out / "acceptance.json").read_text())["criteria"] if x["id"] == "2a"]
    assert v["verdict"] == "pass" and "over 2 detectors" in v["evidence"] and "without scores:c" in v["evidence"], v
    assert f"failed in m0 (left out of its mean): scores:c: {why}" in p.stdout
    assert f"M0 / scores:c: {why}" in (out / "tables" / "table_main_lee_news.md").read_text()
