"""Lastde and Lastde++ (nbs/26_lastde) against direct float64 computations of the paper's definitions.

The statistic is checked three ways: on the reference repository's own toy sequence (values worked out by hand), against
the reference code's tensor pipeline re-expressed here (`unfold` + `cosine_similarity` + `histc` + `torch.std`), and,
through a tiny causal LM, the batched device code against `lastde_reference` (Python loops over log-softmax lists)
in padded batches whose rows have different lengths. A text's values must not depend on its batch mates.
"""
import math
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from stealth_eval.core import Cache, sha256_text
from stealth_eval.detectors import DETECTORS
from stealth_eval.lastde import (lastde_batch, lastde_min_tokens, lastde_of_sequence, lastde_params, lastde_reference,
                                 lastde_scores, make_sharp_tiny_lm, text_uniforms)
from stealth_eval.models import load_causal_lm, make_tiny_lm

WORDS = ("the police said the fire was under control and the minister said two people were at the news today "
         "a year after the government had been new to this").split() * 3


def rel_close(a, b, tol=1e-6):
    return abs(a - b) <= tol * max(1.0, abs(b))


# ---- the statistic on sequences --------------------------------------------------------------------------------
def test_toy_sequence_by_hand():
    "fastMDE's docstring example: DE_1 = ln 2 / ln 10 (two bins of two cosines), DE_2 = DE_3 = 0 (one bin)."
    toy = [1, 2, 13, 7, 9, 5, 4]
    r = lastde_of_sequence(toy, s=3, epsilon=10 / 7, tau_prime=3)
    de1 = math.log(2) / math.log(10)
    assert [round(d, 12) for d in r["de"]] == [round(de1, 12), 0.0, 0.0]
    assert math.isclose(r["mde"], de1 / math.sqrt(3), rel_tol=1e-12)
    assert math.isclose(r["lastde"], (41 / 7) / (de1 / math.sqrt(3)), rel_tol=1e-12)


def _reference_pipeline(xs, s, epsilon, tau_prime):
    "The reference code's tensor operations (moving-average unfold, orbit unfold, cosine_similarity, histc, std), float64."
    x = torch.tensor(xs, dtype=torch.float64)[None]
    eps = int(epsilon * x.shape[1])
    des = []
    for tau in range(1, tau_prime + 1):
        orb = x.unfold(1, tau, 1).mean(-1).unfold(1, s, 1)
        cos = torch.nn.functional.cosine_similarity(orb[:, :-1], orb[:, 1:], dim=-1)[0]
        hist = torch.histc(cos, bins=eps, min=-1, max=1)
        p = hist / hist.sum()
        des.append(-torch.nansum(p * torch.log(p)) / math.log(eps))
    mde = torch.stack(des).std()
    return float(x.mean() / mde)


@pytest.mark.parametrize("n,s,epsilon,tau_prime", [(12, 3, 10.0, 5), (40, 4, 8.0, 15), (25, 3, 1.0, 15), (19, 4, 8.0, 15)])
def test_statistic_matches_reference_pipeline_and_batch(n, s, epsilon, tau_prime):
    g = torch.Generator().manual_seed(n)
    seqs = [(-4 * torch.rand(k, generator=g, dtype=torch.float64) ** 2).tolist() for k in (n, n + 7, n + 30)]
    X = torch.full((3, n + 40), 5.0, dtype=torch.float64)        # padding: garbage past each row's length
    for i, q in enumerate(seqs): X[i, :len(q)] = torch.tensor(q, dtype=torch.float64)
    batch, _ = lastde_batch(X, torch.tensor([len(q) for q in seqs]), s, epsilon, tau_prime)
    for i, q in enumerate(seqs):
        ref = lastde_of_sequence(q, s, epsilon, tau_prime)["lastde"]
        assert rel_close(ref, _reference_pipeline(q, s, epsilon, tau_prime), 1e-9)
        assert rel_close(float(batch[i]), ref, 1e-9)


def test_too_short_is_nan_in_batch():
    need = lastde_min_tokens(4, 8.0, 15)
    assert need == 19
    X = -torch.rand(2, 30, dtype=torch.float64)
    v, _ = lastde_batch(X, torch.tensor([need - 1, need]), 4, 8.0, 15)
    assert math.isnan(float(v[0])) and math.isfinite(float(v[1]))


# ---- through a tiny LM -------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sharp(tmp_path_factory):
    d = tmp_path_factory.mktemp("lastde")
    path = str(make_sharp_tiny_lm(d / "lm"))
    return {"path": str(path), "lm": load_causal_lm(path, device="cpu"), "dir": d}


def _cfg(path, **kw):
    return {"scoring_model": path, "device": "cpu", "trust_remote_code": False, "seed": 5, "score_batch_tokens": 512,
            "score_bucket_tokens": 32, "lastde": {"n_samples": 6}, **kw}


def test_batched_matches_float64_reference(sharp, tmp_path):
    "Rows of 13, 20, 24 and 27 scored tokens share one padded 32-token batch; a 45-token text has its own (64)."
    texts = [" ".join(WORDS[i:i + k]) for i, k in ((0, 14), (1, 21), (2, 25), (5, 28), (0, 46))]
    cfg = _cfg(sharp["path"])
    got = lastde_scores(texts, cfg, Cache(tmp_path / "c"), 128)
    prm = lastde_params(cfg)
    seen_pp = 0
    for t in texts:
        e, r = got[sha256_text(t)], lastde_reference(sharp["lm"], t, prm, seed=5)
        assert e["n_tokens"] == r["n_tokens"]
        assert rel_close(e["lastde"], r["lastde"]), (e["lastde"], r["lastde"])
        if r["n_tokens"] < 19:
            assert e["lastde_pp"] is None and "fewer than the 19" in e["why"]["lastde_pp"]
        else:
            seen_pp += 1
            assert rel_close(e["lastde_pp"], r["lastde_pp"]), (e["lastde_pp"], r["lastde_pp"])
    assert seen_pp >= 3


def test_score_does_not_depend_on_batch_mates(sharp, tmp_path):
    a = " ".join(WORDS[:22])
    mates = [[a], [a, " ".join(WORDS[2:26])], [" ".join(WORDS[5:25]), a, " ".join(WORDS[::-1][:27])]]
    vals = []
    for i, batch in enumerate(mates):
        e = lastde_scores(batch, _cfg(sharp["path"]), Cache(tmp_path / f"c{i}"), 128)[sha256_text(a)]
        vals.append((e["lastde"], e["lastde_pp"]))
    assert vals[0] == vals[1] == vals[2]
    # the samples come from the text's own seeded generator: the run's seed changes them
    e = lastde_scores([a], _cfg(sharp["path"], seed=6), Cache(tmp_path / "c9"), 128)[sha256_text(a)]
    assert e["lastde"] == vals[0][0] and e["lastde_pp"] != vals[0][1]
    assert torch.equal(text_uniforms(sha256_text(a), 5, 20, 6), text_uniforms(sha256_text(a), 5, 20, 6))


def test_detectors_none_reasons_and_cache(sharp, tmp_path):
    short, ok = " ".join(WORDS[:12]), " ".join(WORDS[:21])
    cfg, cache = _cfg(sharp["path"], score_windows={}), Cache(tmp_path / "c")
    lastde, pp = DETECTORS.get("lastde"), DETECTORS.get("lastde_pp")
    a = lastde.compute([short, ok], cfg, cache)
    b = pp.compute([short, ok], cfg, cache)                 # the same entries: no second forward pass
    assert a[sha256_text(short)]["lastde"] is not None and b[sha256_text(short)] is None
    assert "fewer than the 19" in pp.why_none(sha256_text(short))
    assert b[sha256_text(ok)]["lastde_pp"] is not None
    assert cache.stats()["lastde"] == {"hits": 2, "misses": 2}
    # a window shorter than the embedding: no value, with the reason
    c = lastde.compute([ok], {**cfg, "score_windows": {"lastde": 6}}, cache)
    assert c[sha256_text(ok)] is None and "fewer than the 8" in lastde.why_none(sha256_text(ok))


def test_flat_lm_has_no_lastde_and_says_why(tmp_path):
    "A random tiny LM's log-likelihoods are nearly constant: every cosine lands in the top bin, MDE = 0."
    path = str(make_tiny_lm(tmp_path / "flat"))
    t = " ".join(WORDS[:21])
    det = DETECTORS.get("lastde")
    got = det.compute([t], _cfg(path), Cache(tmp_path / "c"))
    assert got[sha256_text(t)] is None and "does not vary across scales" in det.why_none(sha256_text(t))


# ---- registry, settings, command line ----------------------------------------------------------------------------
def test_registered_and_configurable():
    from stealth_eval.config import resolve_config
    from stealth_eval.schema import SettingsError
    for name, fam in (("lastde", "likelihood"), ("lastde_pp", "curvature")):
        d = DETECTORS.get(name)
        assert d.direction == 1 and d.family == fam and "Lastde_Detector" in d.reference
    cfg = resolve_config("embedded", detectors=["lastde", "lastde_pp"],
                         overrides={"lastde.n_samples": 50, "score_windows": {"lastde_pp": 256}})
    assert list(cfg["detectors"]) == ["lastde", "lastde_pp"] and lastde_params(cfg)["n_samples"] == 50
    assert DETECTORS.get("lastde_pp").window_of(cfg) == 256
    assert DETECTORS.get("lastde").source(cfg) != DETECTORS.get("lastde").source({**cfg, "lastde": {"n_samples": 60}})
    with pytest.raises(SettingsError, match="lastde.n_samples"):
        resolve_config("embedded", detectors=["lastde_pp"], overrides={"lastde.n_samples": 1})
    assert lastde_params({}) == {"embed_size": 3, "epsilon": 10.0, "tau_prime": 5, "pp_embed_size": 4,
                                 "pp_epsilon": 8.0, "pp_tau_prime": 15, "n_samples": 100}
    closed = resolve_config("embedded", detectors=["lastde"], overrides={"lastde.block": "closed-source"})
    assert {k: lastde_params(closed)[k] for k in ("embed_size", "epsilon", "tau_prime")} == {"embed_size": 3, "epsilon": 1.0, "tau_prime": 15}
    assert DETECTORS.get("lastde").source(closed) != DETECTORS.get("lastde").source(cfg)   # another computation, cached apart
    with pytest.raises(SettingsError, match="lastde.block"):
        resolve_config("embedded", detectors=["lastde"], overrides={"lastde.block": "gpt-4"})


def test_cli_lists_them():
    exe = Path(sys.executable).parent / "stealth-eval"
    out = subprocess.run([str(exe), "--list"], capture_output=True, text=True, timeout=300).stdout
    rows = {l.split()[0]: l for l in out.splitlines() if l.strip().startswith("lastde")}
    assert "higher = AI" in rows["lastde"] and "likelihood" in rows["lastde"]
    assert "higher = AI" in rows["lastde_pp"] and "lastde_doubleplus.py" in rows["lastde_pp"]


def test_detectors_stage_rows(sharp, tmp_path):
    "Through the stage: a value per text, a short text kept invalid with the detector's own reason, AI-oriented scores."
    from stealth_eval.core import write_jsonl
    from stealth_eval.detectors import run_detectors_stage
    out = tmp_path / "run"
    texts = [" ".join(WORDS[:30]), " ".join(WORDS[4:40]), " ".join(WORDS[:12])]
    write_jsonl(out / "raw_outputs.jsonl", [
        {"sample_id": f"s{i}", "dataset": "toy", "label": "ai", "domain": "news", "generator": "g", "method": "m0",
         "setting": "", "defense": "none", "condition": "m0", "candidate_rank": 0, "text_out": t, "valid": True,
         "fail_reason": ""} for i, t in enumerate(texts)])
    cfg = {**_cfg(sharp["path"]), "out_dir": str(out), "detectors": ["lastde", "lastde_pp"], "score_max_tokens": 64}
    scores = run_detectors_stage(cfg, Cache(tmp_path / "store")).set_index(["detector_name", "sample_id"])
    assert scores.loc[("lastde", "s2"), "valid"] and not scores.loc[("lastde_pp", "s2"), "valid"]
    assert "fewer than the 19" in scores.loc[("lastde_pp", "s2"), "fail_reason"]
    ok = scores.loc[("lastde_pp", "s0")]
    assert ok["valid"] and ok["detector_score_ai"] == ok["detector_score_raw"] and ok["detector_family"] == "curvature"
    assert scores.loc[("lastde", "s1"), "score_window"] == 128                 # window "model": the tiny LM's positions


def test_padded_and_unpadded_passes_are_cached_apart_and_agree_to_what_holds(sharp, tmp_path):
    """A padded batch and one unpadded text per pass differ in float32's last bits, which Lastde++'s histogram can
    amplify (5e-3 relative seen on Gemma): each batching has its own cache entries, so a cached value always equals its
    recomputation under the run's own batching; Lastde itself agrees to 1e-6 and Lastde++ to 5e-3."""
    texts = [" ".join(WORDS[i:i + k]) for i, k in ((0, 22), (3, 26))]
    cache = Cache(tmp_path / "c")
    padded = lastde_scores(texts, _cfg(sharp["path"]), cache, 128)
    single = lastde_scores(texts, _cfg(sharp["path"], score_batch_tokens=0), cache, 128)
    assert cache.stats()["lastde"] == {"hits": 0, "misses": 4}
    for h in padded:
        assert rel_close(single[h]["lastde"], padded[h]["lastde"])
        assert rel_close(single[h]["lastde_pp"], padded[h]["lastde_pp"], 5e-3)
    again = lastde_scores(texts, _cfg(sharp["path"], score_batch_tokens=0), cache, 128)
    assert again == single and cache.stats()["lastde"]["hits"] == 2


def test_one_pass_per_text_feeds_the_panel_lastde_dna_and_ghostbusters_stream(sharp, tmp_path, monkeypatch):
    """#35: the stage runs the scoring LM once per text for the panel, DNA-1, Lastde and Lastde++ (windows 64 and the
    model's 128, texts shorter than both), and Ghostbuster's stream shares that pass where it reads the same tokens;
    every value equals the one each computation gets with a pass of its own (a fresh store each). One pass is also one
    product with the output head: every reader slices the batch's logits made once (`HeadLogits.once`)."""
    from stealth_eval import stream as D     # the token stream: where each pass and its head product are made
    from stealth_eval.core import write_jsonl
    from stealth_eval.detectors import panel_use, run_detectors_stage, score_texts_windows
    from stealth_eval.stream import PASSES, fetch_lm_uses
    from stealth_eval.ghostbuster import token_logprobs, token_logprobs_use
    out = tmp_path / "run"
    texts = [" ".join(WORDS[i:i + k]) for i, k in ((0, 30), (4, 36), (9, 41), (1, 25))]
    write_jsonl(out / "raw_outputs.jsonl", [
        {"sample_id": f"s{i}", "dataset": "toy", "label": "ai", "domain": "news", "generator": "g", "method": "m0",
         "setting": "", "defense": "none", "condition": "m0", "candidate_rank": 0, "text_out": t, "valid": True,
         "fail_reason": ""} for i, t in enumerate(texts)])
    dets = ["log_likelihood", "log_rank", "fast_detectgpt", "dna_detectllm_single", "lastde", "lastde_pp"]
    cfg = {**_cfg(sharp["path"]), "out_dir": str(out), "detectors": dets, "score_max_tokens": 64,
           "score_windows": {}, "datasets": []}
    ident = sharp["lm"].identity
    mine = lambda: {k: v for k, v in PASSES.items() if k[0] == ident}
    before = mine()
    calls = {"pass": 0, "head": 0}
    lm_logits, getitem = D.lm_logits, D.HeadLogits.__getitem__
    monkeypatch.setattr(D, "lm_logits", lambda *a: (calls.__setitem__("pass", calls["pass"] + 1), lm_logits(*a))[1])
    monkeypatch.setattr(D.HeadLogits, "__getitem__", lambda self, k: (calls.__setitem__("head", calls["head"] + 1), getitem(self, k))[1])
    scores = run_detectors_stage(cfg, Cache(tmp_path / "store")).set_index(["detector_name", "sample_id"])
    grown = {k: v - before.get(k, 0) for k, v in mine().items() if v != before.get(k, 0)}
    assert sorted(grown.values()) == [1] * len(texts), grown            # one pass per text, whatever reads it
    assert calls["pass"] >= 1 and calls["head"] == calls["pass"], calls   # and one head product per batch, for every reader
    monkeypatch.undo()
    # each detector's value as its computation alone gives it
    alone = score_texts_windows(texts, sharp["path"], cfg, Cache(tmp_path / "a"), [64, 128])
    lst = lastde_scores(texts, cfg, Cache(tmp_path / "b"), 128)
    for i, t in enumerate(texts):
        h = sha256_text(t)
        assert scores.loc[("log_likelihood", f"s{i}"), "detector_score_raw"] == alone[64][h]["ll"]
        assert scores.loc[("fast_detectgpt", f"s{i}"), "detector_score_raw"] == alone[128][h]["fdg"]
        assert scores.loc[("dna_detectllm_single", f"s{i}"), "detector_score_raw"] == alone[128][h]["dna_detectllm"]
        assert scores.loc[("lastde_pp", f"s{i}"), "detector_score_raw"] == lst[h]["lastde_pp"]
    # Ghostbuster's stream reads the document start, then the text: the very sequence the panel reads when the tokenizer
    # adds that start itself (Gemma's BOS), so one pass serves both; without it (this tokenizer), a pass each
    import shutil
    from tokenizers.processors import TemplateProcessing
    from transformers import AutoTokenizer
    bos = Path(shutil.copytree(sharp["path"], tmp_path / "bos_lm"))
    tok = AutoTokenizer.from_pretrained(bos)
    tok._tokenizer.post_processor = TemplateProcessing(single="<s> $A", special_tokens=[("<s>", tok.bos_token_id)])
    tok.save_pretrained(bos)
    for path, n_seqs in ((str(bos), len(texts)), (sharp["path"], 2 * len(texts))):
        before = dict(PASSES)
        c = Cache(tmp_path / f"c{n_seqs}")
        pu, gu = panel_use(texts, path, cfg, c, [64])[0], token_logprobs_use(texts, path, cfg, c, 64)[0]
        both = fetch_lm_uses(path, cfg, c, [pu, gu])
        grown = {k: v - before.get(k, 0) for k, v in PASSES.items() if v != before.get(k, 0)}
        assert len({tuple(s) for u in (pu, gu) for s in u.seqs.values()}) == n_seqs
        assert len(grown) == n_seqs and set(grown.values()) == {1}, (path, grown)
        gb = token_logprobs(texts, path, cfg, Cache(tmp_path / f"d{n_seqs}"), 64)
        assert all(both[1][h] == {k: v for k, v in gb[h].items() if k != "n_tokens_input"} for h in gb)
