"""The likelihood and perturbation detectors against direct, slow float64 computations of the papers' formulas.

Tiny random models built here (a Llama from `make_tiny_lm` with two seeds, a T5 from `make_tiny_t5`), fixed texts.
The slow references below are written from the definitions (explicit loops, Python floats), not from the code under
test; they share only the model's float32 logits, converted to float64.
"""
import json
import math
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from stealth_eval.core import Cache, StealthEvalError, sha256_text, write_json, write_jsonl
from stealth_eval.detectors import (DETECTORS, binoculars_from_logits, panel_from_logits, panel_stats,
                                    run_detectors_stage, score_binoculars_pair, score_texts)
from stealth_eval.models import load_causal_lm, make_tiny_lm
from stealth_eval import perturbation as pt

TEXTS = ["the police said the fire was under control",
         "a minister said two people were at the news today and it was the government that said it"]
TOL = 1e-6


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    a, b = make_tiny_lm(d / "a", seed=0), make_tiny_lm(d / "b", seed=7)
    t5 = pt.make_tiny_t5(d / "t5")
    return {"a": load_causal_lm(str(a), device="cpu"), "b": load_causal_lm(str(b), device="cpu"),
            "a_path": str(a), "b_path": str(b), "t5_path": str(t5)}


def _cfg(models, **pert):
    return {"scoring_model": models["a_path"], "embedder": "all-minilm-l6-v2", "device": "cpu", "trust_remote_code": False,
            "score_max_tokens": 64, "seed": 0,
            "perturbation": {"n_perturbations": 4, "infill_model": models["a_path"], "t5_model": models["t5_path"],
                             "t5_max_length": 40, **pert}}


# ---- slow float64 references, position by position ------------------------------------------------------------
def _logits(lm, text):
    ids = lm.tokenizer(text, return_tensors="pt").input_ids
    with torch.no_grad(): z = lm.model(ids).logits[0].double()
    return ids[0].tolist(), z


def _log_softmax(row):
    row = [float(v) for v in row]
    m = max(row)
    lse = m + math.log(sum(math.exp(v - m) for v in row))
    return [v - lse for v in row]


def slow_panel(lm, text, ref_lm=None):
    "Mean log p, 1-based rank, log-rank, entropy, LRR, and Fast-DetectGPT's analytic criterion (Bao et al. 2024)."
    ids, z = _logits(lm, text)
    zr = z if ref_lm is None else _logits(ref_lm, text)[1]
    lp_obs, ranks, ents, mus, vs = [], [], [], [], []
    for t in range(len(ids) - 1):
        lp, y = _log_softmax(z[t]), ids[t + 1]
        q = [math.exp(v) for v in _log_softmax(zr[t])]
        lp_obs.append(lp[y])
        ranks.append(1 + sum(1 for v in lp if v > lp[y]))
        ents.append(-sum(math.exp(v) * v for v in lp))
        mu = sum(qi * li for qi, li in zip(q, lp))
        mus.append(mu)
        vs.append(sum(qi * (li - mu) ** 2 for qi, li in zip(q, lp)))
    n = len(lp_obs)
    ll, logrank = sum(lp_obs) / n, sum(math.log(r) for r in ranks) / n
    return {"ll": ll, "rank": sum(ranks) / n, "logrank": logrank, "entropy": sum(ents) / n, "lrr": -ll / logrank,
            "fdg": (sum(lp_obs) - sum(mus)) / math.sqrt(sum(vs))}


def slow_binoculars(obs, perf, text):
    "Hans et al. 2024 reference code: performer log-ppl / observer-to-performer cross-entropy (all input positions)."
    ids, zp = _logits(perf, text)
    zo = _logits(obs, text)[1]
    ce = [-_log_softmax(zp[i])[ids[i + 1]] for i in range(len(ids) - 1)]
    x = []
    for i in range(len(ids)):
        lq, lo = _log_softmax(zp[i]), _log_softmax(zo[i])
        x.append(-sum(math.exp(a) * b for a, b in zip(lo, lq)))
    return (sum(ce) / len(ce)) / (sum(x) / len(x))


# ---- likelihood panel -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("text", TEXTS)
def test_panel_matches_slow_formulas(models, text):
    got, ref = panel_stats(models["a"], text), slow_panel(models["a"], text)
    for k in ("ll", "rank", "logrank", "entropy", "lrr", "fdg"):
        assert abs(got[k] - ref[k]) <= TOL, (k, got[k], ref[k])
    assert got["rank"] >= 1 and got["lrr"] > 0


def test_fast_detectgpt_with_separate_reference_model(models):
    text = TEXTS[1]
    ids = models["a"].tokenizer(text, return_tensors="pt").input_ids
    with torch.no_grad():
        z, zr = models["a"].model(ids).logits[0, :-1], models["b"].model(ids).logits[0, :-1]
    got = panel_from_logits(z, ids[0, 1:], ref_logits=zr)["fdg"]
    ref = slow_panel(models["a"], text, ref_lm=models["b"])["fdg"]
    assert abs(got - ref) <= TOL
    assert abs(got - slow_panel(models["a"], text)["fdg"]) > 1e-3   # the reference model matters


def test_binoculars_pair_matches_slow_formula(models, tmp_path):
    cfg = {"binoculars_observer": models["b_path"], "binoculars_performer": models["a_path"], "device": "cpu",
           "trust_remote_code": False, "score_max_tokens": 64}
    got = score_binoculars_pair(TEXTS + ["the"], cfg, Cache(tmp_path / "store"))
    for text in TEXTS:
        assert abs(got[sha256_text(text)]["binoculars"] - slow_binoculars(models["b"], models["a"], text)) <= TOL
    assert got[sha256_text("the")] is None
    # one model in both roles (the embedded profile's binoculars_single), from the panel's forward pass
    assert abs(panel_stats(models["a"], TEXTS[0])["binoculars_single"] - slow_binoculars(models["a"], models["a"], TEXTS[0])) <= TOL


def slow_fdg_pair(sampling, scoring, text):
    """Fast-DetectGPT's `get_sampling_discrepancy_analytic(logits_ref, logits_score, labels)` (scripts/fast_detect_gpt.py)
    written out position by position in Python floats: log p from the scoring model, its mean and variance under the
    sampling model's distribution."""
    ids, zs = _logits(scoring, text)
    zr = _logits(sampling, text)[1]
    ll = mu = var = 0.0
    for t in range(len(ids) - 1):
        lp, q = _log_softmax(zs[t].tolist()), [math.exp(v) for v in _log_softmax(zr[t].tolist())]
        m = sum(qi * li for qi, li in zip(q, lp))
        ll, mu, var = ll + lp[ids[t + 1]], mu + m, var + sum(qi * li * li for qi, li in zip(q, lp)) - m * m
    return (ll - mu) / math.sqrt(var)


def test_fast_detectgpt_pairs_match_the_references_criterion(models, tmp_path, monkeypatch):
    """`fast_detectgpt_pair` (Falcon's settings) and `fast_detectgpt_llama3` (the Llama-3 pair's): the analytic criterion
    with the observer as sampling model and the performer as scoring model, as the reference's local_infer.py pairs them;
    with one model in both roles it is the panel's `fast_detectgpt`. Each reads its own pair of settings, and a profile
    without the pair skips it with the reason."""
    from stealth_eval.detectors import score_pair
    cfg = {"binoculars_observer": models["b_path"], "binoculars_performer": models["a_path"],
           "llama3_observer": models["a_path"], "llama3_performer": models["b_path"], "device": "cpu",
           "trust_remote_code": False, "score_max_tokens": 64}
    for name, (samp, score) in (("fast_detectgpt_pair", ("b", "a")), ("fast_detectgpt_llama3", ("a", "b"))):
        det = DETECTORS.get(name)
        got = det.compute(TEXTS + ["the"], cfg, Cache(tmp_path / name))
        for text in TEXTS:
            assert abs(det.raw(got[sha256_text(text)]) - slow_fdg_pair(models[samp], models[score], text)) <= TOL
        assert got[sha256_text("the")] is None and det.direction == 1 and det.unavailable(cfg) == ""
    same = score_pair(TEXTS, cfg, Cache(enabled=False), 64, models["a_path"], models["a_path"], "fdg")
    assert abs(same[sha256_text(TEXTS[0])]["fdg"] - panel_stats(models["a"], TEXTS[0])["fdg"]) <= TOL
    bino = DETECTORS.get("binoculars_llama3").compute(TEXTS, cfg, Cache(enabled=False))
    assert abs(bino[sha256_text(TEXTS[1])]["binoculars"] - slow_binoculars(models["a"], models["b"], TEXTS[1])) <= TOL
    assert "llama3_observer, llama3_performer" in DETECTORS.get("fast_detectgpt_llama3").unavailable({"llama3_observer": None})


def test_panel_detectors_directions_and_invalid_texts(models):
    assert {n: DETECTORS.get(n).direction for n in ("log_likelihood", "rank", "log_rank", "entropy", "lrr", "fast_detectgpt")} == \
        {"log_likelihood": 1, "rank": -1, "log_rank": -1, "entropy": 1, "lrr": 1, "fast_detectgpt": 1}
    assert panel_stats(models["a"], "") is None and panel_stats(models["a"], "the") is None
    long = panel_stats(models["a"], "the fire " * 40, max_tokens=16)
    assert long["truncated"] and long["n_tokens"] == 15 and long["n_tokens_input"] == 80


# ---- DetectGPT and NPR ----------------------------------------------------------------------------------------
def test_detectgpt_and_npr_match_slow_formulas_on_fixed_perturbations(models, tmp_path, monkeypatch):
    src = TEXTS[1]
    fixed = ["a minister said two people were at the fire today and it was the government that said it",
             "a police said two people were at the news today and it was the minister that said it",
             "a minister said the people were at the news today and he was the government that said it",
             None,                                                     # a failed fill: left out
             "a minister said two people were in the news today and it was the government that said this"]
    monkeypatch.setattr(pt, "perturb_texts", lambda texts, mode, cfg, cache: {
        sha256_text(t): {"source": t, "truncated": False, "perturbed": fixed} for t in texts})
    got = pt.perturbation_scores([src], "lminfill", _cfg(models), Cache(tmp_path / "store"))[sha256_text(src)]
    x = slow_panel(models["a"], src)
    ps = [slow_panel(models["a"], t) for t in fixed if t is not None]
    lls = [p["ll"] for p in ps]
    mean = sum(lls) / len(lls)
    std = math.sqrt(sum((v - mean) ** 2 for v in lls) / len(lls))      # population std, as np.std in the reference
    assert got["n_perturbed"] == 4
    assert abs(got["detectgpt"] - (x["ll"] - mean) / std) <= TOL
    assert abs(got["detectgpt_d"] - (x["ll"] - mean)) <= TOL                  # the reference's unnormalised 'd'
    assert abs(got["npr"] - (sum(p["logrank"] for p in ps) / len(ps)) / x["logrank"]) <= TOL
    # one perturbation only: the reference's std is 1
    monkeypatch.setattr(pt, "perturb_texts", lambda texts, mode, cfg, cache: {
        sha256_text(t): {"source": t, "truncated": False, "perturbed": fixed[:1]} for t in texts})
    one = pt.perturbation_scores([src], "lminfill", _cfg(models), Cache(tmp_path / "store"))[sha256_text(src)]
    assert abs(one["detectgpt"] - (x["ll"] - slow_panel(models["a"], fixed[0])["ll"])) <= TOL
    # `perturbation.scoring_model` scores with another LM (the embedded profile's white-box setting), and the
    # detectors' model identity names it
    other = pt.perturbation_scores([src], "lminfill", _cfg(models, scoring_model=models["b_path"]),
                                   Cache(tmp_path / "store"))[sha256_text(src)]
    xb = slow_panel(models["b"], src)
    assert abs(other["detectgpt"] - (xb["ll"] - slow_panel(models["b"], fixed[0])["ll"])) <= TOL
    assert abs(other["detectgpt"] - one["detectgpt"]) > 1e-3
    cfg_b = _cfg(models, scoring_model=models["b_path"])
    assert pt.DETECTGPT_LMINFILL.model(cfg_b).startswith(Path(models["b_path"]).name + "@")
    assert pt.DETECTGPT_LMINFILL.source(cfg_b) != pt.DETECTGPT_LMINFILL.source(_cfg(models))


def test_span_masking_rule():
    words = [f"w{i}" for i in range(80)]
    text = " ".join(words)
    for seed in range(25):
        toks = pt.mask_spans(text, 2, 0.3, 1, seed)
        n = int(0.3 * 80 / (2 + 2 * 1))                                  # 6 spans: 12 of 80 words (15%)
        assert sum(t is pt.MASK for t in toks) == n and len(toks) == 80 - n
        spans = pt.masked_words(text, toks, 2)
        assert all(ws == words[s:s + 2] for s, ws in spans)
        masked = {s + k for s, _ in spans for k in range(2)}
        assert [t for t in toks if t is not pt.MASK] == [w for i, w in enumerate(words) if i not in masked]
        pos = [i for i, t in enumerate(toks) if t is pt.MASK]
        assert all(b - a >= 2 for a, b in zip(pos, pos[1:]))           # >= buffer_size (1) unmasked words between
        assert max(masked) <= 78                                         # reference randint excludes the last start
    toks = pt.mask_spans(text, 3, 0.3, 2, 0)
    assert sum(t is pt.MASK for t in toks) == int(0.3 * 80 / 7)
    pos = [i for i, t in enumerate(toks) if t is pt.MASK]
    assert all(b - a >= 3 for a, b in zip(pos, pos[1:]))
    assert pt.mask_spans(" ".join(words[:13]), 2, 0.3, 1, 0) is None       # too short for one span


def test_infill_keeps_unmasked_words(models):
    src = TEXTS[1] + " and the police said the fire was under control"
    jobs = [pt.mask_spans(src, 2, 0.3, 1, s) for s in range(5)]
    fills = pt.lm_infill(models["a"], jobs, list(range(5)), span_length=2, batch_size=3)
    for toks, f in zip(jobs, fills):
        assert len(f) == sum(t is pt.MASK for t in toks) and all(1 <= len(x.split()) <= 2 for x in f)
        out, it = pt.apply_fills(toks, f), iter(f)
        expect = " ".join(next(it) if t is pt.MASK else t for t in toks)
        assert out == expect
        kept = [t for t in toks if t is not pt.MASK]
        assert all(w in out.split(" ") for w in kept)
    assert fills != [[" ".join(w) for _, w in pt.masked_words(src, t, 2)] for t in jobs]   # sampled, not copied


def test_t5_path_runs_on_a_tiny_t5(models, tmp_path):
    cfg = _cfg(models)
    long = " ".join(["the police said the fire was under control and"] * 3)
    P = pt.perturb_texts([long, "the news"], "t5", cfg, Cache(tmp_path / "store"))
    v = P[sha256_text(long)]
    ok = [t for t in v["perturbed"] if t is not None]
    assert len(ok) >= 2 and any(t != long for t in ok)
    assert P[sha256_text("the news")]["perturbed"] == [None] * 4         # too short: no perturbation, no fake score
    out = pt.DETECTGPT.compute([long, "the news"], cfg, Cache(tmp_path / "store"))
    assert out[sha256_text("the news")] is None and math.isfinite(out[sha256_text(long)]["detectgpt"])
    # T5 window: a source longer than t5_max_input_tokens is cut at a word boundary and marked truncated
    P = pt.perturb_texts([long], "t5", _cfg(models, t5_max_input_tokens=20), Cache(tmp_path / "store2"))
    v = P[sha256_text(long)]
    assert v["truncated"] and long.startswith(v["source"]) and len(v["source"].split(" ")) == 20   # one token per word, no EOS
    assert pt.extract_t5_fills("<pad><extra_id_0> big red<extra_id_1> fox ran<extra_id_2></s>") == ["big red", "fox ran"]


def test_t5_unavailable_offline_with_reason(models, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = _cfg(models, t5_model="stealth-eval-test/no-such-t5-model")
    why = pt.DETECTGPT.unavailable(cfg)
    assert "offline" in why and "no-such-t5-model" in why
    assert pt.DETECTGPT_LMINFILL.unavailable(cfg) == ""


def test_perturbations_are_cached_and_shared(models, tmp_path):
    cfg, cache = _cfg(models), Cache(tmp_path / "store")
    texts = [TEXTS[1] + " and the police said the fire was under control", "the"]
    a = pt.DETECTGPT_LMINFILL.compute(texts, cfg, cache)
    assert cache.misses["perturbation"] == 2 * 4 and cache.hits["perturbation"] == 0
    cache.hits.clear(); cache.misses.clear()
    b = pt.NPR_LMINFILL.compute(texts, cfg, cache)
    assert dict(cache.misses) == {} and cache.hits["perturbation"] == 8 and cache.hits["lm_panel"] >= 5
    assert a == b and a[sha256_text("the")] is None
    assert pt.DETECTGPT_LMINFILL.source(cfg) == pt.NPR_LMINFILL.source(cfg)
    # more perturbations: only the new ones are computed
    cache.hits.clear(); cache.misses.clear()
    pt.perturb_texts(texts, "lminfill", _cfg(models, n_perturbations=6), cache)
    assert cache.hits["perturbation"] == 8 and cache.misses["perturbation"] == 4
    # another seed, other perturbations
    c2 = dict(cfg, seed=1)
    assert pt.perturb_texts(texts[:1], "lminfill", c2, cache) != pt.perturb_texts(texts[:1], "lminfill", cfg, cache)


def test_proxihuman_matches_direct_computation(models, tmp_path):
    from stealth_eval.models import load_embedder
    cfg, cache = _cfg(models, proxihuman_k=2), Cache(tmp_path / "store")
    src = TEXTS[1] + " and the police said the fire was under control"
    got = pt.PROXIHUMAN_LMINFILL.compute([src], cfg, cache)[sha256_text(src)]
    pert = [t for t in pt.perturb_texts([src], "lminfill", cfg, cache, "proxihuman")[sha256_text(src)]["perturbed"] if t]   # its own masks
    E = load_embedder("all-minilm-l6-v2", device="cpu").encode([src] + pert).astype(np.float64)
    d = sorted(1 - float(np.dot(E[0], e)) / (np.linalg.norm(E[0]) * np.linalg.norm(e)) for e in E[1:])
    assert abs(got["proxihuman"] - (d[0] + d[1]) / 2) <= 1e-5            # float32 embeddings
    assert DETECTORS.get("proxihuman_lminfill").direction == -1


def test_stage_merges_skipped_and_marks_invalid(models, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "run"
    rows = []
    for i, (label, text) in enumerate([("human", TEXTS[1] + " and the police said the fire was under control"),
                                       ("ai", "the police said the fire was under control and it was the government that said two people were at the news today"),
                                       ("ai", "the news")]):
        rows.append({"sample_id": f"s{i}", "dataset": "toy", "label": label, "domain": "news", "generator": "g",
                     "method": "m0", "setting": "", "defense": "none", "condition": "m0", "candidate_rank": 0,
                     "text_out": text, "valid": True, "fail_reason": ""})
    write_jsonl(out / "raw_outputs.jsonl", rows)
    write_json(out / "skipped.json", {"methods": {"m2": "no adapter"}})
    cfg = {**_cfg(models, t5_model="stealth-eval-test/no-such-t5-model"), "out_dir": str(out),
           "detectors": ["log_likelihood", "lrr", "detectgpt_lminfill", "npr_lminfill", "detectgpt"]}
    scores = run_detectors_stage(cfg, Cache(tmp_path / "store"))
    skipped = json.loads((out / "skipped.json").read_text())
    assert skipped["methods"] == {"m2": "no adapter"} and "detectgpt" in skipped["detectors"]
    assert set(scores["detector_name"]) == {"log_likelihood", "lrr", "detectgpt_lminfill", "npr_lminfill"}
    short = scores[(scores["sample_id"] == "s2") & (scores["detector_name"] == "detectgpt_lminfill")].iloc[0]
    assert not short["valid"] and np.isnan(short["detector_score_raw"]) and "too short" in short["fail_reason"]
    ok = scores[(scores["sample_id"] == "s0") & (scores["detector_name"] == "npr_lminfill")].iloc[0]
    assert ok["valid"] and ok["detector_score_ai"] == ok["detector_score_raw"] > 0


def test_t5_that_cannot_load_is_skipped_with_reason(models, tmp_path):
    out = tmp_path / "run"
    write_jsonl(out / "raw_outputs.jsonl", [{
        "sample_id": "s0", "dataset": "toy", "label": "human", "domain": "news", "generator": "g", "method": "m0",
        "setting": "", "defense": "none", "condition": "m0", "candidate_rank": 0, "valid": True, "fail_reason": "",
        "text_out": TEXTS[1] + " and the police said the fire was under control"}])
    (tmp_path / "not_a_model").mkdir()
    cfg = {**_cfg(models, t5_model=str(tmp_path / "not_a_model")), "out_dir": str(out), "detectors": ["log_likelihood", "detectgpt", "npr"]}
    scores = run_detectors_stage(cfg, Cache(tmp_path / "store"))
    skipped = json.loads((out / "skipped.json").read_text())["detectors"]
    assert set(skipped) == {"detectgpt", "npr"} and "could not load the T5 span filler" in skipped["detectgpt"]
    assert set(scores["detector_name"]) == {"log_likelihood"}
    # every detector of the run skipped: one line naming each and why (before: KeyError 'text_out', exit 1) (#37)
    cfg = {**cfg, "detectors": ["detectgpt", "npr"]}
    with pytest.raises(StealthEvalError, match=r"no detector of the run could score: detectgpt: could not load the T5 span filler.*; npr: "):
        run_detectors_stage(cfg, Cache(tmp_path / "store"))


def test_truncation_is_recorded(models, tmp_path):
    cfg = {**_cfg(models), "score_max_tokens": 12}
    src = TEXTS[1] + " and the police said the fire was under control"
    st = pt.DETECTGPT_LMINFILL.compute([src], cfg, Cache(tmp_path / "store"))[sha256_text(src)]
    assert st["truncated"] and st["n_tokens_input"] == len(src.split())
    st = pt.DETECTGPT_LMINFILL.compute([src], _cfg(models), Cache(tmp_path / "store"))[sha256_text(src)]
    assert not st["truncated"]


def test_infill_document_start_token_on_the_real_tokenizers():
    "SmolLM2's nominal BOS is a chat-turn token: the infill starts documents with <|endoftext|>; Gemma adds its own BOS."
    smol = load_causal_lm("smollm2-135m-instruct", device="cpu").tokenizer
    assert pt._doc_start(smol) == smol.get_vocab()["<|endoftext|>"] != smol.bos_token_id


def test_profiles_choose_the_perturbation_scorer():
    from stealth_eval.config import resolve_config
    emb, paper = resolve_config("embedded"), resolve_config("paper")
    assert pt.perturbation_scorer(emb) == emb["generator"] != emb["scoring_model"]   # white-box offline (see 21_perturbation)
    assert pt.perturbation_scorer(paper) == paper["scoring_model"]                 # the panel's LM in the paper profile


def test_perturbation_detector_skips_an_unreachable_scorer_offline(models, monkeypatch):
    from stealth_eval import models as md
    monkeypatch.setattr(md, "offline_mode", lambda: True)
    cfg = _cfg(models, scoring_model="no-such-org/no-such-scorer")
    assert "scoring LM 'no-such-org/no-such-scorer'" in pt.DETECTGPT_LMINFILL.unavailable(cfg)
    assert pt.DETECTGPT_LMINFILL.unavailable(_cfg(models)) == ""             # local tiny scorer and filler: runs
    assert "scoring LM" not in pt.PROXIHUMAN_LMINFILL.unavailable(cfg)        # ProxiHuman scores with the embedder
