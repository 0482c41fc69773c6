"""The companion papers' own protocols (issue 26): APT-Eval's accuracy-maximising and 5% FPR thresholds on its
calibration split, W-AUROC with NaN human scores, SHIELD's Eq. 1 unsmoothed.

The APT-Eval test runs on the upstream detector scores staged in `../shared/data/apt_eval/results` (skipped, with the
reason shown, where the folder is absent: a user's fresh clone).
"""
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from stealth_eval import metrics as M
from stealth_eval.humanify import MIRanker, mutual_information

APT = Path(__file__).resolve().parents[2] / "shared" / "data" / "apt_eval"
CFG = {"seed": 11, "n_bootstrap": 40, "ci_level": 0.95, "fpr_targets": [0.01]}


def _row(ds, sid, label, cond, setting, det, score):
    return {"dataset": ds, "sample_id": sid, "label": label, "method": "m0", "setting": setting, "defense": "none",
            "condition": cond, "candidate_rank": 0, "detector_name": det, "detector_score_ai": score,
            "generator": "human" if label == "human" else "gpt"}


def _max_accuracy(h, a):
    "The definition written out: the best accuracy of `score >= t` over every candidate threshold."
    return max(((h < t).sum() + (a >= t).sum()) / (len(h) + len(a)) for t in [*np.unique(np.r_[h, a]), np.inf])


def test_apt_eval_table6_from_the_shared_sample():
    if not (APT / "results").is_dir(): pytest.skip(f"APT-Eval sample not found: {APT / 'results'} (not part of a clone)")
    from stealth_eval.benchmarks import load_apt_eval
    recs, _ = load_apt_eval(APT, polishers="gpt", polish_kinds=["minor"])
    calib = {r["id"]: r for r in recs if r["split"] == "calibration"}
    assert len(calib) == 600 and all(i.startswith(M.APT_CALIB_PREFIX) for i in calib)   # the loader's split, as compute_apt finds it
    pol = {r["id"] for r in recs if r["edit"] == "polish:degree=minor"}
    rows, up = [], {}
    for det in ("binoculars", "fastdetectgpt"):
        for r in json.loads((APT / "results" / det / "mgt_hwt_predictions.json").read_text()):
            rows.append(_row("apt_eval", f"apt-calib-{r['id']}", calib[f"apt-calib-{r['id']}"]["label"], "m0", "", det, r["score"]))
        for r in json.loads((APT / "results" / det / "polished_minor_gpt_predictions.json").read_text()):
            if f"apt-polish-minor-gpt-{r['id']}" in pol:
                rows.append(_row("apt_eval", f"apt-polish-minor-gpt-{r['id']}", "human", "m0:polish:degree=minor",
                                 "polish:degree=minor", det, r["score"]))
        up[det] = json.loads((APT / "results" / det / "mgt_hwt_results_acc.json").read_text())
    sc = pd.DataFrame(rows)
    A = M.compute_apt(sc, CFG)
    for det, u in up.items():
        s = sc[sc.detector_name == det]
        h = s[(s.condition == "m0") & (s.label == "human")].detector_score_ai.to_numpy()
        a = s[(s.condition == "m0") & (s.label == "ai")].detector_score_ai.to_numpy()
        x = s[s.condition == "m0:polish:degree=minor"].detector_score_ai.to_numpy()
        base = A["datasets"]["apt_eval"][det]["m0"]["by_polisher"]["all"]
        e = A["datasets"]["apt_eval"][det]["m0:polish:degree=minor"]["by_polisher"]["all"]
        t = e["threshold_acc"]
        # the upstream threshold reproduces the upstream accuracy on these scores (same data), and ours is the true maximum
        assert ((h < u["threshold"]).sum() + (a >= u["threshold"]).sum()) / 600 == pytest.approx(u["accuracy"])
        assert e["accuracy_acc"] == pytest.approx(_max_accuracy(h, a)) and e["accuracy_acc"] >= u["accuracy"] - 1e-12
        assert e["fpr_calib_acc"] == pytest.approx((h >= t).mean()) and e["flag_rate_acc"] == pytest.approx((x >= t).mean())
        assert e["fpr_calib_fpr5"] <= 0.05 and e["flag_rate_fpr5"] == pytest.approx((x >= e["threshold_fpr5"]).mean())
        assert e["fpr1_calib"] == pytest.approx((h >= e["threshold1"]).mean())   # the spec's 1% FPR view stays beside
        assert e["flag_rate_acc_ci_low"] < e["flag_rate_acc_ci_high"] and base["accuracy_acc"] == e["accuracy_acc"]
        assert "calibration split: 300 human + 300 AI" in e["calibration"]
    tabs = M._apt_tables(A)
    assert len(tabs) == 3
    t6 = tabs[1][0]
    assert "(Table 6)" in t6 and "binoculars" in t6 and "APT-Eval: 5% FPR (App. B)" in t6 and "spec: 1% FPR" in t6
    assert f"{A['datasets']['apt_eval']['binoculars']['m0']['by_polisher']['all']['accuracy_acc']:.4f}" in t6
    long = M.metrics_long(sc, {}, {}, apt=A)
    r = long[(long.family == "apt") & (long.metric == "apt:accuracy_acc") & (long.detector == "binoculars")]
    assert len(r) and r.has_ci.all() and r.fpr_target.isna().all()
    r = long[(long.family == "apt") & (long.metric == "apt:fpr_calib")]
    assert len(r) and (r.fpr_target == 0.01).all()                          # fpr1_calib: the spec's target, labelled


def test_apt_threshold_refitted_per_resample_and_without_a_split():
    rng = np.random.default_rng(0)
    rows = [_row("toy", f"h{i}", "human", "m0", "", "d", v) for i, v in enumerate(rng.normal(0, 1, 80))]
    rows += [_row("toy", f"a{i}", "ai", "m0", "", "d", v) for i, v in enumerate(rng.normal(1.5, 1, 80))]
    rows += [_row("toy", f"p{i}", "human", "m0:polish:degree=minor", "polish:degree=minor", "d", v)
             for i, v in enumerate(rng.normal(0.7, 1, 80))]
    e = M.compute_apt(pd.DataFrame(rows), CFG)["datasets"]["toy"]["d"]["m0:polish:degree=minor"]["by_polisher"]["all"]
    assert e["calibration"].startswith("unedited human and AI texts")           # no split: the unedited texts, said so
    # refitted on every resample, the threshold is the best on that resample: the mean bootstrap accuracy is above the
    # mean accuracy of the point threshold held fixed on the same resamples (equal if it were not refitted)
    h = np.array([r["detector_score_ai"] for r in sorted(rows[:80], key=lambda r: r["sample_id"])])   # pivot order
    a = np.array([r["detector_score_ai"] for r in rows[80:160]])
    ih = M._resample(80, CFG["n_bootstrap"], CFG["seed"], "toy", "none", "apt-calib-human")
    ia = M._resample(80, CFG["n_bootstrap"], CFG["seed"], "toy", "none", "apt-calib-ai", "d")
    fixed = M.accuracy_rows(h[ih], a[ia], np.full(CFG["n_bootstrap"], e["threshold_acc"])).mean()
    assert e["accuracy_acc"] == pytest.approx(_max_accuracy(h, a))
    assert e["accuracy_acc_mean"] > fixed + 1e-3
    assert e["fpr_calib_acc_ci_low"] < e["fpr_calib_acc_ci_high"]


def test_wauroc_drops_nan_human_scores():
    assert M.wauroc_rows([1.0, 2.0, np.nan], [1.5, 3.0])[0] == pytest.approx(513 / 1025, abs=1e-12)   # was 0.5049
    rng = np.random.default_rng(1)
    h, a = rng.normal(0, 1, 30), rng.normal(1, 1, 20)
    hn = np.r_[h, [np.nan] * 3]
    assert M.wauroc_rows(hn, a)[0] == pytest.approx(M.wauroc_rows(h, a)[0], abs=1e-12)
    both = M.wauroc_rows(np.vstack([hn, np.r_[h, 0.0, 0.0, 0.0]]), a)
    assert both[0] == pytest.approx(M.wauroc_rows(h, a)[0], abs=1e-12)
    assert both[1] == pytest.approx(M.wauroc_rows(np.r_[h, 0.0, 0.0, 0.0], a)[0], abs=1e-12)


def test_mutual_information_unsmoothed_with_a_word_absent_from_one_class():
    assert mutual_information(0, 3, 4, 4, alpha=0.0) == pytest.approx(3 / 8 * math.log(2), abs=1e-12)   # raised ValueError
    assert mutual_information(5, 0, 10, 10, alpha=0.0) == pytest.approx(5 / 20 * math.log(2), abs=1e-12)
    recs = [{"label": "ai", "text": "We delve into the tapestry."}, {"label": "human", "text": "Cops said the blaze was out."}]
    r = MIRanker.fit(recs, alpha=0.0)
    assert r.mi["delve"] == pytest.approx(0.5 * math.log(2), abs=1e-12) and r.assoc["delve"] == "ai"
