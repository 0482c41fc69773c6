"""Attacks on human texts and the false-positive rate under attack (#38, setting `human_attacks`).

On the smallest inputs: the methods stage runs a listed attack on the human texts too (labelled human, conditions of
their own, the sanitize defense as on the AI side); family `human_attack` of `metrics.parquet` on a synthetic scores
frame against a hand computation; the bootstrap refits the threshold on every resample of the clean human texts and
resamples each attacked human text with its source; attacked human texts never reach a calibration (every number of
every other family, and the texts the figures and the explorer calibrate on, are those of the run without them); the
table and the figure are written from a tiny frame.
"""
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from stealth_eval import metrics as M
from stealth_eval.core import Cache, StealthEvalError, read_json, read_jsonl, write_json
from stealth_eval.methods import ai_side, attacked_human, human_side, run_methods_stage, sanitize

ALPHAS = [0.01, 0.05]
CFG = {"ci_level": 0.95, "n_bootstrap": 200, "fpr_targets": ALPHAS, "seed": 0, "calibrate_on": "", "length_bins": [0, 128, 512]}


def scores_frame(n_h=100, n_a=60, shift=1.0, seed=0, attacked=True, polished=True):
    """A scores table: detectors d1 (the attack on human texts raises their scores by `shift`) and d2 (unmoved), two
    domains, clean human texts (m0, and m0+sanitize), their attacked versions (same sample ids), AI texts and the same
    attack's AI outputs, and (`polished`) AI-polished human texts, so that APT-Eval's family is computed too."""
    rng = np.random.default_rng(seed)
    rows = []
    def add(label, sid, method, setting, defense, det, score):
        cond = method + (f":{setting}" if setting else "") + ("" if defense == "none" else f"+{defense}")
        rows.append({"dataset": "toy", "label": label, "sample_id": sid, "source_id": sid, "method": method, "setting": setting,
                     "defense": defense, "condition": cond, "candidate_rank": 0, "detector_name": det, "detector_family": "toy",
                     "detector_score_ai": score, "domain": "a" if sid[-1] in "02468" else "b", "generator": "human" if label == "human" else "lm",
                     "len_tokens_out": 100 + 300 * (int(sid[1:]) % 2), "truncated": False, "valid": True, "fail_reason": "",
                     "text_out": f"text {sid}", "facts": "{}"})
    for det, k in (("d1", 1.0), ("d2", 0.0)):
        for i in range(n_h):
            h = float(rng.normal())
            for d in ("none", "sanitize"):
                add("human", f"h{i}", "m0", "", d, det, h)
                if attacked: add("human", f"h{i}", "m5", human_side("homoglyph_p=0.01"), d, det, h + (k * shift if d == "none" else 0.0))
            if polished and i < 30: add("human", f"h{i}", "m0", "polish:degree=minor", "none", det, h + 0.5)
        for i in range(n_a):
            a = float(rng.normal(4.0))
            for d in ("none", "sanitize"):
                add("ai", f"a{i}", "m0", "", d, det, a)
                add("ai", f"a{i}", "m5", "homoglyph_p=0.01", d, det, a - (3.0 * k if d == "none" and i % 2 else 0.0))
    return pd.DataFrame(rows)


def ha_rows(records, **where) -> list:
    return [r for r in records if all(r[k] == v for k, v in where.items())]


def test_the_marker_round_trips():
    assert human_side("homoglyph_p=0.01") == "homoglyph_p=0.01,human" and human_side("") == "human"
    assert attacked_human("m5", "homoglyph_p=0.01,human") and not attacked_human("m5", "homoglyph_p=0.01")
    assert not attacked_human("m0", "human") and not attacked_human("m0", "polish:degree=minor")
    assert ai_side(human_side("guide=ensemble,N=4")) == "guide=ensemble,N=4"


def test_fpr_and_tpr_under_attack_by_hand():
    S = scores_frame()
    recs = M.compute_human_attacks(S, CFG)
    c = lambda lab, cond, det: S[(S.label == lab) & (S.condition == cond) & (S.detector_name == det)].detector_score_ai.to_numpy()
    for det in ("d1", "d2"):
        h, x, a = np.sort(c("human", "m0", det)), c("human", "m5:homoglyph_p=0.01,human", det), c("ai", "m5:homoglyph_p=0.01", det)
        for alpha in ALPHAS:
            k = int(np.floor(alpha * len(h) + 1e-9))                    # humans the threshold may flag
            t = np.nextafter(h[len(h) - k - 1], np.inf)
            (hr,) = ha_rows(recs, detector=det, defense="none", fpr=alpha, label="human")
            (ar,) = ha_rows(recs, detector=det, defense="none", fpr=alpha, label="ai")
            e, ea = hr["entry"], ar["entry"]
            assert (hr["family"], hr["condition"], hr["group"], ar["condition"], ar["group"]) == (
                "human_attack", "m5:homoglyph_p=0.01,human", "m5:homoglyph_p=0.01", "m5:homoglyph_p=0.01", "m5:homoglyph_p=0.01")
            assert e["threshold"] == t
            assert e["fpr"] == pytest.approx((x >= t).mean(), abs=1e-12) and e["fpr_clean"] == pytest.approx((h >= t).mean(), abs=1e-12)
            assert e["delta_fpr"] == pytest.approx(e["fpr"] - e["fpr_clean"], abs=1e-12)
            assert ea["tpr"] == pytest.approx((a >= t).mean(), abs=1e-12) and ea["asr"] == pytest.approx(1 - ea["tpr"], abs=1e-12)
            assert (e["n_human"], e["n_human_invalid"], ea["n_ai"], ea["n_ai_invalid"]) == (100, 0, 60, 0)
            assert e["pairing"].startswith("by source text")
    d1 = ha_rows(recs, detector="d1", defense="none", fpr=0.01, label="human")[0]["entry"]
    assert d1["fpr_clean"] <= 0.01 and d1["fpr"] > 0.05 and d1["delta_fpr_ci_low"] > 0   # a 1-sd shift: the FPR under attack is far above 1%
    # under the sanitize defense: the clean threshold of the sanitized humans, the AI side's sanitized condition
    (hs,) = ha_rows(recs, detector="d1", defense="sanitize", fpr=0.01, label="human")
    assert (hs["condition"], hs["group"]) == ("m5:homoglyph_p=0.01,human+sanitize", "m5:homoglyph_p=0.01+sanitize")
    # an invalid attacked text (no score) is left out of the FPR and counted
    S2 = S.copy()
    bad = (S2.condition == "m5:homoglyph_p=0.01,human") & S2.sample_id.isin(["h1", "h2"]) & (S2.detector_name == "d1")
    S2.loc[bad, "detector_score_ai"] = np.nan
    (e2,) = [r["entry"] for r in ha_rows(M.compute_human_attacks(S2, CFG), detector="d1", defense="none", fpr=0.05, label="human")]
    x2 = S2[(S2.condition == "m5:homoglyph_p=0.01,human") & (S2.detector_name == "d1")].detector_score_ai.dropna().to_numpy()
    (e1,) = [r["entry"] for r in ha_rows(recs, detector="d1", defense="none", fpr=0.05, label="human")]
    assert (e2["n_human"], e2["n_human_invalid"]) == (98, 2) and e2["fpr"] == pytest.approx((x2 >= e1["threshold"]).mean(), abs=1e-12)
    # the rows of metrics.parquet: family human_attack, the FPR target a column, higher_is_better False for the FPRs
    t = M.metrics_long(S, *M.compute_metrics(S, CFG), deployment=recs)
    ha = t[t.family == "human_attack"]
    assert set(ha.metric) == {f"human_attack:{m}" for m in ("fpr", "fpr_clean", "delta_fpr", "threshold", "tpr", "asr")}
    r = ha[(ha.metric == "human_attack:fpr") & (ha.detector == "d1") & (ha.defense == "none") & (ha.fpr_target == 0.01)].iloc[0]
    assert (r.value, r.label, r.method, r.setting, r.n_human, r.has_ci, r.higher_is_better) == (d1["fpr"], "human", "m5", "homoglyph_p=0.01,human", 100, True, False)
    assert json.loads(r.detail)["pairing"].startswith("by source text")


def test_the_bootstrap_refits_the_threshold_and_pairs_each_attacked_text_with_its_source():
    S = scores_frame()
    recs = M.compute_human_attacks(S, CFG)
    (c,) = [c for c in M.calibration_sets(S, CFG) if c["defense"] == "none"]
    h, ids, idx = M.human_scores(c, "d1")
    x = S[(S.condition == "m5:homoglyph_p=0.01,human") & (S.detector_name == "d1")].set_index("sample_id").detector_score_ai.reindex(ids).to_numpy()
    for alpha in ALPHAS:
        (e,) = [r["entry"] for r in ha_rows(recs, detector="d1", defense="none", fpr=alpha, label="human")]
        tb = M.threshold_at_fpr(h[idx], alpha)                           # refitted on each resample of the clean humans
        refit = M._summarise("fpr", np.nan, M.tpr_rows(x[idx], tb), 0.95)   # the attacked texts of the same sources
        assert (e["fpr_mean"], e["fpr_ci_low"], e["fpr_ci_high"]) == pytest.approx((refit["fpr_mean"], refit["fpr_ci_low"], refit["fpr_ci_high"]), abs=1e-12)
        fixed = M.tpr_rows(x[idx], np.full(len(idx), e["threshold"]))   # the point threshold kept fixed: other numbers
        assert not np.allclose(M.tpr_rows(x[idx], tb), fixed)
        # in every resample the refitted threshold flags at most alpha of the resampled clean humans; a fixed one does not
        assert e["fpr_clean_ci_high"] <= alpha + 1e-12
        assert np.percentile(M.tpr_rows(h[idx], np.full(len(idx), e["threshold"])), 97.5) > alpha
    # pairing: an attack that leaves every score as it is (d2) has FPR = clean FPR in every resample: a zero-width interval
    for alpha in ALPHAS:
        (e,) = [r["entry"] for r in ha_rows(recs, detector="d2", defense="none", fpr=alpha, label="human")]
        assert e["delta_fpr_ci_low"] == e["delta_fpr_ci_high"] == 0.0 and e["fpr_ci_high"] == e["fpr_clean_ci_high"]
    # attacked texts whose sources are not all calibration texts of the detector: their own draw, said in `pairing`
    S3 = S[~((S.condition == "m0") & (S.sample_id == "h0") & (S.detector_name == "d1"))]
    (e3,) = [r["entry"] for r in ha_rows(M.compute_human_attacks(S3, CFG), detector="d1", defense="none", fpr=0.05, label="human")]
    assert e3["pairing"] == "independent" and e3["n_human"] == 100


def _hum_sets(S):
    return [(c["dataset"], c["defense"], {d: list(v[0].index) for d, v in c["human"].items()}) for c in M.calibration_sets(S, CFG)]


def test_attacked_human_texts_never_reach_a_calibration(tmp_path):
    """Every calibration (metrics, thresholds, SHIELD, tau, APT-Eval, Beemo, the deployment views, acceptance's
    calibration sets, the ROC figure's and the explorer's calibration texts) is the same with and without attacked
    human texts, even when those score far above every clean human text."""
    clean = scores_frame(attacked=False)
    both = scores_frame(attacked=True, shift=50.0)                       # attacked humans far above everything, and first:
    first = both.condition.str.contains(",human")                        # where a selection by sample id alone takes them
    both = pd.concat([both[first], both[~first]], ignore_index=True)
    assert _hum_sets(both) == _hum_sets(clean)
    for c in M.calibration_sets(both, CFG):
        assert set(c["hum"].index) == {f"h{i}" for i in range(100)}          # the clean human texts' ids
    m1, t1 = M.compute_metrics(clean, CFG)
    m2, t2 = M.compute_metrics(both, CFG)
    assert t2 == t1                                                       # thresholds.json
    def table(S, m, t):
        return M.metrics_long(S, m, t, M.compute_shield(S, CFG), M.compute_tau(S, CFG), M.compute_apt(S, CFG),
                              M.compute_beemo(S, CFG), M.compute_deployment(S, CFG) + M.compute_human_attacks(S, CFG))
    a, b = table(clean, m1, t1), table(both, m2, t2)
    assert set(b.family) - set(a.family) == {"human_attack"} and {"main", "shield", "tau", "apt", "domain", "length"} <= set(a.family)
    attacked = b.condition.fillna("").str.contains(",human")
    b_rest = b[~attacked & (b.family != "human_attack")].reset_index(drop=True)
    pd.testing.assert_frame_equal(b_rest, a.reset_index(drop=True))      # every other number: the run without them
    # the attacked conditions in the main family are flag rates of edited human texts, never a calibration row
    main = b[attacked & (b.family == "main")]
    assert set(main.label) == {"human"} and set(main.metric) <= {"flag_rate", "threshold"}
    # acceptance and the figures read the same calibration sets; the ROC figure and the explorer pick the clean texts
    from stealth_eval.figures import results_frame, roc_data
    roc, roc0 = roc_data(both, results_frame(b), "toy"), roc_data(clean, results_frame(a), "toy")
    assert roc["n_human"] == {"d1": 100, "d2": 100}
    for det, cc in roc0["detectors"].items():
        for cond, x in cc.items():
            assert np.array_equal(roc["detectors"][det][cond]["fpr"], x["fpr"]) and roc["detectors"][det][cond]["op_fpr"] == x["op_fpr"]
    from stealth_eval.report import explorer_data
    write_json(tmp_path / "metrics.json", M.metrics_json_from_table(b))
    ex = explorer_data(tmp_path, "toy", "d1", "m5:homoglyph_p=0.01", scores=both, table=b)
    ex0 = explorer_data(tmp_path, "toy", "d1", "m5:homoglyph_p=0.01", scores=clean, table=b)
    assert ex["n_human"] == 100 and ex["fpr_at_threshold"] == ex0["fpr_at_threshold"] <= 0.01


def test_methods_stage_runs_a_listed_attack_on_human_texts(tmp_path):
    from stealth_eval.config import check_names
    from stealth_eval.data import dataset_path
    from stealth_eval.quality import quality_sources
    from stealth_eval.schema import Settings
    base = "The council said on Tuesday that the new bridge over the river would open to traffic early next year. "
    recs = [{"id": f"{l[0]}{i}", "label": l, "domain": "news", "generator": "human" if l == "human" else "lm",
             "text": f"{base}Report {l} number {i} adds more words to it."} for l in ("human", "ai") for i in range(3)]
    p = dataset_path(tmp_path, "toy"); p.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(recs).to_json(p, orient="records", lines=True)
    cfg = {**Settings().to_dict(), "out_dir": str(tmp_path), "datasets": [{"name": "toy", "path": None}], "methods": ["m0", "m5"],
           "homoglyph_rates": [0.02], "sanitize": ["m0", "m5"], "human_attacks": ["m5", "m1"]}
    run_methods_stage(cfg, Cache(enabled=False))
    raw = pd.DataFrame(read_jsonl(tmp_path / "raw_outputs.jsonl"))
    conds = raw.groupby("label")["condition"].agg(lambda c: sorted(set(c))).to_dict()
    assert conds == {"ai": ["m0", "m0+sanitize", "m5:homoglyph_p=0.02", "m5:homoglyph_p=0.02+sanitize"],
                     "human": ["m0", "m0+sanitize", "m5:homoglyph_p=0.02,human", "m5:homoglyph_p=0.02,human+sanitize"]}
    hum = raw[raw.label == "human"].set_index(["condition", "sample_id"])["text_out"]
    for i in range(3):
        att, src = hum["m5:homoglyph_p=0.02,human", f"h{i}"], hum["m0", f"h{i}"]
        assert att != src and sanitize(att) == src == hum["m5:homoglyph_p=0.02,human+sanitize", f"h{i}"]   # the defense applied
    # quality measures an attacked human text against its clean source
    got = dict(zip(zip(raw.condition, raw.sample_id), quality_sources(raw)))
    assert got["m5:homoglyph_p=0.02,human", "h1"] == hum["m0", "h1"]
    # a listed method that is not among the run's methods: skipped, with its reason
    assert "m1 on human texts" in read_json(tmp_path / "skipped.json")["methods"]
    # the setting names attacks on AI texts: m0 and a method that edits human texts already are refused
    import stealth_eval.humanify  # noqa: F401  (registers polish)
    for bad in ("m0", "polish"):
        with pytest.raises(StealthEvalError, match=f"human_attacks.{bad}: method {bad} is no attack on AI texts"):
            check_names({**cfg, "human_attacks": [bad]})
    check_names(cfg)


def test_table_and_figure_from_a_tiny_frame(tmp_path):
    S = scores_frame(n_h=40, n_a=20, polished=False)
    S.to_parquet(tmp_path / "scores.parquet", index=False)
    M.run_metrics_stage({**CFG, "out_dir": str(tmp_path), "n_bootstrap": 50})
    t = pd.read_parquet(tmp_path / "metrics.parquet")
    assert (t.family == "human_attack").any()
    written = {Path(p).name for p in M.extra_tables(tmp_path)}
    assert {"table_human_attack.md", "table_human_attack.tex"} <= written
    md = (tmp_path / "tables" / "table_human_attack.md").read_text(encoding="utf-8")
    assert "False-positive rate under attack: toy (defense none)" in md and "(defense sanitize)" in md
    r = t[(t.metric == "human_attack:fpr") & (t.detector == "d1") & (t.defense == "none") & (t.fpr_target == 0.05)].iloc[0]
    assert f"{r.value:.3f} [{r.ci_low:.3f}, {r.ci_high:.3f}]" in md and "**Texts per detector**" in md
    from stealth_eval.figures import plot_human_attack
    data = plot_human_attack(t, "toy", tmp_path / "fig_fpr_attack_toy.png", 0.05)
    assert list(data) == ["d1", "d2"] and (tmp_path / "fig_fpr_attack_toy.png").stat().st_size > 10_000
    assert [p["short"] for p in data["d1"]["points"]] == ["M5 p=1%", "M5 p=1% +san"]
    assert data["d1"]["points"][0]["fpr"] == r.value
