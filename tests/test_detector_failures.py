"""One detector's failure never erases another detector's metrics (#37), end to end.

The session's tiny run is copied, one detector's scores are made to fail on every text (with the reason the detector
stage records) and another's on most texts, and the last two stages run on the copy through the runner's own stage
execution (`_run_stages`: papermill, the stage notebooks as a run executes them). No stage fails; the other detectors'
numbers are the run's; the failed detector is reported with its reason in metrics.json, thresholds.json, the tables
and the headline; every table gives each detector's valid and invalid counts; every figure of the run is drawn again.
"""
import shutil

import numpy as np
import pandas as pd

from conftest import read_json
from stealth_eval import run as R
from stealth_eval.core import write_json
from stealth_eval.report import headline

DEAD, MOST = "fast_detectgpt", "rank"      # no valid score at all; a valid score on one text in four
WHY = "HTTP 503 after 5 attempts"


def test_a_detector_that_fails_on_every_text_leaves_the_others_results(tiny_run, tmp_path, monkeypatch):
    before = tiny_run["out"]
    out = tmp_path / "run"
    shutil.copytree(before, out, ignore=shutil.ignore_patterns(".previous_run"))
    write_json(out / "config.json", {**read_json(out / "config.json"), "out_dir": str(out)})
    s = pd.read_parquet(out / "scores.parquet")
    keep = [i for _, g in s.groupby("label") for i in sorted(g["sample_id"].unique())[::4]]   # a human and an AI text in four
    for bad, why in ((s["detector_name"] == DEAD, WHY), ((s["detector_name"] == MOST) & ~s["sample_id"].isin(keep), "too short")):
        s.loc[bad, ["detector_score_raw", "detector_score_ai"]] = np.nan
        s.loc[bad, "valid"], s.loc[bad, "fail_reason"] = False, why
    s.to_parquet(out / "scores.parquet", index=False)
    monkeypatch.setattr(R, "PIPELINE", ["30_calibration_metrics", "40_figures"])
    info = read_json(out / "run_info.json")
    R._run_stages(R._notebooks_dir(), out, {"config_path": str(out / "config.json")}, info)   # raises if a stage fails
    assert {nb: info["stages"][nb]["status"] for nb in R.PIPELINE} == dict.fromkeys(R.PIPELINE, "ok")

    m, m0 = read_json(out / "metrics.json")["lee_news"], read_json(before / "metrics.json")["lee_news"]
    others = [d for d in m0 if d not in ("mean", DEAD, MOST)]
    assert len(others) == 5 and all(m[d] == m0[d] for d in others)              # untouched by the two failures
    n_dead = int(((s["detector_name"] == DEAD) & (s["candidate_rank"] == 0)).sum())
    reason = f"no valid score on any of its {n_dead} scored texts: {WHY} ({n_dead})"
    assert set(m[DEAD]) == set(m0[DEAD]) and all((e["status"], e["reason"], e["auc"]) == ("failed", reason, None) for e in m[DEAD].values())
    assert read_json(out / "thresholds.json")["lee_news"][DEAD]["none"]["status"] == "failed"
    assert 0 < m[MOST]["m0"]["n_human"] < m0[MOST]["m0"]["n_human"] and m[MOST]["m0"]["auc"] is not None   # on its own valid texts
    assert m["mean"]["m0"]["n_detectors"] == len(m0) - 2                          # the detectors with a calibration

    tables = sorted((out / "tables").glob("*.md"))
    assert {p.name for p in tables} == {p.name for p in (before / "tables").glob("*.md")}
    for p in tables: assert "**Texts per detector**" in p.read_text(encoding="utf-8"), p.name
    main = (out / "tables" / "table_main_lee_news.md").read_text(encoding="utf-8")
    assert f"{DEAD}: **failed**, no threshold and no metrics: {reason}" in main
    notes, notes0 = read_json(out / "figures_notes.json"), read_json(before / "figures_notes.json")
    assert notes["written"] == notes0["written"] and notes["not_written"] == notes0["not_written"]
    assert all((out / f).stat().st_mtime > (before / f).stat().st_mtime for f in notes["written"])   # drawn again, here
    assert f"failed (no metrics, left out of the mean): {DEAD}: {reason}" in headline(out)
    tau = read_json(out / "metrics_tau.json")["datasets"]["lee_news"]["max"]["m0"]
    assert (tau["n_detectors"], tau["n_human"], tau["texts"]) == (len(m0) - 2, m[MOST]["m0"]["n_human"], "valid for every detector compared")
