"""DNA-DetectLLM (Zhu et al., NeurIPS 2025; reference github.com/Xiaoweizhu57/DNA-DetectLLM,
DNA-DetectLLM/dna_detectllm/detector.py `compute_score`): the batched detectors against a float64 computation written out
from the reference code, on tiny random Llamas (two seeds, one tokenizer) built here."""
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from stealth_eval.core import Cache, StealthEvalError, sha256_text, write_jsonl
from stealth_eval.detectors import DETECTORS, run_detectors_stage
from stealth_eval.dna_detectllm import DNA_VERSION, dna_batch, score_dna
from stealth_eval.models import load_causal_lm, make_tiny_lm, plan_batches

ROOT = Path(__file__).resolve().parent.parent
TOL = 1e-6
TEXTS = ["the police said the fire was under control",
         "a minister said two people were at the news today and it was the government that said it",
         "the fire is new",
         "he said the police were at the fire and the minister said it was under control after two more people"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny_dna")
    perf, obs = make_tiny_lm(d / "perf", seed=0), make_tiny_lm(d / "obs", seed=7)
    return {"perf": load_causal_lm(str(perf), device="cpu"), "obs": load_causal_lm(str(obs), device="cpu"),
            "perf_path": str(perf), "obs_path": str(obs), "dir": d}


def _cfg(models, **kw):
    return {"binoculars_observer": models["obs_path"], "binoculars_performer": models["perf_path"],
            "scoring_model": models["perf_path"], "device": "cpu", "trust_remote_code": False, "score_max_tokens": 64,
            "score_batch_tokens": 256, "score_bucket_tokens": 32, **kw}   # several padded rows per forward pass


# ---- float64 reference, written out from the reference code (metrics.py sum_perplexity / entropy) ----------------
def _log_softmax(row):
    m = max(row)
    lse = m + math.log(sum(math.exp(v - m) for v in row))
    return [v - lse for v in row]


def slow_dna(obs, perf, text, max_tokens=None, pad=None):
    """(ppl(x) + ppl(x*)) / (2 x-ppl): x* the performer's argmax at every position, x-ppl the observer-weighted
    cross-entropy of the performer over every non-pad input position; `obs` None: the performer in both roles."""
    ids = perf.tokenizer(text).input_ids[:max_tokens]
    pad = perf.tokenizer.pad_token_id if pad is None else pad
    with torch.no_grad():
        zp = perf.model(torch.tensor([ids])).logits[0].double().tolist()
        zo = zp if obs is None else obs.model(torch.tensor([ids])).logits[0].double().tolist()
    n = len(ids)
    ppl = ppl_max = 0.0
    for t in range(n - 1):
        lp = _log_softmax(zp[t])
        best = max(range(len(lp)), key=lambda v: (lp[v], -v))     # the first maximum, as torch.argmax
        ppl -= lp[ids[t + 1]]
        ppl_max -= lp[best]
    xs = [-sum(math.exp(a) * b for a, b in zip(_log_softmax(zo[t]), _log_softmax(zp[t]))) for t in range(n) if ids[t] != pad]
    return (ppl / (n - 1) + ppl_max / (n - 1)) / (2 * sum(xs) / len(xs))


def test_reference_formula_by_hand():
    "The float64 reference on a case computed by hand: (ln 4 + ln 2) / (2 * 5/3 ln 2) = 0.9 (uniform observer)."
    ln2 = math.log(2)
    perf = torch.tensor([[[0., ln2, 0.], [0., ln2, 0.]]], dtype=torch.float64)
    got = dna_batch(torch.zeros(1, 2, 3), perf, torch.tensor([[1, 0]]), [2])[0]
    assert abs(got["dna_detectllm"] - 0.9) <= TOL and abs(got["log_ppl"] - 2 * ln2) <= TOL
    assert abs(got["log_ppl_repaired"] - ln2) <= TOL and abs(got["x_ppl"] - 5 / 3 * ln2) <= TOL


def test_pair_matches_float64_reference_in_padded_batches(models, tmp_path):
    cfg = _cfg(models)
    ids = [models["perf"].tokenizer(t).input_ids for t in TEXTS]
    batches = plan_batches([len(s) for s in ids], 256, 32)
    assert any(len(idx) > 1 and len({len(ids[i]) for i in idx}) > 1 for _, _, idx in batches)   # rows of different lengths share a pass
    got = score_dna(TEXTS + ["the"], cfg, Cache(tmp_path / "store"), models["obs_path"], models["perf_path"])
    for t in TEXTS:
        ref = slow_dna(models["obs"], models["perf"], t)
        assert abs(got[sha256_text(t)]["dna_detectllm"] - ref) <= TOL, (t, got[sha256_text(t)], ref)
        assert got[sha256_text(t)]["n_tokens"] == len(models["perf"].tokenizer(t).input_ids) - 1
    assert got[sha256_text("the")] is None                                         # one token: nothing to predict
    # the observer matters: the same text with one model in both roles scores differently
    assert abs(slow_dna(None, models["perf"], TEXTS[0]) - slow_dna(models["obs"], models["perf"], TEXTS[0])) > 1e-3


def test_pad_token_inside_a_text_leaves_the_cross_perplexity(models):
    "The reference drops every input position whose token is the pad id (pad = EOS when a tokenizer has none) from X-PPL only."
    from stealth_eval.detectors import lm_logits
    from stealth_eval.models import pad_batch
    seqs = [models["perf"].tokenizer(t).input_ids for t in TEXTS[:2]]
    the = models["perf"].tokenizer("the").input_ids[-1]
    ids, mask = pad_batch(seqs, 3, 32, models["perf"].tokenizer.pad_token_id)
    with torch.no_grad():
        got = dna_batch(lm_logits(models["obs"], ids, mask), lm_logits(models["perf"], ids, mask), ids, [len(s) for s in seqs] + [len(seqs[0])], the)
    for t, g in zip(TEXTS[:2], got):
        assert abs(g["dna_detectllm"] - slow_dna(models["obs"], models["perf"], t, pad=the)) <= TOL
    assert abs(got[0]["dna_detectllm"] - slow_dna(models["obs"], models["perf"], TEXTS[0])) > 1e-4   # "the" is in the text


def test_single_stand_in_matches_reference_and_truncates(models, tmp_path):
    det = DETECTORS.get("dna_detectllm_single")
    cfg = _cfg(models, score_windows={"dna_detectllm_single": 8})
    got = det.compute(TEXTS, cfg, Cache(tmp_path / "store"))
    for t in TEXTS:
        st = got[sha256_text(t)]
        assert abs(st["dna_detectllm"] - slow_dna(None, models["perf"], t, max_tokens=8)) <= TOL
        n = len(models["perf"].tokenizer(t).input_ids)
        assert st["truncated"] == (n > 8) and st["n_tokens"] == min(n, 8) - 1 and st["n_tokens_input"] == n
    assert any(st["truncated"] for st in got.values()) and not all(st["truncated"] for st in got.values())


def test_score_does_not_depend_on_batch_mates(models, tmp_path):
    cfg, t = _cfg(models), TEXTS[0]
    runs = [score_dna(texts, cfg, Cache(tmp_path / f"s{i}"), models["obs_path"], models["perf_path"])[sha256_text(t)]
            for i, texts in enumerate([[t], [t, TEXTS[1], TEXTS[3]], [TEXTS[2], t], [t, TEXTS[3]]])]
    assert all(r == runs[0] for r in runs[1:]), runs


def test_cache_answers_the_second_call_and_keys_carry_the_version(models, tmp_path):
    cfg, cache = _cfg(models), Cache(tmp_path / "store")
    det = DETECTORS.get("dna_detectllm")
    first = det.compute(TEXTS[:2], cfg, cache)
    assert det.compute(TEXTS[:2], cfg, cache) == first
    assert cache.stats()["dna_detectllm"] == {"hits": 2, "misses": 2}
    assert DNA_VERSION == "dna-v1" and ("dna_detectllm" in cache.key("dna_detectllm", version=DNA_VERSION))


def test_pair_with_different_tokenizers_is_refused(models, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(models["obs_path"], other)
    tj = json.loads((other / "tokenizer.json").read_text())
    voc = tj["model"]["vocab"]
    voc["police"], voc["fire"] = voc["fire"], voc["police"]
    (other / "tokenizer.json").write_text(json.dumps(tj))
    with pytest.raises(StealthEvalError, match="tokenize differently"):
        score_dna([TEXTS[0]], _cfg(models), Cache(tmp_path / "store"), str(other), models["perf_path"])


def test_registry_directions_and_skip_reason(models, tmp_path):
    pair, single = DETECTORS.get("dna_detectllm"), DETECTORS.get("dna_detectllm_single")
    for d in (pair, single):
        assert d.direction == -1 and d.family == "zero-shot ratio" and d.stat == "dna_detectllm"
        assert "Xiaoweizhu57/DNA-DetectLLM" in d.reference and "detector.py" in d.reference
    assert "not the paper's pair" in single.reference
    assert "dna_detectllm_single runs one model" in pair.unavailable({"binoculars_observer": None, "binoculars_performer": None})
    assert pair.unavailable(_cfg(models)) == ""
    assert pair.window_of(_cfg(models)) == single.window_of(_cfg(models)) == 1024
    # through the stage: no pair configured -> the pair detector is skipped with its reason, the stand-in scores
    out = tmp_path / "run"
    write_jsonl(out / "raw_outputs.jsonl", [{
        "sample_id": f"s{i}", "dataset": "toy", "label": lab, "domain": "news", "generator": "g", "method": "m0",
        "setting": "", "defense": "none", "condition": "m0", "candidate_rank": 0, "valid": True, "fail_reason": "",
        "text_out": t} for i, (lab, t) in enumerate([("human", TEXTS[1]), ("ai", TEXTS[0])])])
    cfg = {**_cfg(models, binoculars_observer=None, binoculars_performer=None), "out_dir": str(out),
           "detectors": ["dna_detectllm", "dna_detectllm_single"]}
    scores = run_detectors_stage(cfg, Cache(tmp_path / "store"))
    assert "dna_detectllm_single runs one model" in json.loads((out / "skipped.json").read_text())["detectors"]["dna_detectllm"]
    assert set(scores["detector_name"]) == {"dna_detectllm_single"} and scores["valid"].all()
    s = scores.set_index("sample_id")
    assert abs(s.loc["s1", "detector_score_raw"] - slow_dna(None, models["perf"], TEXTS[0])) <= TOL
    assert np.allclose(s["detector_score_ai"], -s["detector_score_raw"]) and (s["score_window"] == 1024).all()


def test_listed_and_accepted_by_the_configuration():
    from stealth_eval.config import resolve_config
    cfg = resolve_config("embedded", detectors=["dna_detectllm_single"], overrides={"score_windows": {"dna_detectllm": 512}})
    assert cfg.to_dict()["detectors"] == ["dna_detectllm_single"]
    p = subprocess.run([sys.executable, "-m", "stealth_eval.run", "--list"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    names = next(l for l in p.stdout.splitlines() if l.startswith("detectors:")).split(":", 1)[1].split(", ")
    assert {"dna_detectllm", "dna_detectllm_single"} <= {n.strip() for n in names}


def test_single_stand_in_reads_the_panels_forward_pass(models, tmp_path):
    "The stand-in is a panel statistic: after it, a panel detector with the same window is answered from the cache."
    from stealth_eval.detectors import PanelDetector
    single, bino = DETECTORS.get("dna_detectllm_single"), DETECTORS.get("binoculars_single")
    cfg = _cfg(models, score_windows={"binoculars_single": 1024})
    assert isinstance(single, PanelDetector) and single.source(cfg) == bino.source(cfg)   # before: its own pass and source
    cache = Cache(tmp_path / "store")
    single.compute(TEXTS, cfg, cache)
    got = bino.compute(TEXTS, cfg, cache)
    assert cache.stats()["lm_panel"]["hits"] >= len(TEXTS) and all(v is not None for v in got.values())


def test_the_pair_and_the_observers_panel_share_one_pass_of_each_model(models, tmp_path):
    """#35: Binoculars and DNA-DetectLLM on the pair and the panel on the observer (the paper's setting: Falcon-7b
    scores and observes): the stage runs each model once per text, and every value equals its computation alone."""
    from stealth_eval.detectors import PASSES, run_detectors_stage, score_binoculars_pair, score_texts
    out = tmp_path / "run"
    write_jsonl(out / "raw_outputs.jsonl", [{
        "sample_id": f"s{i}", "dataset": "toy", "label": "ai", "domain": "news", "generator": "g", "method": "m0",
        "setting": "", "defense": "none", "condition": "m0", "candidate_rank": 0, "valid": True, "fail_reason": "",
        "text_out": t} for i, t in enumerate(TEXTS)])
    cfg = {**_cfg(models, scoring_model=models["obs_path"]), "out_dir": str(out), "score_windows": {},
           "detectors": ["log_likelihood", "fast_detectgpt", "binoculars", "dna_detectllm"]}
    idents = {models["obs"].identity, models["perf"].identity}
    before = dict(PASSES)
    scores = run_detectors_stage(cfg, Cache(tmp_path / "store")).set_index(["detector_name", "sample_id"])
    grown = {k: v - before.get(k, 0) for k, v in PASSES.items() if v != before.get(k, 0)}
    assert {k[0] for k in grown} == idents and len(grown) == 2 * len(TEXTS) and set(grown.values()) == {1}, grown
    bino = score_binoculars_pair(TEXTS, cfg, Cache(tmp_path / "a"), 512)
    dna = score_dna(TEXTS, cfg, Cache(tmp_path / "b"), models["obs_path"], models["perf_path"], 1024)
    ll = score_texts(TEXTS, models["obs_path"], cfg, Cache(tmp_path / "c"), 64)
    for i, t in enumerate(TEXTS):
        h = sha256_text(t)
        assert scores.loc[("binoculars", f"s{i}"), "detector_score_raw"] == bino[h]["binoculars"]
        assert scores.loc[("dna_detectllm", f"s{i}"), "detector_score_raw"] == dna[h]["dna_detectllm"]
        assert scores.loc[("log_likelihood", f"s{i}"), "detector_score_raw"] == ll[h]["ll"]
