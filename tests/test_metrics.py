"""Metrics (`stealth_eval.metrics`): every number of `metrics.json` recomputed from `scores.parquet` by an independent,
straightforward implementation (loops, sklearn's AUROC, the threshold rule written from its definition, the bootstrap
indices regenerated from the public seed rule); SHIELD (W-AUROC, SFD, URSS) and tau on hand-worked examples; the
threshold rule on tied and quantised scores.
"""
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import roc_auc_score

from stealth_eval import metrics as M
from stealth_eval.core import stable_hash, to_jsonable

DATA = Path(__file__).parent / "data" / "metrics_tiny"


# ---------------------------------------------------------------------------------------------------------------------
# An independent reference implementation of metrics.json
# ---------------------------------------------------------------------------------------------------------------------

def ref_threshold(h, alpha):
    """Smallest threshold t with mean(h >= t) <= alpha, from the definition: the flagged share only drops just above a
    human score v, so t is the next float above the smallest v with #(h > v) <= alpha * n, or -inf if all may be flagged."""
    h = [float(x) for x in h]
    n = len(h)
    if n <= alpha * n + 1e-9 * n: return -math.inf                     # flagging every human text is allowed
    for v in sorted(set(h)):
        if sum(1 for x in h if x > v) <= alpha * n + 1e-9: return float(np.nextafter(v, math.inf))
    raise AssertionError("unreachable: nothing is above the largest score")


def ref_auc(h, a):
    a = [x for x in a if not math.isnan(x)]
    if not a: return math.nan
    return roc_auc_score([0] * len(h) + [1] * len(a), list(h) + a)


def ref_tpr(a, t):
    a = [x for x in a if not math.isnan(x)]
    return sum(1 for x in a if x >= t) / len(a) if a else math.nan


def seed_rule(n, B, *key):
    "The documented resampling rule: default_rng(first 8 hex digits of stable_hash(key)).integers(0, n, (B, n))."
    return np.random.default_rng(int(stable_hash(list(key))[:8], 16)).integers(0, max(n, 1), size=(B, n))


def ref_summary(name, point, draws, level):
    d = np.array([x for x in draws if not math.isnan(x)], dtype=float)
    if not len(d): return {name: point, f"{name}_mean": math.nan, f"{name}_ci_low": math.nan, f"{name}_ci_high": math.nan}
    lo, hi = np.percentile(d, [50 * (1 - level), 100 - 50 * (1 - level)])
    return {name: point, f"{name}_mean": d.mean(), f"{name}_ci_low": lo, f"{name}_ci_high": hi}


def ref_metrics(scores, cfg):
    """metrics.json and thresholds.json recomputed with loops (every FPR target: the 1% one under the key names `tpr1`,
    `asr`, ..., another under `tpr@0.05`, `asr@0.05`, ...; the mean over detectors at the first); a detector without a
    valid human text is left out (the library reports it failed: tested on its own)."""
    alphas = cfg["fpr_targets"]
    key = lambda a: "1" if abs(a - 0.01) < 1e-12 else f"@{a:g}"
    B, level, seed = cfg["n_bootstrap"], cfg["ci_level"], cfg["seed"]
    shared = cfg.get("valid_set", "per_detector") == "shared"
    s = scores[scores["candidate_rank"] == 0]
    out, thr = {}, {}
    for ds in sorted(s["dataset"].unique()):
        sd = s[s["dataset"] == ds]
        dets = sorted(sd["detector_name"].unique())
        out[ds] = {d: {} for d in dets}; thr[ds] = {d: {} for d in dets}
        for defense in sorted(sd["defense"].unique()):
            x = sd[sd["defense"] == defense]
            orig = "m0" if defense == "none" else f"m0+{defense}"
            score = {(r.detector_name, r.label, r.condition, r.sample_id): r.detector_score_ai for r in x.itertuples()}
            hum_ids = sorted(set(x.loc[(x["label"] == "human") & (x["condition"] == orig), "sample_id"]))
            valid = lambda d, i: not math.isnan(score.get((d, "human", orig, i), math.nan))
            scored = [d for d in dets if any(valid(d, i) for i in hum_ids)]
            shared_ids = [i for i in hum_ids if all(valid(d, i) for d in scored)]
            # a detector's calibration texts: its own valid ones (valid_set=per_detector) or the shared set; the resample
            # key names the texts unless they are all the unedited human texts (or the shared set)
            own = {d: shared_ids if shared else [i for i in hum_ids if valid(d, i)] for d in scored}
            own = {d: ids for d, ids in own.items() if ids}
            if not own: continue
            draw = lambda ids: seed_rule(len(ids), B, seed, ds, defense, "human", *(() if shared or len(ids) == len(hum_ids) else (stable_hash(ids),)))
            ai = x[x["label"] == "ai"]
            base = sorted(set(ai.loc[ai["condition"] == orig, "sample_id"]))
            conds = sorted(set(ai["condition"]), key=lambda c: (c.split(":")[0], c))
            ids_of = {}
            for c in conds:
                ic = set(ai.loc[ai["condition"] == c, "sample_id"])
                ids_of[c] = base if ic <= set(base) else sorted(ic)
            hconds = sorted(set(x.loc[x["label"] == "human", "condition"]) - {orig})
            per_det = {}
            for d in own:
                ok_ids, ih = own[d], draw(own[d])
                h = np.array([score[(d, "human", orig, i)] for i in ok_ids])
                thr[ds][d][defense] = {}
                for j, alpha in enumerate(alphas):
                    k, asr = key(alpha), "asr" if key(alpha) == "1" else f"asr{key(alpha)}"
                    t = ref_threshold(h, alpha)
                    tb = [ref_threshold(h[ih[b]], alpha) for b in range(B)]
                    fpr = sum(1 for v in h if v >= t) / len(h)
                    thr[ds][d][defense][f"fpr={alpha:g}"] = {
                        "threshold": t, "fpr_target": alpha, "fpr_achieved": fpr, "n_human": len(h),
                        "n_human_invalid": len(hum_ids) - len(ok_ids), "resolved": len(h) >= 1 / alpha,
                        "note": "" if len(h) >= 1 / alpha else f"fewer than {math.ceil(1 / alpha)} human texts: no human text may be flagged; the target FPR is not resolved"}
                    vals = {}
                    for c in conds:
                        a = np.array([score.get((d, "ai", c, i), math.nan) for i in ids_of[c]], dtype=float)
                        ia = seed_rule(len(ids_of[c]), B, seed, ds, defense, "ai", stable_hash(list(ids_of[c])))
                        auc_b = [ref_auc(h[ih[b]], a[ia[b]]) for b in range(B)] if j == 0 else None
                        tpr_b = [ref_tpr(a[ia[b]], tb[b]) for b in range(B)]
                        vals[c] = (a, ref_auc(h, a), auc_b, ref_tpr(a, t), tpr_b)
                    to, to_b = (vals[orig][3], vals[orig][4]) if orig in vals else (math.nan, [math.nan] * B)
                    for c, (a, auc, auc_b, tp, tp_b) in vals.items():
                        n_valid = int((~np.isnan(a)).sum())
                        m = out[ds][d].setdefault(c, {"label": "ai", "defense": defense, "n_human": len(h), "n_ai": n_valid,
                                                      "n_ai_invalid": len(a) - n_valid})
                        m.update({f"threshold{k}": t, f"fpr{k}_human": fpr})
                        if j == 0: m.update(ref_summary("auc", auc, auc_b, level))
                        m.update(ref_summary(f"tpr{k}", tp, tp_b, level))
                        m.update(ref_summary(f"tpr{k}_orig", to, to_b, level))
                        m.update(ref_summary(asr, 1 - tp, [1 - v for v in tp_b], level))
                        m.update(ref_summary(f"delta_tpr{k}", tp - to, [p - q for p, q in zip(tp_b, to_b)], level))
                        if j == 0: per_det.setdefault(c, []).append((auc, auc_b, tp, tp_b))
                    for hc in hconds:
                        col = {i: score.get((d, "human", hc, i), math.nan) for i in sorted(set(x.loc[(x["label"] == "human") & (x["condition"] == hc), "sample_id"]))}
                        if not col: continue
                        xs = np.array([v for v in col.values() if not math.isnan(v)])
                        ix = seed_rule(len(xs), B, seed, ds, defense, "human-edited", hc)
                        fr = ref_tpr(xs, t) if len(xs) else math.nan
                        fr_b = [ref_tpr(xs[ix[b]], tb[b]) if len(xs) else math.nan for b in range(B)]
                        m = out[ds][d].setdefault(hc, {"label": "human", "defense": defense, "n_human_edited": len(xs),
                                                       "n_invalid": sum(1 for v in col.values() if math.isnan(v))})
                        m.update({f"threshold{k}": t, **ref_summary(f"flag_rate{k}", fr, fr_b, level)})
            mean = out[ds].setdefault("mean", {})
            k0 = key(alphas[0])
            for c, items in per_det.items():
                auc = sum(i[0] for i in items) / len(items)
                auc_b = [sum(i[1][b] for i in items) / len(items) for b in range(B)]
                tp = sum(i[2] for i in items) / len(items)
                tp_b = [sum(i[3][b] for i in items) / len(items) for b in range(B)]
                mean[c] = {"label": "ai", "defense": defense, "n_detectors": len(items), **ref_summary("auc", auc, auc_b, level),
                           **ref_summary(f"tpr{k0}", tp, tp_b, level),
                           **ref_summary("asr" if k0 == "1" else f"asr{k0}", 1 - tp, [1 - v for v in tp_b], level)}
    return out, thr


def assert_same(got, ref, path="", rel=1e-9):
    "Recursive equality: same keys, numbers equal to `rel`, None == NaN (JSON writes NaN as null)."
    if isinstance(ref, dict):
        assert isinstance(got, dict), path
        assert set(got) == set(ref), f"{path}: keys differ: only in file {set(got) - set(ref)}, only recomputed {set(ref) - set(got)}"
        for k in ref: assert_same(got[k], ref[k], f"{path}/{k}", rel)
    elif isinstance(ref, (bool, str)) or ref is None and got is None:
        assert got == ref, f"{path}: {got!r} != {ref!r}"
    else:
        r = math.nan if ref is None else float(ref)
        g = math.nan if got is None else float(got)
        if math.isnan(r) or math.isnan(g): assert math.isnan(r) and math.isnan(g), f"{path}: {got!r} != {ref!r}"
        elif math.isinf(r): assert g == r, f"{path}: {got!r} != {ref!r}"
        else: assert g == pytest.approx(r, rel=rel, abs=1e-12), f"{path}: {got!r} != {ref!r}"


def roundtrip(obj): return json.loads(json.dumps(to_jsonable(obj), allow_nan=False))


def synthetic_scores(seed=3):
    "A scores table with the exact column schema: ties, quantised scores, invalid outputs, edited human texts, a defense."
    rng = np.random.default_rng(seed)
    cols = ["sample_id", "dataset", "label", "domain", "generator", "method", "setting", "defense", "condition", "candidate_rank",
            "text_out", "len_tokens_out", "len_ratio", "detector_name", "detector_family", "detector_model", "detector_direction",
            "detector_score_raw", "detector_score_ai", "truncated", "valid", "fail_reason"]
    rows = []
    def add(ds, sid, label, method, setting, defense, det, v, rank=0):
        cond = method + (f":{setting}" if setting else "") + ("" if defense == "none" else f"+{defense}")
        rows.append({"sample_id": sid, "dataset": ds, "label": label, "domain": "news", "generator": "human" if label == "human" else "g",
                     "method": method, "setting": setting, "defense": defense, "condition": cond, "candidate_rank": rank, "text_out": "t",
                     "len_tokens_out": 10, "len_ratio": 1.0, "detector_name": det, "detector_family": "likelihood", "detector_model": "m",
                     "detector_direction": 1, "detector_score_raw": v, "detector_score_ai": v, "truncated": False,
                     "valid": not math.isnan(v), "fail_reason": "" if not math.isnan(v) else "invalid"})
    for ds, nh, na in (("alpha", 130, 40), ("beta", 30, 12)):         # beta: fewer than 100 human texts
        for det, q in (("d1", 1.0), ("d2", 0.25)):                     # d1 heavily quantised (ties)
            for i in range(nh):
                v = float(np.round(rng.normal() / q) * q)
                if det == "d2" and i == 3: v = math.nan                 # invalid for one detector: dropped for all
                for defense in ("none", "sanitize"): add(ds, f"h{i:03d}", "human", "m0", "", defense, det, v)
                if i < 15: add(ds, f"p{i:03d}", "human", "m0", "polish:degree=minor", "none", det, float(np.round(rng.normal(1) / q) * q))
            for i in range(na):
                a0 = float(np.round(rng.normal(2.5) / q) * q)
                for defense in ("none", "sanitize"):
                    add(ds, f"a{i:03d}", "ai", "m0", "", defense, det, a0)
                    a5 = math.nan if i % 7 == 0 else float(np.round((a0 - rng.uniform(0, 3)) / q) * q)
                    add(ds, f"a{i:03d}", "ai", "m5", "homoglyph_p=0.01", defense, det, a5)
                    add(ds, f"a{i:03d}", "ai", "m5", "homoglyph_p=0.01", defense, det, 99.0, rank=1)   # not selected: ignored
                if i < 10: add(ds, f"e{i:03d}", "ai", "m0", "expert", "none", det, float(np.round(rng.normal(1.5) / q) * q))
    return pd.DataFrame(rows, columns=cols)


CFG_SYN = {"seed": 11, "n_bootstrap": 60, "ci_level": 0.95, "fpr_targets": [0.01]}


@pytest.mark.parametrize("valid_set", ["per_detector", "shared"])
def test_metrics_recomputed_synthetic(valid_set):
    "compute_metrics equals the loop implementation on a synthetic table with ties, NaN, edited texts and two defenses."
    sc, cfg = synthetic_scores(), {**CFG_SYN, "valid_set": valid_set}
    got_m, got_t = M.compute_metrics(sc, cfg)
    ref_m, ref_t = ref_metrics(sc, cfg)
    assert_same(roundtrip(got_m), roundtrip(ref_m))
    assert_same(roundtrip(got_t), roundtrip(ref_t))
    # sanity of the example itself: an invalid human text dropped (for d2 only, or for both in the shared set), invalid
    # outputs counted, unresolved small dataset
    assert got_t["alpha"]["d1"]["none"]["fpr=0.01"]["n_human"] == (130 if valid_set == "per_detector" else 129)
    assert got_t["alpha"]["d2"]["none"]["fpr=0.01"]["n_human"] == 129
    assert got_m["alpha"]["d1"]["m5:homoglyph_p=0.01"]["n_ai_invalid"] == 6
    assert got_t["beta"]["d2"]["none"]["fpr=0.01"]["resolved"] is False
    assert got_m["alpha"]["d1"]["m0:polish:degree=minor"]["label"] == "human"


def test_metrics_recomputed_at_two_fpr_targets():
    "TPR at 5% FPR beside 1% (the default `fpr_targets`), the first target listed giving the mean's: the loop implementation's numbers."
    sc = synthetic_scores()
    for fprs in ([0.01, 0.05], [0.05, 0.01]):
        cfg = {**CFG_SYN, "fpr_targets": fprs}
        got_m, got_t = M.compute_metrics(sc, cfg)
        ref_m, ref_t = ref_metrics(sc, cfg)
        assert_same(roundtrip(got_m), roundtrip(ref_m))
        assert_same(roundtrip(got_t), roundtrip(ref_t))
    e = got_m["alpha"]["d1"]["m0"]
    assert e["tpr@0.05"] >= e["tpr1"] and "tpr@0.05" in got_m["alpha"]["mean"]["m0"] and "tpr1" not in got_m["alpha"]["mean"]["m0"]


def test_metrics_json_of_a_run_recomputed_from_its_scores():
    "The stored tiny run (scores.parquet + metrics.json): every number recomputed independently and by the library."
    sc = pd.read_parquet(DATA / "scores.parquet")
    cfg = json.loads((DATA / "config.json").read_text())
    ref_m, ref_t = ref_metrics(sc, cfg)
    file_m = json.loads((DATA / "metrics.json").read_text())
    assert_same(file_m, roundtrip(ref_m))
    assert_same(json.loads((DATA / "thresholds.json").read_text()), roundtrip(ref_t))
    assert_same(roundtrip(M.compute_metrics(sc, cfg)[0]), file_m)
    n = sum(isinstance(v, (int, float)) for dd in file_m.values() for cc in dd.values() for m in cc.values() for v in m.values())
    assert n > 500                                                         # it really compared hundreds of numbers


def test_metrics_json_of_the_shared_tiny_run(tiny_run):
    "The session's end-to-end tiny run: its metrics.json recomputed from its scores.parquet and config.json."
    out = Path(tiny_run["out"])
    cfg = json.loads((out / "config.json").read_text())
    ref_m, _ = ref_metrics(pd.read_parquet(out / "scores.parquet"), cfg)
    assert_same(json.loads((out / "metrics.json").read_text()), roundtrip(ref_m))
    for f in ("metrics_shield.json", "metrics_tau.json"): assert (out / f).exists()


# ---------------------------------------------------------------------------------------------------------------------
# One detector's failures never erase another detector's metrics (#37)
# ---------------------------------------------------------------------------------------------------------------------

def failing_detectors(sc):
    """`sc` with d3, a detector with no valid score on any text (an API outage), and d2 scoring only one text in eight
    (its other rows invalid, with their reasons), as the detector stage writes them."""
    d3 = sc[sc["detector_name"] == "d1"].assign(detector_name="d3", detector_score_raw=math.nan, detector_score_ai=math.nan,
                                                valid=False, fail_reason="HTTP 503 after 5 attempts")
    sc = pd.concat([sc, d3], ignore_index=True)
    few = (sc["detector_name"] == "d2") & (sc["sample_id"].str[1:].astype(int) % 8 != 0)
    sc.loc[few, ["detector_score_raw", "detector_score_ai"]] = math.nan
    sc.loc[few, ["valid", "fail_reason"]] = [False, "too short for the API"]
    return sc


def without(sc, *dets): return sc[~sc["detector_name"].isin(dets)]


def test_one_detectors_failures_never_erase_anothers_metrics():
    """d3 fails on every text and d2 on seven in eight: d1's numbers are those of a run without them, d2's rest on its
    own valid texts (the loop implementation), d3 is reported failed with its reason, the mean is over d1 and d2, and
    the max over detectors of tau compares them on the texts valid for both. No analysis stops on the failures."""
    base = synthetic_scores()
    sc = failing_detectors(base)
    m, t = M.compute_metrics(sc, CFG_SYN)
    m1, t1 = M.compute_metrics(without(sc, "d2", "d3"), CFG_SYN)
    for ds in ("alpha", "beta"):
        assert m[ds]["d1"] == m1[ds]["d1"] and t[ds]["d1"] == t1[ds]["d1"]         # as if d2 and d3 were not there
    ref_m, ref_t = ref_metrics(without(sc, "d3"), CFG_SYN)
    assert_same(roundtrip(m["alpha"]["d2"]), roundtrip(ref_m["alpha"]["d2"]))       # on its own 17 of 130 human texts
    assert_same(roundtrip(t["alpha"]["d2"]), roundtrip(ref_t["alpha"]["d2"]))
    assert (t["alpha"]["d2"]["none"]["fpr=0.01"]["n_human"], t["alpha"]["d2"]["none"]["fpr=0.01"]["n_human_invalid"]) == (17, 113)
    assert (m["alpha"]["d2"]["m0"]["n_ai"], m["alpha"]["d2"]["m0"]["n_ai_invalid"]) == (5, 35)
    n3a = int(((sc["detector_name"] == "d3") & (sc["dataset"] == "alpha") & (sc["candidate_rank"] == 0)).sum())
    why = f"no valid score on any of its {n3a} scored texts: HTTP 503 after 5 attempts ({n3a})"
    for defense in ("none", "sanitize"):
        assert t["alpha"]["d3"][defense] == {"threshold": None, "n_human": 0, "n_human_invalid": 130, "note":
                                             "no valid unedited human text: nothing to calibrate on", "status": "failed", "reason": why}
    assert set(m["alpha"]["d3"]) == set(m["alpha"]["d1"])                          # every condition, reported
    for cond, e in m["alpha"]["d3"].items():
        assert (e["status"], e["reason"]) == ("failed", why) and set(e) - {"status", "reason"} == set(m["alpha"]["d1"][cond])
        assert all(math.isnan(v) for k, v in e.items() if isinstance(v, float))
    mean = m["alpha"]["mean"]["m0"]
    assert mean["n_detectors"] == 2 and mean["note"] == "without d3 (no calibration: see its reason)"
    assert mean["tpr1"] == pytest.approx((m["alpha"]["d1"]["m0"]["tpr1"] + m["alpha"]["d2"]["m0"]["tpr1"]) / 2, abs=1e-12)
    # metrics.json is written from the long table: the status and reason survive it
    j = M.metrics_json_from_table(M.metrics_long(sc, m, t))
    assert roundtrip(j) == roundtrip(m)
    # the other analyses run; a detector's own numbers do not move, the max of tau compares d1 and d2 on their common texts
    T = M.compute_tau(sc, CFG_SYN)["datasets"]["alpha"]
    T1 = M.compute_tau(without(sc, "d2", "d3"), CFG_SYN)["datasets"]["alpha"]
    assert T["d1"] == T1["d1"] and "d3" not in T
    mx = T["max"]["m5:homoglyph_p=0.01"]
    assert (mx["n_detectors"], mx["n_human"], mx["n_ai"], mx["texts"]) == (2, 17, 4, "valid for every detector compared")
    assert T["d1"]["m5:homoglyph_p=0.01"]["n_ai"] == 34 and T["d2"]["m5:homoglyph_p=0.01"]["n_ai"] == 4   # each on its own
    S = M.compute_shield(sc, CFG_SYN)["datasets"]["alpha"]
    assert S["d1"] == M.compute_shield(without(sc, "d2", "d3"), CFG_SYN)["datasets"]["alpha"]["d1"] and "d3" not in S
    assert M.compute_apt(sc, CFG_SYN)["datasets"]["alpha"]["d1"] == M.compute_apt(without(sc, "d2", "d3"), CFG_SYN)["datasets"]["alpha"]["d1"]
    assert M.compute_beemo(sc, CFG_SYN)["datasets"]["alpha"]["d1"] == M.compute_beemo(without(sc, "d2", "d3"), CFG_SYN)["datasets"]["alpha"]["d1"]
    dep = [r for r in M.compute_deployment(sc, {**CFG_SYN, "length_bins": [0, 5, 20]}) if r["detector"] == "d1"]
    assert dep == [r for r in M.compute_deployment(without(sc, "d2", "d3"), {**CFG_SYN, "length_bins": [0, 5, 20]}) if r["detector"] == "d1"]


def test_shared_valid_set_is_the_texts_every_scoring_detector_has():
    """valid_set=shared: every detector calibrated on the human texts valid for every detector that scored one (d3, with
    none, left out of that set and reported failed): d1's and d2's numbers are those of a run without d3, on d2's 17 valid
    human texts (the loop implementation)."""
    sc = failing_detectors(synthetic_scores())
    cfg = {**CFG_SYN, "valid_set": "shared"}
    m, t = M.compute_metrics(sc, cfg)
    assert t["alpha"]["d1"]["none"]["fpr=0.01"]["n_human"] == 17 and t["alpha"]["d3"]["none"]["status"] == "failed"
    ref_m, ref_t = ref_metrics(without(sc, "d3"), cfg)
    for d in ("d1", "d2"):
        assert_same(roundtrip(m["alpha"][d]), roundtrip(ref_m["alpha"][d]))
        assert_same(roundtrip(t["alpha"][d]), roundtrip(ref_t["alpha"][d]))


# ---------------------------------------------------------------------------------------------------------------------
# SHIELD and tau on hand-worked examples
# ---------------------------------------------------------------------------------------------------------------------

K = 20 * math.log(2)   # e^{-k f} = 2^{-20 f}


def test_wauroc_by_hand():
    # h = {1, 2}, a = {1.5, 3}: TPR = 1/2 on FPR [0, 1/2), 1 on [1/2, 1].
    # F(f) = (1 - 2^{-20 f}) / (1 - 2^{-20}); F(1/2) = (1 - 2^-10)/(1 - 2^-20) = 1/(1 + 2^-10) = 1024/1025.
    # W = 1/2 F(1/2) + 1 (1 - F(1/2)) = 1 - 512/1025 = 513/1025.
    assert M.wauroc_rows([1.0, 2.0], [1.5, 3.0])[0] == pytest.approx(513 / 1025, abs=1e-12)
    # a tie: h = {1}, a = {1}: the diagonal TPR = f, W = E[f] = 1/k - 1/(e^k - 1) = 1/(20 ln 2) - 1/(2^20 - 1).
    assert M.wauroc_rows([1.0], [1.0])[0] == pytest.approx(1 / K - 1 / (2 ** 20 - 1), abs=1e-12)
    # h = {0,1,2,3}, a = {2.5, 3.5}: TPR = 1/2 on [0, 1/4), 1 after; F(1/4) = (1 - 2^-5)/(1 - 2^-20) = (31/32)/(1 - 2^-20).
    w = 1 - 0.5 * (31 / 32) / (1 - 2 ** -20)
    assert M.wauroc_rows([0.0, 1, 2, 3], [2.5, 3.5])[0] == pytest.approx(w, abs=1e-12)
    # perfect separation: 1; complete inversion: 0
    assert M.wauroc_rows([0.0, 1.0], [2.0, 3.0])[0] == 1.0
    assert M.wauroc_rows([2.0, 3.0], [0.0, 1.0])[0] == pytest.approx(0.0, abs=1e-15)


def test_wauroc_matches_quadrature_and_auroc_limit():
    rng = np.random.default_rng(0)
    h, a = np.round(rng.normal(0, 1, 25), 1), np.round(rng.normal(0.8, 1, 17), 1)
    # direct: TPR(f) on the polyline through the distinct-score operating points, integrated with Gauss-Legendre per
    # human step (TPR is linear inside each step, so the quadrature is exact up to rounding)
    pts = [(0.0, 0.0)] + [((h >= v).mean(), (a >= v).mean()) for v in np.unique(np.r_[h, a])[::-1]]
    def tpr(f):
        for (f0, r0), (f1, r1) in zip(pts, pts[1:]):
            if f0 < f <= f1: return r0 + (r1 - r0) * (f - f0) / (f1 - f0)
        return pts[-1][1]
    x, w = np.polynomial.legendre.leggauss(16)
    total = 0.0
    for j in range(len(h)):
        lo, hi = j / len(h), (j + 1) / len(h)
        for xi, wi in zip(x, w):
            f = (lo + hi) / 2 + (hi - lo) / 2 * xi
            total += (hi - lo) / 2 * wi * K * math.exp(-K * f) / (1 - math.exp(-K)) * tpr(f)
    assert M.wauroc_rows(h, a)[0] == pytest.approx(total, abs=1e-10)
    assert M.wauroc_rows(h, a, k=1e-5)[0] == pytest.approx(roc_auc_score([0] * 25 + [1] * 17, np.r_[h, a]), abs=1e-4)


def test_youden_sfd_urss_by_hand():
    # h = {0,1,2,3}, a = {2.5, 3.5}: points (0,1/2) J=1/2, (1/4,1) J=3/4 -> FPR* = 1/4
    f, r, j = M.youden_rows([0.0, 1, 2, 3], [2.5, 3.5])
    assert (f[0], r[0], j[0]) == (0.25, 1.0, 0.75)
    # h = {0,1,2,3}, a = {2,3,4,5}: J = 1/2 at FPR 0, 1/4 (tie) and 1/2 (tie): the smallest FPR, 0
    assert M.youden_rows([0.0, 1, 2, 3], [2.0, 3, 4, 5])[0][0] == 0.0
    # SFD over FPRs {1/4, 0}: population sigma = 1/8, SFD = exp(-10 ln2 / 8) = 2^-1.25
    assert M.sfd([0.25, 0.0]) == pytest.approx(2 ** -1.25, abs=1e-12)
    # three scenarios {0, 0.1, 0.2}: sigma = 0.1 sqrt(2/3), SFD = 2^{-sqrt(2/3)}
    assert M.sfd([0.0, 0.1, 0.2]) == pytest.approx(2 ** -math.sqrt(2 / 3), abs=1e-12)
    # URSS over scenarios with W-AUROC {0.6, 0.8} and FPR* {0, 0.1}: 0.7 * 2^-0.5
    assert M.urss([0.6, 0.8], [0.0, 0.1]) == pytest.approx(0.7 * 2 ** -0.5, abs=1e-12)


def test_compute_shield_on_a_hand_table():
    # humans {0,1,2,3}; m0 AI {2.5, 3.5} (W = 1 - (31/64)/(1 - 2^-20), FPR* = 1/4); m5 AI {4, 5} (W = 1, FPR* = 0)
    rows = [("human", f"h{i}", "m0", float(i)) for i in range(4)]
    rows += [("ai", "a0", "m0", 2.5), ("ai", "a1", "m0", 3.5), ("ai", "a0", "m5:x", 4.0), ("ai", "a1", "m5:x", 5.0)]
    sc = pd.DataFrame(rows, columns=["label", "sample_id", "condition", "detector_score_ai"]).assign(
        dataset="toy", candidate_rank=0, defense="none", detector_name="d", domain="news", generator="g")
    S = M.compute_shield(sc, {"seed": 0, "n_bootstrap": 20, "ci_level": 0.95})["datasets"]["toy"]["d"]
    w0 = 1 - 0.5 * (31 / 32) / (1 - 2 ** -20)
    assert S["conditions"]["m0"]["wauroc"] == pytest.approx(w0, abs=1e-12)
    assert S["conditions"]["m5:x"]["wauroc"] == 1.0
    F = S["families"]["attacks"]
    assert F["n_scenarios"] == 2 and F["sigma_fpr"] == pytest.approx(0.125)
    assert F["sfd"] == pytest.approx(2 ** -1.25, abs=1e-12)
    assert F["urss"] == pytest.approx((w0 + 1) / 2 * 2 ** -1.25, abs=1e-12)
    assert "domains" not in S["families"]                                  # one domain: no domain family


def test_tau_by_hand():
    # h = {0,1,2,3}, a = {2,3,4,5}: best threshold flags {4,5}: TPR 1/2, FPR 0; R = 1/2*1/2 + 1/2*0 = 1/4;
    # R(chance) = 2 pi (1 - pi) = 1/2; tau = 1 - (1/4)/(1/2) = 1/2
    assert M.tau_rows([0.0, 1, 2, 3], [2.0, 3, 4, 5])[0] == 0.5
    # reversed: no useful high-score threshold (tau 0) but the reversed one separates as well (two-sided 1/2)
    assert M.tau_rows([2.0, 3, 4, 5], [0.0, 1, 2, 3])[0] == 0.0
    assert M.tau_rows([2.0, 3, 4, 5], [0.0, 1, 2, 3], two_sided=True)[0] == 0.5
    # identical distributions: tau = 0; perfect separation: tau = 1
    assert M.tau_rows([1.0, 2.0], [1.0, 2.0])[0] == 0.0
    assert M.tau_rows([1.0, 2.0], [3.0, 4.0])[0] == 1.0
    # cross-validated: h = {0, 2}, a = {1, 3}; sources s0 = {h=0, a=1}, s1 = {h=2, a=3}; two folds.
    # fit on s1 -> t = 2.5 -> s0 gets nothing flagged; fit on s0 -> t = 0.5 -> both of s1 flagged.
    # out of fold TPR = FPR = 1/2 -> tau_cv = 0, while the in-sample tau is 1/2 (h=0 < a=1 < h=2 < a=3: J = 1/2)
    assert M.tau_cv([0.0, 2.0], [1.0, 3.0], ["s0", "s1"], ["s0", "s1"], 2, ("k",)) == 0.0
    assert M.tau_rows([0.0, 2.0], [1.0, 3.0])[0] == 0.5
    assert M.fit_youden_threshold([2.0], [3.0]) == 2.5 and M.fit_youden_threshold([0.0], [1.0]) == 0.5


def test_compute_tau_max_and_cv_groups():
    rng = np.random.default_rng(1)
    rows = []
    for i in range(40):
        rows.append(("human", f"d{i}", "m0", "det1", rng.normal())); rows.append(("human", f"d{i}", "m0", "det2", rng.normal()))
        rows.append(("ai", f"d{i}__ai", "m0", "det1", rng.normal(2))); rows.append(("ai", f"d{i}__ai", "m0", "det2", rng.normal(0.5)))
    sc = pd.DataFrame(rows, columns=["label", "sample_id", "condition", "detector_name", "detector_score_ai"]).assign(
        dataset="t", candidate_rank=0, defense="none", detector_family="likelihood")
    groups = {("t", f"d{i}"): f"d{i}" for i in range(40)} | {("t", f"d{i}__ai"): f"d{i}" for i in range(40)}
    T = M.compute_tau(sc, {"seed": 0, "n_bootstrap": 50, "ci_level": 0.95, "tau_cv_folds": 4}, groups)["datasets"]["t"]
    for d in ("det1", "det2"):   # tau = J at the Youden point = 1 - risk / (1/2), recomputed with loops
        h = sc[(sc.label == "human") & (sc.detector_name == d)].detector_score_ai.to_numpy()
        a = sc[(sc.label == "ai") & (sc.detector_name == d)].detector_score_ai.to_numpy()
        best = max([0.0] + [(a >= t).mean() - (h >= t).mean() for t in np.r_[h, a]])
        assert T[d]["m0"]["tau"] == pytest.approx(best, abs=1e-12)
        assert T[d]["m0"]["risk"] == pytest.approx(0.5 * (1 - best), abs=1e-12)
        assert T[d]["m0"]["tau_cv"] <= T[d]["m0"]["tau"] + 1e-12 or T[d]["m0"]["cv_folds"] == 4
    assert T["max"]["m0"]["tau"] == max(T["det1"]["m0"]["tau"], T["det2"]["m0"]["tau"])
    assert T["max"]["m0"]["detector"] == "det1"
    assert T["det1"]["m0"]["supervised"] is False


# ---------------------------------------------------------------------------------------------------------------------
# The threshold rule on tied and quantised scores
# ---------------------------------------------------------------------------------------------------------------------

def test_threshold_never_exceeds_target_on_quantised_scores():
    rng = np.random.default_rng(7)
    for trial in range(400):
        n = int(rng.integers(1, 400))
        step = float(rng.choice([1.0, 0.5, 0.1, 0.01]))
        h = np.round(rng.normal(0, 1, n) / step) * step                   # quantised: many ties
        if trial % 10 == 0: h[:] = h[0]                                     # all tied
        alpha = float(rng.choice([0.001, 0.01, 0.05, 0.1, 0.3]))
        t = M.threshold_at_fpr(h, alpha)
        fpr = (h >= t).mean()
        assert fpr <= alpha + 1e-12, (n, alpha, fpr)
        assert t == ref_threshold(h, alpha)                                # the definition, written with loops
        below = h[h < t]                                                    # smallest: one step lower exceeds alpha
        if len(below): assert (h >= below.max()).mean() > alpha
    # vectorised over resamples: one threshold per row, each within the target
    H = np.round(rng.normal(size=(50, 300)), 1)
    assert ((H >= M.threshold_at_fpr(H, 0.01)[:, None]).mean(1) <= 0.01).all()


def test_threshold_with_fewer_than_one_over_alpha_human_texts():
    h = np.array([0.3, 0.1, 0.2, 0.2, 0.5])                               # 5 < 1/0.01: no human text may be flagged
    t = M.threshold_at_fpr(h, 0.01)
    assert t == np.nextafter(0.5, np.inf) and (h >= t).sum() == 0
    sc = synthetic_scores()
    _, thr = M.compute_metrics(sc[sc.dataset == "beta"], CFG_SYN)          # 30 human texts at 1% FPR
    e = thr["beta"]["d1"]["none"]["fpr=0.01"]
    assert e["resolved"] is False and e["fpr_achieved"] == 0.0 and "fewer than 100 human texts" in e["note"]
    assert M.threshold_at_fpr(np.array([1.0, 2.0]), 1.0) == -np.inf      # alpha = 1: everything may be flagged


# ---------------------------------------------------------------------------------------------------------------------
# APT-Eval, Beemo, quality and tables
# ---------------------------------------------------------------------------------------------------------------------

def test_apt_flag_rates_and_beemo_tasks():
    sc = synthetic_scores()
    A = M.compute_apt(sc, CFG_SYN)["datasets"]["alpha"]["d2"]["m0:polish:degree=minor"]
    m, _ = M.compute_metrics(sc, CFG_SYN)
    assert A["polish"] == "degree" and A["level"] == "minor" and A["source"] == "apt_eval"
    assert A["by_polisher"]["all"]["flag_rate1"] == m["alpha"]["d2"]["m0:polish:degree=minor"]["flag_rate1"]
    x = sc[(sc.dataset == "alpha") & (sc.detector_name == "d2") & (sc.condition == "m0:polish:degree=minor")].detector_score_ai
    t = m["alpha"]["d2"]["m0"]["threshold1"]
    assert A["by_polisher"]["all"]["n_flagged1"] == int((x >= t).sum())
    Bm = M.compute_beemo(sc, CFG_SYN)["datasets"]["alpha"]["d1"]            # has an expert-edit condition
    assert Bm["human_vs_machine"]["auc"] == pytest.approx(m["alpha"]["d1"]["m0"]["auc"])
    neg = sc[(sc.dataset == "alpha") & (sc.detector_name == "d1") & (sc.condition == "m0:expert")].detector_score_ai.to_numpy()
    pos = sc[(sc.dataset == "alpha") & (sc.detector_name == "d1") & (sc.condition == "m0") & (sc.label == "ai")].detector_score_ai.to_numpy()
    assert Bm["expert_vs_machine"]["auc"] == pytest.approx(ref_auc(neg, pos), abs=1e-12)
    assert Bm["expert_vs_machine"]["threshold1"] == ref_threshold(neg, 0.01)


def test_extra_tables(tmp_path):   # (the quality summary's hand checks are the examples of nbs/25_quality)
    assert M.extra_tables(tmp_path) == []                                   # no analysis files: nothing written
    sc = synthetic_scores()
    from stealth_eval.core import write_json
    write_json(tmp_path / "metrics_tau.json", M.compute_tau(sc, CFG_SYN))
    written = M.extra_tables(tmp_path)
    assert sorted(p.name for p in written) == ["table_tau.md", "table_tau.tex"]
    md = (tmp_path / "tables" / "table_tau.md").read_text()
    assert "## alpha" in md and "m5:homoglyph_p=0.01" in md
