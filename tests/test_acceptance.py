"""The spec's §12 acceptance criteria (`stealth_eval.acceptance`, #17) on small synthetic run folders (no model loads):
the held-out vs in-reward comparison against a direct computation, criteria that flip when the data change, a skipped
M2 read as "not applicable" with its reason, and the report files.
"""
import json
import math

import numpy as np
import pandas as pd
import pytest

from stealth_eval import acceptance as A
from stealth_eval import metrics as M
from stealth_eval.core import stable_hash, write_json
from stealth_eval.schema import Settings

from test_metrics import seed_rule

REWARD = ["roberta_openai", "fast_detectgpt"]               # M2's reward detectors (the library's default)
HELD_OUT = ["entropy", "log_rank", "rank"]
DETS = sorted(REWARD + HELD_OUT)
DROP = {"m2:N=1": {**dict.fromkeys(REWARD, 2.0), **dict.fromkeys(HELD_OUT, 0.5)},
        "m2:N=4": {**dict.fromkeys(REWARD, 2.5), **dict.fromkeys(HELD_OUT, 1.2)},
        "m5:homoglyph_p=0.005": dict.fromkeys(DETS, 0.3), "m5:homoglyph_p=0.01": dict.fromkeys(DETS, 0.8)}
CFG = {**Settings().to_dict(), "methods": ["m0", "m2", "m5"], "n_bootstrap": 200, "seed": 5}


def synthetic_scores(drop=DROP, n_h=120, n_a=50, seed=0, ai_mean=3.0):
    "scores.parquet's columns: human and M0 texts, attacked conditions lowering the AI score by `drop[condition][detector]`."
    rng = np.random.default_rng(seed)
    rows = []
    def add(sid, label, cond, det, v, rank=0):
        m, _, s = cond.partition(":")
        rows.append({"sample_id": sid, "source_id": sid, "dataset": "syn", "label": label, "domain": "news", "generator": "g",
                     "method": m, "setting": s, "defense": "none", "condition": cond, "candidate_rank": rank, "text_out": "t",
                     "detector_name": det, "detector_family": "f", "detector_direction": 1, "detector_score_raw": v,
                     "detector_score_ai": v, "valid": not math.isnan(v), "fail_reason": "", "facts": "{}"})
    for det in DETS:
        for i in range(n_h): add(f"h{i:03d}", "human", "m0", det, float(rng.normal()))
        a0 = rng.normal(ai_mean, 1.0, n_a)
        for i in range(n_a): add(f"a{i:03d}", "ai", "m0", det, float(a0[i]))
        for cond, d in drop.items():
            for i in range(n_a):
                v = math.nan if (cond == "m2:N=4" and det == "rank" and i % 10 == 0) else float(a0[i] - d[det] + rng.normal(0, 0.3))
                add(f"a{i:03d}", "ai", cond, det, v)
                add(f"a{i:03d}", "ai", cond, det, 99.0, rank=1)       # a candidate not selected: ignored
    return pd.DataFrame(rows)


def quality_rows(sims: dict):
    "quality.parquet's columns: condition -> similarities of its outputs."
    return pd.DataFrame([{"sample_id": f"a{i:03d}", "dataset": "syn", "label": "ai", "method": c.partition(":")[0],
                          "setting": c.partition(":")[2], "defense": "none", "condition": c, "sim": float(s),
                          "sim_model": "syn-embedder", "valid": True, "fail_reason": ""}
                         for c, ss in sims.items() for i, s in enumerate(ss)])


SIMS = {"m2:N=1": np.linspace(0.90, 0.99, 50), "m2:N=4": np.linspace(0.87, 0.99, 50), "m5:homoglyph_p=0.01": np.full(50, 0.99)}
FIGURES = ["tables/table_main_syn.md", "figures/fig_heatmap_t1f.png", "figures/fig_tradeoff.png", "figures/fig_budget_sweep.png",
           "metrics.json", "tables/table_transfer.md", "qual_examples.md"]


def make_run(path, scores=None, sims=SIMS, cfg=CFG, skipped=None, figures=FIGURES):
    "A finished run folder as the pipeline leaves it (the files the criteria read)."
    scores = synthetic_scores() if scores is None else scores
    m, t = M.compute_metrics(scores, cfg)
    path.mkdir(parents=True, exist_ok=True)
    scores.to_parquet(path / "scores.parquet", index=False)
    M.metrics_long(scores, m, t).to_parquet(path / "metrics.parquet", index=False)
    quality_rows(sims).to_parquet(path / "quality.parquet", index=False)
    write_json(path / "config.json", {**cfg, "out_dir": str(path)})
    write_json(path / "skipped.json", skipped or {"methods": {}, "detectors": {}})
    for f in figures:
        (path / f).parent.mkdir(parents=True, exist_ok=True); (path / f).write_text("x")
    write_json(path / "figures_notes.json", {"written": figures, "not_written": {
        "tables/table_transfer.md": "no M3 condition with a guide=... setting"} if "tables/table_transfer.md" not in figures else {}})
    return path


def verdicts(path) -> dict:
    A.write_acceptance(path)
    acc = json.loads((path / "acceptance.json").read_text(encoding="utf-8"))
    return {(v["id"], v["dataset"]): v for v in acc["criteria"]}


def threshold(h, alpha):
    "From the definition: just above the smallest human score v with #(h > v) <= alpha * n."
    hs = np.sort(h)
    above = len(hs) - np.searchsorted(hs, hs, side="right")
    return np.nextafter(hs[above <= alpha * len(hs) + 1e-9][0], np.inf)


def tpr(a, t):
    a = a[~np.isnan(a)]
    return float((a >= t).mean())


def direct_mean_tpr(scores, cond, dets, alpha, B, seed, common=()):
    """Mean TPR over `dets` of `cond` from the definitions (threshold rule, TPR over valid texts) and its bootstrap draws
    with the resample indices regenerated from the documented seed rule (tests/test_metrics.py); `common`: read only the
    AI texts every one of these detectors scored (a comparison across detectors)."""
    s = scores[(scores["candidate_rank"] == 0) & (scores["defense"] == "none")]
    hum_ids = sorted(s.loc[s["label"] == "human", "sample_id"].unique())
    ai_ids = sorted(s.loc[(s["label"] == "ai") & (s["condition"] == "m0"), "sample_id"].unique())
    x = s[(s["condition"] == cond) & s["detector_name"].isin(common)]
    gone = set(x.loc[x["detector_score_ai"].isna(), "sample_id"])
    ih = seed_rule(len(hum_ids), B, seed, "syn", "none", "human")
    ia = seed_rule(len(ai_ids), B, seed, "syn", "none", "ai", stable_hash(list(ai_ids)))
    pts, draws = [], []
    for d in dets:
        h = s[(s["label"] == "human") & (s["detector_name"] == d)].set_index("sample_id")["detector_score_ai"].reindex(hum_ids).to_numpy()
        a = s[(s["condition"] == cond) & (s["detector_name"] == d)].set_index("sample_id")["detector_score_ai"].reindex(ai_ids)
        a = a.where(~a.index.isin(gone)).to_numpy()
        pts.append(tpr(a, threshold(h, alpha)))
        draws.append([tpr(a[ia[b]], threshold(h[ih[b]], alpha)) for b in range(B)])
    return float(np.mean(pts)), np.mean(np.array(draws), axis=0)


def test_held_out_vs_in_reward_equals_a_direct_computation():
    sc = synthetic_scores()
    rows = {r["condition"]: r for r in A.transfer_rows(sc, CFG)}
    assert set(rows) == {"m2:N=1", "m2:N=4"}                          # M5 declares no detector: no row
    r = rows["m2:N=4"]
    assert (r["in_reward"], r["held_out"], r["unmeasured"]) == (sorted(REWARD), HELD_OUT, [])
    B, level = CFG["n_bootstrap"], CFG["ci_level"]
    # both groups on the texts every detector compared scored: rank could not score 5 of the 50 attacked texts
    ho, ho_d = direct_mean_tpr(sc, "m2:N=4", HELD_OUT, 0.01, B, CFG["seed"], common=DETS)
    ir, ir_d = direct_mean_tpr(sc, "m2:N=4", sorted(REWARD), 0.01, B, CFG["seed"], common=DETS)
    lo, hi = np.percentile(ho_d - ir_d, [50 * (1 - level), 100 - 50 * (1 - level)])
    assert r["held_out_tpr"]["value"] == pytest.approx(ho, abs=1e-12) and r["in_reward_tpr"]["value"] == pytest.approx(ir, abs=1e-12)
    assert r["difference"]["value"] == pytest.approx(ho - ir, abs=1e-12)
    assert (r["difference"]["ci_low"], r["difference"]["ci_high"]) == pytest.approx((lo, hi), abs=1e-12)
    assert r["difference"]["ci_low"] > 0                               # by construction the reward detectors drop more
    assert (r["n_human"], r["n_ai"], r["texts"]) == (120, 45, "valid for every detector compared")
    assert ir != direct_mean_tpr(sc, "m2:N=4", sorted(REWARD), 0.01, B, CFG["seed"])[0]   # on their own 50 texts: another number
    # one detector's TPR is its metrics.parquet row: the same thresholds, the same resamples
    m, _ = M.compute_metrics(sc, CFG)
    c = next(c for c in M.calibration_sets(sc, CFG) if c["defense"] == "none")
    p, d = A.mean_tpr(c, "m2:N=4", ["rank"], 0.01)
    e = m["syn"]["rank"]["m2:N=4"]
    assert p == e["tpr1"] and np.percentile(d, [2.5, 97.5]).tolist() == pytest.approx([e["tpr1_ci_low"], e["tpr1_ci_high"]], abs=1e-12)


def test_rows_of_the_result_table(tmp_path):
    acc = A.evaluate(A.load_run(make_run(tmp_path / "run")))
    t = A.acceptance_rows(acc)
    assert list(t.columns) == M.TABLE_COLS and set(t["family"]) == {"acceptance"}
    r = t[(t["condition"] == "m2:N=4") & (t["metric"] == "tpr_held_out_minus_in_reward")].iloc[0]
    x = next(r for r in acc["transfer"] if r["condition"] == "m2:N=4")["difference"]
    assert (r["value"], r["ci_low"], r["ci_high"], r["n_detectors"]) == (x["value"], x["ci_low"], x["ci_high"], 5)


def test_every_criterion_on_a_complete_run(tmp_path):
    v = verdicts(make_run(tmp_path / "run"))
    got = {k: x["verdict"] for k, x in v.items()}
    assert got == {("1", None): "pass", ("2", None): "pass", ("2a", "syn"): "pass", ("2b", "syn"): "pass", ("2c", "syn"): "pass",
                   ("3", "syn"): "pass", ("4a", None): "fail", ("4b", None): "fail", ("4c", None): "pass"}
    assert v[("4a", None)]["evidence"] == "M4 (AuthorMist) not run: not among the run's methods"
    t3 = v[("3", "syn")]["numbers"]
    assert t3["condition"] == "m2:N=4" and t3["reduced"] == HELD_OUT and t3["in_reward"] == sorted(REWARD)
    assert all(d["ci_high"] < 0 for d in t3["delta_tpr"].values())
    sim = v[("2c", "syn")]["numbers"]["conditions"]["m2:N=4"]
    assert sim["median_sim"]["value"] == pytest.approx(float(np.median(SIMS["m2:N=4"]))) and sim["n"] == 50
    md = (tmp_path / "run" / "acceptance.md").read_text(encoding="utf-8")
    assert "| criterion | verdict | evidence |" in md and "| **3** M2 (StealthRL) reduces detection" in md
    assert "`figures/fig_budget_sweep.png` | yes | yes |" in md and "| syn | `m2:N=4` | fast_detectgpt, roberta_openai |" in md
    acc = json.loads((tmp_path / "run" / "acceptance.json").read_text())
    arts = {a["item"].split(" (")[0]: a for a in acc["artifacts"] if a["section"] == "2.2"}
    assert {k: (a["path"], a["exists"]) for k, a in arts.items()} == {
        "Table A": ("tables/table_main_syn.md", True), "Figure 1": ("figures/fig_heatmap_t1f.png", True),
        "Figure 2": ("figures/fig_tradeoff.png", True), "Figure 3": ("figures/fig_budget_sweep.png", True)}
    assert acc["summary"] == {"pass": 7, "fail": 2, "not applicable": 0}


def flip(tmp_path, **kw):
    return {k: x["verdict"] for k, x in verdicts(make_run(tmp_path / "run", **kw)).items()}


def test_similarity_below_the_target_fails_and_the_target_is_a_setting(tmp_path):
    low = {**SIMS, "m2:N=4": np.linspace(0.80, 0.94, 50)}                 # median 0.87
    assert flip(tmp_path / "a", sims=low)[("2c", "syn")] == "fail"
    relaxed = {**CFG, "acceptance": {**CFG["acceptance"], "sim_min": 0.85}}
    assert flip(tmp_path / "b", sims=low, cfg=relaxed)[("2c", "syn")] == "pass"


def test_an_attack_that_fools_only_its_reward_detectors_fails_the_transfer_criterion(tmp_path):
    only = {**DROP, "m2:N=4": {**dict.fromkeys(REWARD, 2.5), **dict.fromkeys(HELD_OUT, 0.0)}}
    v = verdicts(make_run(tmp_path / "run", scores=synthetic_scores(only)))
    assert v[("3", "syn")]["verdict"] == "fail" and v[("3", "syn")]["numbers"]["reduced"] == []
    assert v[("2b", "syn")]["verdict"] == "pass"                          # it still reduces the mean over the panel
    # one held-out detector is not enough (held_out_min = 2)
    one = {**DROP, "m2:N=4": {**dict.fromkeys(REWARD, 2.5), "entropy": 1.5, "log_rank": 0.0, "rank": 0.0}}
    v = verdicts(make_run(tmp_path / "one", scores=synthetic_scores(one)))
    assert v[("3", "syn")]["verdict"] == "fail" and v[("3", "syn")]["numbers"]["reduced"] == ["entropy"]


def test_undetected_original_text_and_a_short_homoglyph_sweep_fail(tmp_path):
    got = flip(tmp_path / "a", scores=synthetic_scores(ai_mean=0.5))     # AI scores like human ones
    assert got[("2a", "syn")] == "fail"
    short = {k: v for k, v in DROP.items() if k != "m5:homoglyph_p=0.01"}   # p = 0.5% only
    assert flip(tmp_path / "b", scores=synthetic_scores(short))[("4c", None)] == "fail"


def test_a_missing_figure_fails_criteria_1_and_2_with_the_reason(tmp_path):
    v = verdicts(make_run(tmp_path / "run", figures=[f for f in FIGURES if f != "tables/table_transfer.md"]))
    assert v[("1", None)]["verdict"] == "fail" and v[("2", None)]["verdict"] == "pass"
    assert "tables/table_transfer.md (no M3 condition with a guide=... setting)" in v[("1", None)]["evidence"]


def test_a_skipped_m2_is_not_applicable_with_the_reason(tmp_path):
    why = "no StealthRL adapter given: --set stealthrl_adapter=PATH"
    sc = synthetic_scores({k: v for k, v in DROP.items() if not k.startswith("m2")})
    v = verdicts(make_run(tmp_path / "run", scores=sc, skipped={"methods": {"m2": why, "m4": "offline, and the model is not in the hub cache"}},
                          cfg={**CFG, "methods": ["m0", "m2", "m4", "m5"]}))
    for k in (("2c", "syn"), ("3", "syn")):
        assert (v[k]["verdict"], v[k]["reason"]) == ("not applicable", f"M2 (StealthRL) skipped: {why}")
    assert v[("4a", None)]["verdict"] == "not applicable" and "offline" in v[("4a", None)]["reason"]
    assert v[("2b", "syn")]["verdict"] == "pass"                          # M5 still reduces detection
    md = (tmp_path / "run" / "acceptance.md").read_text(encoding="utf-8")
    assert f"| – not applicable | M2 (StealthRL) skipped: {why} |" in md


def test_m3_guides_and_declared_detectors_outside_the_panel():
    cfg = Settings().to_dict()
    sp = A.reward_split("m3", "guide=ensemble,N=4", DETS, cfg)            # no facts: the configured guides
    assert sp["in_reward"] == ["fast_detectgpt", "roberta_openai"] and sp["unmeasured"] == ["binoculars_single"]
    assert A.reward_split("m4", "N=1", DETS, cfg) == {"declared": ["originality_ai"], "in_reward": [], "held_out": DETS,
                                                      "unmeasured": ["originality_ai"]}
    assert A.reward_split("m1", "N=4", DETS, cfg)["held_out"] == DETS


def test_a_tiny_run_with_a_lora_adapter_compares_held_out_and_in_reward_detectors(warm_store, tmp_path):
    """End to end: M2 runs with a small LoRA adapter built here (on a tiny random chat LM standing in for the paraphraser:
    costs and plumbing, not StealthRL's results) and declared reward detectors; acceptance.json's held-out vs in-reward
    row equals the means of metrics.json's per-detector TPRs, computed directly."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM
    from conftest import run_cli
    from stealth_eval.paraphrase import make_tiny_chat_lm
    lm = make_tiny_chat_lm(tmp_path / "lm")
    torch.manual_seed(0)
    peft_model = get_peft_model(AutoModelForCausalLM.from_pretrained(lm),
                                LoraConfig(r=4, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    peft_model.save_pretrained(tmp_path / "adapter")
    out = tmp_path / "run"
    reward = ["fast_detectgpt", "log_rank"]
    run_cli("--profile", "tiny", "--methods", "m2", "--n_candidates", "1", "--detectors", "log_likelihood", "log_rank",
            "entropy", "fast_detectgpt", "--out_dir", out, "--offline", "--cache_dir", warm_store,   # the originals: cached
            "--set", f"paraphraser={lm}", f"stealthrl_adapter={tmp_path / 'adapter'}", f"reward_detectors={json.dumps({'m2': reward})}",
            "data.n_per_class=8", "n_bootstrap=50")
    acc = json.loads((out / "acceptance.json").read_text())
    rows = [r for r in acc["transfer"] if r["method"] == "m2"]
    assert len(rows) == 1 and rows[0]["in_reward"] == sorted(reward) and rows[0]["held_out"] == ["entropy", "log_likelihood"]
    tpr = {d: v["m2:N=1"]["tpr1"] for d, v in json.loads((out / "metrics.json").read_text())["lee_news"].items() if d != "mean"}
    r = rows[0]
    assert r["in_reward_tpr"]["value"] == pytest.approx(np.mean([tpr[d] for d in reward]), abs=1e-12)
    assert r["held_out_tpr"]["value"] == pytest.approx(np.mean([tpr["entropy"], tpr["log_likelihood"]]), abs=1e-12)
    assert r["difference"]["value"] == pytest.approx(r["held_out_tpr"]["value"] - r["in_reward_tpr"]["value"], abs=1e-12)
    assert r["difference"]["ci_low"] <= r["difference"]["value"] <= r["difference"]["ci_high"]
    md = (out / "acceptance.md").read_text()
    assert "Held-out vs in-reward" in md and "not applicable" not in md.split("**3**")[1].split("\n")[0]
