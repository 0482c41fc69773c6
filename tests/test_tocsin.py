"""TOCSIN (nbs/29_tocsin) against the reference's definitions written out here.

The reference (Shixuan-Ma/TOCSIN at 1aa07ad): TOCSIN.py fill_and_mask / apply_extracted_fills (the copies),
bart_score.py BARTScorer.score (BART's mean token loss of the text given a copy, negated) and get_score (the
combinations with a base detector). BART is a tiny random one built here from BART's configuration (real architecture,
its byte-level BPE tokenizer): no model is downloaded. BART missing offline: skipped with the reason.
"""
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from stealth_eval.components import DETECTORS
from stealth_eval.core import Cache, ComponentUnavailable, sha256_text
from stealth_eval.detectors import panel_reference
from stealth_eval.models import load_causal_lm, make_tiny_lm
from stealth_eval.stream import log_softmax_list
from stealth_eval.tocsin import TOCSIN_BASES, bart_scores, delete_words, make_tiny_bart, text_copies, tocsin_bart

WORDS = ("the police said alpha fire was under control and zeta people were at the omicron news today upsilon gamma "
         "minister two").split()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("tocsin")
    make_tiny_bart(d / "bart"); make_tiny_lm(d / "lm")
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer
    return {"bart": str(d / "bart"), "lm": str(d / "lm"), "tok": AutoTokenizer.from_pretrained(d / "bart"),
            "model": AutoModelForSeq2SeqLM.from_pretrained(d / "bart").eval()}


def _cfg(tiny, **kw):
    return {"scoring_model": tiny["lm"], "device": "cpu", "trust_remote_code": False, "seed": 0, "score_windows": {},
            "score_batch_tokens": 256, "score_bucket_tokens": 32, "tocsin": {"bart_model": tiny["bart"]}, **kw}


def fill_and_mask_restated(text, pct, rs):
    "TOCSIN.py fill_and_mask + apply_extracted_fills on one text, its np.random calls made on `rs`."
    tokens = text.split(" ")
    idx = rs.choice(range(len(tokens)), size=int(pct * len(tokens))).tolist()
    for i in idx: tokens[i] = ""
    return " ".join(tokens)


def bart_score_restated(model, tok, srcs, tgt):
    "BARTScorer.score one source at a time, float64 log-softmax of the float32 logits: -(sum of NLL over the target / its length)."
    y = tok([tgt], max_length=1024, truncation=True, return_tensors="pt")["input_ids"]
    out = []
    for s in srcs:
        x = tok([s], max_length=1024, truncation=True, return_tensors="pt")["input_ids"]
        with torch.no_grad(): z = model(input_ids=x, labels=y).logits[0].double()
        out.append(-sum(-log_softmax_list(z[t].tolist())[int(y[0, t])] for t in range(y.shape[1])) / y.shape[1])
    return out


def get_score_restated(base, st, s):
    "TOCSIN.py get_score's branches, the log-rank as the reference's get_logrank returns it (minus the mean log-rank)."
    log_rank_x = -st["logrank"]
    return {"Fast": st["fdg"] * math.pow(math.e, -s), "lrr": (st["ll"] / log_rank_x) * math.pow(math.e, -s),
            "likelihood": st["ll"] * math.pow(math.e, s), "logrank": log_rank_x * math.pow(math.e, s), "standalone": -s}[base]


def test_copies_are_the_reference_deletions():
    text = " ".join(WORDS * 10)                                  # 200 words: 3 draws a copy
    rs_a, rs_b = np.random.RandomState(7), np.random.RandomState(7)
    for _ in range(10): assert delete_words(text, 0.015, rs_a) == fill_and_mask_restated(text, 0.015, rs_b)
    cps = text_copies(text, 10, 0.015, seed=3)
    assert len(set(cps)) > 1 and all(c.split(" ").count("") in (1, 2, 3) for c in cps)   # drawn with replacement
    assert cps == text_copies(text, 10, 0.015, seed=3) and cps != text_copies(text, 10, 0.015, seed=4)
    short = " ".join(WORDS[:20] * 3)                             # 60 words: int(0.9) = 0, the copies are the text
    assert text_copies(short, 10, 0.015, 0) == [short] * 10


def test_bart_score_equals_the_restatement_on_padded_copies(tiny):
    text = " ".join(WORDS * 5)
    cps = text_copies(text, 10, 0.015, 0)
    assert len({len(tiny["tok"](c).input_ids) for c in cps}) > 1          # the batch is padded
    got = bart_scores(tiny["model"], tiny["tok"], cps, text)
    ref = bart_score_restated(tiny["model"], tiny["tok"], cps, text)
    assert max(abs(a - b) for a, b in zip(got, ref)) < 1e-6 and all(v < 0 for v in got)


def test_five_detectors_equal_get_score_and_a_text_alone(tiny, tmp_path):
    texts = [" ".join(WORDS * 5), " ".join(WORDS[3:] * 6), "fire"]
    store = Cache(tmp_path / "c")
    got = DETECTORS.get("tocsin").compute(texts, _cfg(tiny), store)
    lm = load_causal_lm(tiny["lm"], device="cpu")
    for t in texts[:2]:
        s = float(np.mean(bart_score_restated(tiny["model"], tiny["tok"], text_copies(t, 10, 0.015, 0), t)))
        st = panel_reference(lm, t)
        for name, (base, _) in TOCSIN_BASES.items():
            want = get_score_restated(base, st, s)
            assert abs(got[sha256_text(t)][name] - want) <= 1e-6 * max(1.0, abs(want)), (name, got[sha256_text(t)][name], want)
    assert got[sha256_text("fire")] is None                          # one token: nothing to score, no BART either
    alone = DETECTORS.get("tocsin_lrr").compute(texts[1:2], _cfg(tiny), Cache(tmp_path / "d"))
    assert alone[sha256_text(texts[1])] == got[sha256_text(texts[1])]
    DETECTORS.get("tocsin_standalone").compute(texts, _cfg(tiny), store)      # all read back from the cache
    assert store.stats()["tocsin_bart"] == {"hits": 2, "misses": 2}


def test_skipped_with_the_reason_where_bart_is_missing(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = _cfg(tiny, tocsin={"bart_model": "facebook/bart-base"})
    why = DETECTORS.get("tocsin").unavailable(cfg)
    assert "facebook/bart-base" in why and "tocsin.bart_model" in why and "offline" in why
    assert DETECTORS.get("tocsin").unavailable(_cfg(tiny)) == ""       # a local BART folder
    with pytest.raises(ComponentUnavailable, match="bart-base"):
        tocsin_bart([" ".join(WORDS * 4)], cfg, Cache(tmp_path / "c"))


def test_registered_and_configurable():
    from stealth_eval.config import resolve_config
    from stealth_eval.schema import SettingsError
    for name in TOCSIN_BASES:
        d = DETECTORS.get(name)
        assert d.direction == 1 and not d.supervised and not d.needs_train_split and "Shixuan-Ma/TOCSIN" in d.reference
    c = resolve_config("embedded", detectors=list(TOCSIN_BASES), overrides={"tocsin.n_copies": 4, "score_windows": {"tocsin": 256, "tocsin_lrr": 256}})
    assert c["tocsin"]["n_copies"] == 4 and c["tocsin"]["rate"] == 0.015 and c["tocsin"]["bart_model"] == "facebook/bart-base"
    assert DETECTORS.get("tocsin").source(c) == DETECTORS.get("tocsin_lrr").source(c)        # one computation
    for bad in ({"tocsin.rate": 1.5}, {"tocsin.dtype": "int8"}, {"tocsin.n_copies": 0}):
        with pytest.raises(SettingsError):
            resolve_config("embedded", detectors=["tocsin"], overrides=bad)
