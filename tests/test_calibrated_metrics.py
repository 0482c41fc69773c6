"""P(AI) and the metrics of the field (`metrics.compute_probability`, nbs/30_calibration_metrics): every definition against
the reference's own function on the same numbers (scikit-learn; MGT-Eval's Platt fit, ECE and risk-coverage, PAN 2025's
C@1 and F0.5u and Fast-DetectGPT's posterior, restated from their code), the cross-fitted probabilities and their
bootstrap intervals recomputed by plain loops, and the session's tiny run: every new metric and both figures written,
their values those of the reference functions on the run's own scores.
"""
import itertools
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy.stats import norm
from sklearn.calibration import calibration_curve
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import accuracy_score, auc, brier_score_loss, f1_score, precision_recall_curve

from stealth_eval import metrics as M
from stealth_eval.core import stable_hash
from test_metrics import ref_summary, seed_rule


# ---------------------------------------------------------------------------------------------------------------------
# The references, restated from their code
# ---------------------------------------------------------------------------------------------------------------------

def mgt_platt(x, y, l2=1e-2, max_iter=200, tol=1e-6):
    "MGT-Eval src/calibration/platt.py _irls_fit: (b0, b1, mean, std)."
    x, y = np.asarray(x, float), np.asarray(y, float)
    mu = float(np.mean(x)); sd = float(np.std(x)) if float(np.std(x)) > 1e-12 else 1.0
    z = (x - mu) / sd; b0, b1 = 0.0, 1.0
    for _ in range(max_iter):
        p = 1.0 / (1.0 + np.exp(-(b0 + b1 * z))); w = p * (1.0 - p) + 1e-12
        g0, g1 = np.sum(p - y), np.sum((p - y) * z) + l2 * b1
        h00, h01, h11 = np.sum(w), np.sum(w * z), np.sum(w * z * z) + l2
        det = h00 * h11 - h01 * h01
        if abs(det) < 1e-12: break
        d0, d1 = -(h11 * g0 - h01 * g1) / det, -(-h01 * g0 + h00 * g1) / det
        b0, b1 = b0 + d0, b1 + d1
        if max(abs(d0), abs(d1)) < tol: break
    return b0, b1, mu, sd


def mgt_apply(s, fit):
    "MGT-Eval apply_platt (in float64; MGT-Eval returns float32)."
    b0, b1, mu, sd = fit
    return np.clip(1.0 / (1.0 + np.exp(-np.clip(b0 + b1 * (np.asarray(s, float) - mu) / sd, -80, 80))), 1e-6, 1 - 1e-6)


def fdg_posterior(x, mu0, sigma0, mu1, sigma1):
    "Fast-DetectGPT scripts/local_infer.py compute_prob_norm."
    p0, p1 = norm.pdf(x, loc=mu0, scale=sigma0), norm.pdf(x, loc=mu1, scale=sigma1)
    return p1 / (p0 + p1)


def fdg_fit(h, a):
    "Its parameters as statistics of human and AI criteria: mean, std, sigma1 = 2 sigma0."
    return np.mean(h), np.std(h), np.mean(a), 2 * np.std(h)


def mgt_ece(y, p, bins=10):
    "MGT-Eval src/eval/_metrics_curves.py _ece_brier: the ECE."
    s, a, c = [0.0] * bins, [0.0] * bins, [0] * bins
    for yi, pi in zip(y, p):
        b = min(bins - 1, int(pi * bins)); s[b] += pi; a[b] += yi; c[b] += 1
    return sum(c[b] / len(y) * abs(s[b] / c[b] - a[b] / c[b]) for b in range(bins) if c[b])


def mgt_risk(y, p):
    "MGT-Eval _risk_coverage: the risks at coverage 1/n, 2/n, ..."
    order = sorted(range(len(y)), key=lambda i: -max(p[i], 1 - p[i]))
    right, out = 0, []
    for k, i in enumerate(order, 1):
        right += (1 if p[i] >= 0.5 else 0) == y[i]; out.append(1 - right / k)
    return np.array(out)


def expected_risk(y, p):
    "The risks with equal confidences in every order equally likely: the errors of a tie group spread evenly over its positions."
    conf = np.maximum(p, 1 - p)
    err = ((np.asarray(p) >= 0.5) != (np.asarray(y) == 1)).astype(float)
    out, done, before = [], 0, 0.0
    for c in sorted(set(conf), reverse=True):
        g = err[conf == c]
        for j in range(1, len(g) + 1): out.append((before + j * g.sum() / len(g)) / (done + j))
        done += len(g); before += g.sum()
    return np.array(out)


def pan_c_at_1(y, p):
    nu = p == 0.5
    nc = np.sum((y == (p > 0.5))[~nu]); nu = np.sum(nu)
    return float((1 / len(y)) * (nc + (nu * nc / len(y))))


def pan_f05u(y, p):
    tp, fn, fp, nu = np.sum(y * (p > 0.5)), np.sum(y * (p < 0.5)), np.sum((1.0 - y) * (p > 0.5)), np.sum(p == 0.5)
    d = 1.25 * tp + 0.25 * (fn + nu) + fp
    return None if d == 0.0 else float((1.25 * tp) / d)


def sk_aupr(h, a):
    a = a[~np.isnan(a)]
    pr, rc, _ = precision_recall_curve(np.r_[np.zeros(len(h)), np.ones(len(a))], np.r_[h, a])
    return auc(rc, pr)


def ref_prob_metrics(ph, pa):
    "Every metric of one (human, AI) set of P(AI) by the references' functions."
    pa = pa[~np.isnan(pa)]
    y, p = np.r_[np.zeros(len(ph)), np.ones(len(pa))], np.r_[ph, pa]
    f05 = pan_f05u(y, p)
    return {"ece": mgt_ece(y, p), "brier": brier_score_loss(y, p), "aurc": expected_risk(y, p).mean(),
            "f1": f1_score(y, p >= 0.5, zero_division=0), "accuracy": accuracy_score(y, p >= 0.5), "c_at_1": pan_c_at_1(y, p),
            "f05u": math.nan if f05 is None else f05, "one_minus_brier": 1 - brier_score_loss(y, np.clip(p, 0, 1))}


# ---------------------------------------------------------------------------------------------------------------------
# Definitions against the references
# ---------------------------------------------------------------------------------------------------------------------

def test_platt_and_the_posterior_are_the_references():
    "Platt: MGT-Eval's IRLS (1e-12) and scikit-learn's logistic regression at C = 1/0.01 (1e-6); Fast-DetectGPT's posterior (1e-12)."
    rng = np.random.default_rng(0)
    for _ in range(60):
        nh, na = rng.integers(3, 60, 2)
        s = np.r_[rng.normal(0, 1, nh), rng.normal(rng.uniform(0, 4), rng.uniform(0.3, 3), na)] * rng.uniform(0.01, 50) + rng.uniform(-9, 9)
        y = np.r_[np.zeros(nh), np.ones(na)]
        f = M.platt_fit(s, y)
        ref = mgt_platt(s, y)
        np.testing.assert_allclose([f[k][0] for k in ("b0", "b1", "mean", "std")], ref, rtol=1e-10, atol=1e-12)
        x = np.linspace(s.min() - 3, s.max() + 3, 40)
        np.testing.assert_allclose(M.platt_apply(x, {k: v[0] for k, v in f.items()}), mgt_apply(x, ref), rtol=0, atol=1e-12)
        g = M.gaussian2_fit(s, y)
        np.testing.assert_allclose([g[k][0] for k in ("mu0", "sigma0", "mu1", "sigma1")], fdg_fit(s[:nh], s[nh:]), rtol=1e-12)
    s = np.r_[rng.normal(0, 1, 200), rng.normal(1, 1.5, 150)]; y = np.r_[np.zeros(200), np.ones(150)]
    lr = LogisticRegression(C=1 / M.PLATT_L2, tol=1e-12, max_iter=10_000).fit(((s - s.mean()) / s.std())[:, None], y)
    f = M.platt_fit(s, y)
    np.testing.assert_allclose([f["b0"][0], f["b1"][0]], [lr.intercept_[0], lr.coef_[0, 0]], atol=1e-6)
    idx = rng.integers(0, 350, (4, 350))                          # a row of weights is the fit of that resample's texts
    W = np.stack([np.bincount(i, minlength=350) for i in idx]).astype(float)
    fw = M.platt_fit(s, y, W)
    for b, i in enumerate(idx): np.testing.assert_allclose([fw["b0"][b], fw["b1"][b]], mgt_platt(s[i], y[i])[:2], rtol=1e-9, atol=1e-12)
    x = np.linspace(-6, 12, 301)                                  # the reference's printed parameters, its four model pairs
    for pars in ((0.2713, 0.9366, 2.2334, 1.8731), (-0.2489, 0.9968, 1.8983, 1.9935), (-0.0707, 0.9520, 2.9306, 1.9039),
                 (0.1603, 1.0791, 2.4686, 2.1582)):
        got = M.gaussian2_apply(x, dict(zip(("mu0", "sigma0", "mu1", "sigma1"), pars)))
        np.testing.assert_allclose(got, fdg_posterior(x, *pars), rtol=0, atol=1e-12)


def test_metrics_are_the_references_functions():
    "AUPR (scikit-learn PR + auc), Brier, ECE, the reliability bins, F1, accuracy, PAN's C@1, F0.5u, 1 - Brier, risk-coverage: 1e-12."
    rng = np.random.default_rng(1)
    n_cal = 0
    for t in range(200):
        nh, na = rng.integers(1, 50, 2)
        q = [0, 0.5, 0.1][t % 3]
        h, a = rng.normal(0, 1, nh), rng.normal(rng.uniform(-1, 3), 1, na)
        if q: h, a = np.round(h / q) * q, np.round(a / q) * q       # ties
        a[rng.uniform(size=na) < 0.1] = np.nan                      # invalid AI texts: left out
        assert M.aupr_rows(h, a)[0] == pytest.approx(sk_aupr(h, a), abs=1e-12) if (~np.isnan(a)).any() else math.isnan(M.aupr_rows(h, a)[0])
        ph, pa = 1 / (1 + np.exp(-2 * (h - 0.5))), 1 / (1 + np.exp(-2 * (a - 0.5)))   # P = 0.5 exactly where a score is 0.5
        if not (~np.isnan(pa)).any(): continue
        ref = ref_prob_metrics(ph, pa)
        got = {"ece": M.ece_rows(ph, pa)[0], "brier": M.brier_rows(ph, pa)[0], "aurc": M.aurc_rows(ph, pa)[0], **{k: v[0] for k, v in M.decision_rows(ph, pa).items()}}
        for k, v in ref.items(): assert got[k] == pytest.approx(v, abs=1e-12, nan_ok=True), (t, k)
        p, y = np.r_[ph, pa[~np.isnan(pa)]], np.r_[np.zeros(nh), np.ones((~np.isnan(pa)).sum())]
        conf = np.maximum(p, 1 - p)
        if len(set(conf)) == len(conf): np.testing.assert_allclose(M.risk_coverage_rows(ph, pa)[1][0][:len(p)], mgt_risk(y, p), atol=1e-12)
        if not np.isclose((p * 10) % 1, 0).any() and not np.isclose((p * 10) % 1, 1).any():
            rb = M.reliability_bins(ph, pa); rb = rb[rb.n > 0]
            pt, pp = calibration_curve(y, p, n_bins=10)
            np.testing.assert_allclose(np.r_[rb.ai_share, rb.p_mean], np.r_[pt, pp], atol=1e-12); n_cal += 1
    assert n_cal > 50
    y, p = np.array([1, 0, 1, 0, 1, 0, 0.]), np.array([0.9, 0.9, 0.9, 0.2, 0.2, 0.6, 0.6])   # ties: MGT-Eval's curve over every order
    mean_curve = np.mean([mgt_risk(y[list(o)], p[list(o)]) for o in itertools.permutations(range(7))], 0)
    np.testing.assert_allclose(M.risk_coverage_rows(p[y == 0], p[y == 1])[1][0], mean_curve, atol=1e-12)


# ---------------------------------------------------------------------------------------------------------------------
# The cross-fitted P(AI) and its intervals, by plain loops
# ---------------------------------------------------------------------------------------------------------------------

def folds_by_rule(units, K, seed, ds):
    "The documented fold rule: the sorted units permuted by default_rng(stable_hash([seed, dataset, 'calibration-folds'])), dealt in turn."
    units = sorted(set(units), key=str)
    perm = np.random.default_rng(int(stable_hash([seed, ds, "calibration-folds"])[:8], 16)).permutation(len(units))
    return {units[p]: r % K for r, p in enumerate(perm)}


def loop_probabilities(scores, cfg, groups, ds, det, method="platt", defense="none", idx=None):
    """{(condition, label, sample_id): P(AI)} of one detector, cross-fitted by loops on the unedited texts (`idx`: the resample
    indices (human, AI) of one bootstrap draw: the fit and the texts are that draw's, each text keeping its fold); with `idx`, a
    list of (label, condition, P) per drawn text instead."""
    s = scores[(scores.dataset == ds) & (scores.defense == defense) & (scores.candidate_rank == 0)]
    orig = "m0" if defense == "none" else f"m0+{defense}"
    unit = lambda i: groups.get((ds, str(i)), str(i))
    hum_all = sorted(s.loc[(s.label == "human") & (s.condition == orig), "sample_id"].unique())
    ai_all = sorted(s.loc[(s.label == "ai") & (s.condition == orig), "sample_id"].unique())
    units = {unit(i) for i in hum_all + ai_all}
    K = max(2, min(cfg.get("calibration_folds", 5), len(units)))
    fold = folds_by_rule(units, K, cfg["seed"], ds)
    mine = s[s.detector_name == det]
    hs = mine[(mine.label == "human") & (mine.condition == orig)].set_index("sample_id")["detector_score_ai"].dropna().sort_index()
    ai = mine[mine.label == "ai"].pivot_table(index="sample_id", columns="condition", values="detector_score_ai", aggfunc="first", dropna=False)
    ai = ai.reindex(ai_all)
    train = [(i, v, 0.0) for i, v in hs.items()] + [(i, v, 1.0) for i, v in ai[orig].items() if not math.isnan(v)]
    if idx is not None:
        ih, ia = idx
        hid = list(hs.index)
        train = [(hid[j], hs.iloc[j], 0.0) for j in ih] + [(ai_all[j], ai[orig].iloc[j], 1.0) for j in ia if not math.isnan(ai[orig].iloc[j])]
    fits = {}
    for k in range(K):
        x = np.array([v for i, v, _ in train if fold[unit(i)] != k]); y = np.array([l for i, _, l in train if fold[unit(i)] != k])
        fits[k] = mgt_platt(x, y) if method == "platt" else fdg_fit(x[y == 0], x[y == 1])
    prob = lambda i, v: float(mgt_apply([v], fits[fold[unit(i)]])[0] if method == "platt" else fdg_posterior(v, *fits[fold[unit(i)]]))
    if idx is None:
        out = {(orig, "human", i): prob(i, v) for i, v in hs.items()}
        for c in ai.columns:
            out.update({(c, "ai", i): prob(i, v) for i, v in ai[c].items() if not math.isnan(v)})
        return out
    hid = list(hs.index)
    rows = [("human", orig, prob(hid[j], hs.iloc[j])) for j in ih]
    for c in ai.columns:
        rows += [("ai", c, prob(ai_all[j], ai[c].iloc[j])) for j in ia if not math.isnan(ai[c].iloc[j])]
    return rows


def toy_scores(seed=0, n=40):
    "Fast-DetectGPT, another detector and a provider's probability; 40 human and 40 AI texts paired by source; one attack."
    rng, rows = np.random.default_rng(seed), []
    for det, shift in (("fast_detectgpt", 2.0), ("d2", 0.8), ("gptzero", None)):
        for i in range(n):
            h, a = rng.normal(), rng.normal(shift or 0)
            if det == "gptzero": h, a = 1 / (1 + np.exp(-h - 1)), 1 / (1 + np.exp(-a + 1))
            att = a - 1.0 if det != "gptzero" else a / 2
            rows += [("human", f"h{i}", "m0", "", det, h), ("ai", f"a{i}", "m0", "", det, a),
                     ("ai", f"a{i}", "m5", "p=1", det, att if i % 5 else np.nan)]
    df = pd.DataFrame(rows, columns=["label", "sample_id", "method", "setting", "detector_name", "detector_score_ai"])
    return df.assign(condition=[m + (f":{s}" if s else "") for m, s in zip(df.method, df.setting)], dataset="toy",
                     candidate_rank=0, defense="none")


GROUPS = {("toy", f"{c}{i}"): str(i) for i in range(40) for c in "ha"}
CFG = {"ci_level": 0.95, "n_bootstrap": 30, "fpr_targets": [0.01], "seed": 3, "calibration_folds": 4}


def test_cross_fitted_probabilities_by_loops():
    "Each text's P(AI) is the fit of the folds without its source (MGT-Eval's Platt, Fast-DetectGPT's statistics), by loops: 1e-9."
    sc = toy_scores()
    pf = M.probability_frame(sc, CFG, GROUPS)
    for det, method in (("d2", "platt"), ("fast_detectgpt", "platt"), ("fast_detectgpt", "gaussian2")):
        ref = loop_probabilities(sc, CFG, GROUPS, "toy", det, method)
        got = pf[(pf.detector == det) & (pf.calibrator == method) & pf.p_ai.notna()]
        assert len(got) == len(ref) == 40 + 40 + 32
        for r in got.itertuples(index=False): assert r.p_ai == pytest.approx(ref[(r.condition, r.label, r.sample_id)], abs=1e-9)
    g = pf[(pf.detector == "gptzero")]
    assert set(g.calibrator) == {"provider"} and (g.p_ai.dropna() == g.score.dropna()).all()      # the provider's, as is
    assert g.groupby(["sample_id"]).fold.nunique().max() == 1 and pf[pf.sample_id.isin(["h3", "a3"])].fold.nunique() == 1


def test_bootstrap_intervals_refit_the_calibrator():
    """The intervals: in every resample (the documented seed rule) the calibrators are refitted on the drawn texts, folds kept,
    and the metrics taken by the references' functions; mean and percentile interval as the main family's: 1e-9."""
    sc, B = toy_scores(), CFG["n_bootstrap"]
    recs = {(r["detector"], r["group"], r["condition"]): r["entry"] for r in M.compute_probability(sc, CFG, GROUPS)}
    hid = sorted(sc.loc[(sc.label == "human") & (sc.condition == "m0"), "sample_id"].unique())
    aid = sorted(sc.loc[(sc.label == "ai") & (sc.condition == "m0"), "sample_id"].unique())
    ih = seed_rule(len(hid), B, CFG["seed"], "toy", "none", "human")
    ia = seed_rule(len(aid), B, CFG["seed"], "toy", "none", "ai", stable_hash(aid))
    for det, method in (("d2", "platt"), ("fast_detectgpt", "gaussian2")):
        point = loop_probabilities(sc, CFG, GROUPS, "toy", det, method)
        draws = [loop_probabilities(sc, CFG, GROUPS, "toy", det, method, idx=(ih[b], ia[b])) for b in range(B)]
        for cond in ("m0", "m5:p=1"):
            ph = np.array([v for (c, l, _), v in point.items() if l == "human"])
            pa = np.array([v for (c, l, _), v in point.items() if l == "ai" and c == cond])
            ref = ref_prob_metrics(ph, pa)
            bs = [ref_prob_metrics(np.array([p for l, c, p in d if l == "human"]), np.array([p for l, c, p in d if l == "ai" and c == cond]))
                  for d in draws]
            e = recs[det, method, cond]
            for k in ref:
                want = ref_summary(k, ref[k], [x[k] for x in bs], CFG["ci_level"])
                for key, v in want.items(): assert e[key] == pytest.approx(v, abs=1e-9, nan_ok=True), (det, method, cond, key)
        # AUPR: the scores' own, resampled as the AUROC
        h = sc[(sc.detector_name == det) & (sc.label == "human")].set_index("sample_id")["detector_score_ai"].sort_index().to_numpy()
        a = sc[(sc.detector_name == det) & (sc.condition == "m5:p=1")].set_index("sample_id")["detector_score_ai"].reindex(aid).to_numpy()
        want = ref_summary("aupr", sk_aupr(h, a), [sk_aupr(h[ih[b]], a[ia[b]]) for b in range(B)], CFG["ci_level"])
        for key, v in want.items(): assert recs[det, None, "m5:p=1"][key] == pytest.approx(v, abs=1e-12)


def test_fits_and_failures_are_reported():
    "The fit row of each calibrator (split, folds, every fold's parameters and the whole split's), and the failures with their reasons."
    sc = toy_scores()
    sc = pd.concat([sc, sc[sc.detector_name == "d2"].assign(detector_name="d_noai",
                                                             detector_score_ai=lambda x: x.detector_score_ai.where(x.label == "human")),
                    sc[sc.detector_name == "d2"].assign(detector_name="d_none", detector_score_ai=np.nan, fail_reason="HTTP 503")])
    recs = M.compute_probability(sc, CFG, GROUPS)
    fit = {(r["detector"], r["group"]): r["entry"] for r in recs if r["condition"] is None}
    assert set(fit) == {("d2", "platt"), ("fast_detectgpt", "platt"), ("fast_detectgpt", "gaussian2"), ("gptzero", "provider"),
                        ("d_noai", "platt"), ("d_none", "platt")}
    e = fit["d2", "platt"]
    assert (e["n_human"], e["n_ai"], e["folds"]) == (40, 40, 4) and [f["fold"] for f in e["fits"]] == [0, 1, 2, 3, "all"]
    hs = sc[(sc.detector_name == "d2") & (sc.condition == "m0")]
    assert [e["fits"][-1][k] for k in ("b0", "b1", "mean", "std")] == pytest.approx(
        mgt_platt(hs.detector_score_ai, (hs.label == "ai").astype(float)), abs=1e-12)
    assert "cross-fitted" in e["split"] and fit["gptzero", "provider"]["split"].startswith("none")
    assert fit["d_noai", "platt"]["status"] == "failed" and "no valid unedited AI text (m0)" in fit["d_noai", "platt"]["reason"]
    assert fit["d_none", "platt"]["status"] == "failed" and fit["d_none", "platt"]["reason"].startswith("no calibration:")
    assert not [r for r in recs if r["detector"] in ("d_noai", "d_none") and r["condition"] is not None and r["group"]]
    t = M.metrics_long(sc, {}, {}, deployment=recs)
    assert set(t.family) == {"probability"} and t.loc[t.metric == "probability:ece", "higher_is_better"].eq(False).all()
    assert t.loc[t.metric == "probability:c_at_1", "higher_is_better"].all() and t.loc[t.metric == "probability:ece", "has_ci"].all()


# ---------------------------------------------------------------------------------------------------------------------
# The session's tiny run
# ---------------------------------------------------------------------------------------------------------------------

PROB_METRICS = ("ece", "brier", "aurc", "f1", "accuracy", "c_at_1", "f05u", "one_minus_brier")


# The field's 2025-26 detectors that run offline (TOCSIN's BART does not: skipped with its reason) on a training split of
# four texts a class, ImBD's and DDL's stand-in LoRAs trained for two steps on 32-token texts: the trainings and fits
# themselves are tests/test_imbd.py's and tests/test_adadetectgpt.py's.
NEW_DETECTORS = ["specdetect", "specdetect_pp", "adadetectgpt", "glimpse_local", "imbd_local", "detectanyllm_local", "tocsin"]


@pytest.fixture(scope="module")
def new_detectors_run(tmp_path_factory):
    "A tiny CLI run of the new detectors on four texts a class, M0 only (about a minute)."
    from conftest import run_cli, shared_run
    def make(d):
        run_cli("--profile", "tiny", "--methods", "m0", "--detectors", *NEW_DETECTORS, "--set", "data.n_per_class=4",
                "--set", "data.n_train_per_class=4",
                *[a for k in ("imbd", "detectanyllm") for a in ("--set", f"{k}.local_steps=2", "--set", f"{k}.local_max_tokens=32")],
                "--offline",
                "--out_dir", d / "out", "--cache_dir", d / "store")
        return {"out": d / "out"}
    return Path(shared_run(tmp_path_factory, "new_detectors_run", make)["out"])


@pytest.mark.parametrize("run", ["tiny_run", "new_detectors_run"])
def test_tiny_run_writes_every_new_metric_and_both_figures(run, request):
    """The CLI's tiny run, and one of the new detectors: TPR at 5% FPR beside 1%, AUPR and every metric of P(AI) for every
    detector and condition, the reliability and risk-coverage figures and the table; the values those of the reference
    functions on its scores.parquet, with P(AI) cross-fitted by loops on its data/lee_news.jsonl sources."""
    r = request.getfixturevalue(run)
    out = Path(r["out"] if isinstance(r, dict) else r)
    cfg = json.loads((out / "config.json").read_text())
    sc, t = pd.read_parquet(out / "scores.parquet"), pd.read_parquet(out / "metrics.parquet")
    assert cfg["fpr_targets"] == [0.01, 0.05]
    main = t[(t.family == "main") & (t.metric == "tpr") & t.detector.notna() & t.condition.notna()]
    assert set(main.fpr_target) == {0.01, 0.05}
    p = t[t.family == "probability"]
    dets = sorted(sc.detector_name.unique())
    conds = sorted(sc.loc[(sc.label == "ai") & (sc.defense == "none"), "condition"].unique())
    groups = M.source_groups(out, ["lee_news"])
    assert groups and groups["lee_news", sorted(sc.loc[sc.label == "ai", "sample_id"])[0]] == groups["lee_news", sorted(sc.loc[sc.label == "human", "sample_id"])[0]]
    checked = 0
    for det in dets:
        sd = sc[(sc.detector_name == det) & (sc.defense == "none") & (sc.candidate_rank == 0)]
        h = sd[sd.label == "human"].set_index("sample_id")["detector_score_ai"].dropna().sort_index().to_numpy()
        ai = sd[sd.label == "ai"].pivot_table(index="sample_id", columns="condition", values="detector_score_ai", aggfunc="first", dropna=False)
        probs = {m: loop_probabilities(sc, cfg, groups, "lee_news", det, m) for m in M.calibrators_of(det)}
        for c in conds:
            row = lambda metric, g=None: p[(p.detector == det) & (p.condition == c) & (p.defense == "none") & (p.metric == f"probability:{metric}")
                                           & (p.group.isna() if g is None else p.group == g)]
            got = row("aupr")
            assert len(got) == 1 and got.value.iloc[0] == pytest.approx(sk_aupr(h, ai[c].to_numpy()), abs=1e-12)
            for m, pm in probs.items():
                ph = np.array([v for (cc, l, _), v in pm.items() if l == "human"])
                pa = np.array([v for (cc, l, _), v in pm.items() if l == "ai" and cc == c])
                for k, v in ref_prob_metrics(ph, pa).items():
                    got = row(k, m)
                    assert len(got) == 1 and got.value.iloc[0] == pytest.approx(v, abs=1e-9, nan_ok=True), (det, c, m, k)
                    assert got.has_ci.iloc[0] and got.ci_low.iloc[0] <= got.ci_high.iloc[0]
                    checked += 1
    assert checked >= len(dets) * len(conds) * len(PROB_METRICS)
    if run == "tiny_run": assert "gaussian2" in set(p.loc[p.detector == "fast_detectgpt", "group"])
    else:
        assert dets == sorted(NEW_DETECTORS[:-1])
        assert "BART" in json.loads((out / "skipped.json").read_text())["detectors"]["tocsin"]
    for f in ("figures/fig_reliability_lee_news.png", "figures/fig_risk_coverage_lee_news.png", "tables/table_probability.md",
              "tables/table_probability.tex"):
        assert (out / f).stat().st_size > 0, f
    md = (out / "tables" / "table_probability.md").read_text()
    assert "TPR@5%FPR" in md and "calibrated P(AI)" in md and "the calibrators" in md
    hib = json.loads((out / "results.json").read_text())["higher_is_better"]
    assert hib["probability:aupr"] and hib["probability:c_at_1"] and not hib["probability:ece"] and not hib["probability:aurc"]
