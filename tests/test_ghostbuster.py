"""Ghostbuster with local LMs (stealth_eval.ghostbuster): the feature vector against a float64 computation written out,
training on a separable set, the skip without a training split, and the command line's view of it. Tiny models only."""
import math
import re
from collections import Counter, defaultdict

import numpy as np
import pytest
import torch

import stealth_eval.ghostbuster as gb
from stealth_eval.core import Cache, StealthEvalError, sha256_text
from stealth_eval.models import make_tiny_lm

from conftest import run_cli

CORPUS = ("the police said the fire was in the news today", "the minister said the government has two more people",
          "people were at the fire and police said it was new", "he said the year was new for the government")


def make_char_lm(folder, seed: int = 3):
    "A tiny random llama whose tokenizer reads one byte-level character per token (the scoring LM's reads words)."
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
    chars = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {"<unk>": 0, "<|endoftext|>": 1, "<pad>": 2, **{c: i + 3 for i, c in enumerate(chars)}}
    t = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok = PreTrainedTokenizerFast(tokenizer_object=t, eos_token="<|endoftext|>", pad_token="<pad>", unk_token="<unk>")
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=512, bos_token_id=1, eos_token_id=1, pad_token_id=2)
    LlamaForCausalLM(cfg).save_pretrained(folder, safe_serialization=True)
    tok.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def lms(tmp_path_factory):
    d = tmp_path_factory.mktemp("gb_models")
    return {"score": str(make_tiny_lm(d / "score", seed=1)), "weak": str(make_char_lm(d / "weak"))}


@pytest.fixture
def toy_corpus(monkeypatch):
    monkeypatch.setattr(gb, "corpus_documents", lambda name: CORPUS)
    gb._NGRAMS.clear()
    yield
    gb._NGRAMS.clear()


# ---------------------------------------------------------------- the definition written out, float64

def lm_logprobs_reference(folder, text, start):
    "log p of each token after `start` and the tokens before it: float64 weights, one position at a time."
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(folder)
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    seq = [start] + enc.input_ids
    m = AutoModelForCausalLM.from_pretrained(folder).double().eval()
    with torch.no_grad(): z = m(torch.tensor([seq])).logits[0]
    return enc.input_ids, [e for _, e in enc.offset_mapping], [float(torch.log_softmax(z[i], -1)[seq[i + 1]]) for i in range(len(seq) - 1)]


def ngram_reference(docs, V, q, delta=0.9):
    "utils/n_gram.py's TrigramBackoff over dictionaries (first two tokens after two never-seen separators)."
    pred, c2, c3 = defaultdict(set), defaultdict(Counter), defaultdict(Counter)
    for d in docs:
        for i in range(1, len(d)): pred[d[i]].add(d[i - 1]); c2[(d[i - 1],)][d[i]] += 1
        for i in range(2, len(d)): c3[(d[i - 2], d[i - 1])][d[i]] += 1
    tot = sum(len(s) for s in pred.values())
    p1 = lambda w: len(pred[w]) / tot if pred[w] else 1 / V
    def back(c, ctx, w, lower):
        n = sum(c[ctx].values())
        return lower if n == 0 else delta * len(c[ctx]) / n * lower + max(c[ctx][w] - delta, 0) / n
    p2 = lambda a, b: back(c2, (a,), b, p1(b))
    padded = [-1, -1] + list(q)
    return [back(c3, tuple(padded[i:i + 2]), padded[i + 2], p2(padded[i + 1], padded[i + 2])) for i in range(len(q))], [p1(w) for w in q]


def expression_reference(expr, st):
    """One expression over python lists, by the reference's rules: a comparison gives booleans, and a division writes
    into a value of its numerator's type (`np.zeros_like(a)`, casting="unsafe"), so a boolean divided stays boolean."""
    ops = {"v-add": lambda a, b: a + b, "v-sub": lambda a, b: a - b, "v-mul": lambda a, b: a * b,
           "v-div": lambda a, b: type(a)(a / b) if b != 0 else type(a)(0), "v->": lambda a, b: a > b, "v-<": lambda a, b: a < b}
    w = expr.split(" ")
    cur = [float(x) for x in st[w[0]]]
    for i in range(1, len(w) - 1, 2): cur = [ops[w[i]](a, b) for a, b in zip(cur, st[w[i + 1]])]
    cur = [float(x) for x in cur]
    mean = sum(cur) / len(cur)
    top = sorted(cur, reverse=True)[:25]
    return {"s-max": max(cur), "s-min": min(cur), "s-avg": mean, "s-avg-top-25": sum(top) / len(top), "s-len": float(len(cur)),
            "s-var": sum((x - mean) ** 2 for x in cur) / len(cur), "s-l2": math.sqrt(sum(x * x for x in cur))}[w[-1]]


def handcrafted_reference(st, word_lens):
    out = []
    for v in ([a - b for a, b in zip(st["scoring"], st["weak"])], list(word_lens)):
        v = sorted(v, reverse=True) + [0.0] * max(0, 50 - len(v))
        out += [sum(v[:25]) / 25, sum(v[25:]) / len(v[25:])]
    return out


@pytest.mark.parametrize("window", [64, 6])
def test_feature_vector_equals_float64_written_out(lms, toy_corpus, tmp_path, window):
    from transformers import AutoTokenizer
    text = "the police said the minister was at the fire today and news people were there"
    cfg = {"device": "cpu", "dtype": "float32", "attn_implementation": "eager", "trust_remote_code": False,
           "score_max_tokens": window, "score_batch_tokens": 256, "score_bucket_tokens": 16, "scoring_model": lms["score"],
           "ghostbuster_local": {"weak_model": lms["weak"]}}
    st = gb.text_streams([text, "news"], cfg, Cache(tmp_path / "c"))[sha256_text(text)]
    # scoring LM: word tokens after </s> (the tiny tokenizer adds no BOS and has no <|endoftext|>)
    ids, ends, lp = lm_logprobs_reference(lms["score"], text, 2)
    ids, ends, lp = ids[:window], ends[:window], lp[:window]
    doc = text[:ends[-1]]
    # weak LM: byte-level characters of the same characters after its <|endoftext|>, each added to the first word ending at or after it
    _, w_ends, w_lp = lm_logprobs_reference(lms["weak"], doc, 1)
    weak = [0.0] * len(ids)
    for e, x in zip(w_ends, w_lp):
        j = next((j for j, s in enumerate(ends) if s >= e), len(ends) - 1)
        weak[j] += x
    stok = AutoTokenizer.from_pretrained(lms["score"])
    tri, uni = ngram_reference(stok(list(CORPUS), add_special_tokens=False).input_ids, len(stok), ids)
    ref = {"scoring": [math.exp(x) for x in lp], "weak": [math.exp(x) for x in weak], "trigram": tri, "unigram": uni}
    for k in ref: np.testing.assert_allclose(st[k], ref[k], rtol=0, atol=1e-6)
    assert st["n_tokens_input"] == 15 and st["truncated"] == (window < 15)
    exprs = gb.expressions(2)
    got = gb.featurize([st], exprs)[0]
    want = handcrafted_reference(ref, []) + [expression_reference(e, ref) for e in exprs]   # word tokens carry no space marker
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------- training

def constructed_streams(i, ai):
    r = np.random.default_rng(i)
    n = 30 + i % 7
    sc = r.uniform(0.3, 0.9, n) if ai else r.uniform(0.01, 0.45, n)
    return {"scoring": sc, "weak": sc * r.uniform(0.5, 1.0, n), "trigram": r.uniform(1e-4, 1e-2, n),
            "unigram": r.uniform(1e-5, 1e-3, n), "word_lengths": r.integers(1, 4, n // 3).astype(float)}


def test_training_on_a_separable_set_reaches_auroc_1_and_is_deterministic():
    from sklearn.metrics import roc_auc_score
    from stealth_eval.supervised import predict_logistic
    opts = gb.ghostbuster_opts({})
    assert (opts["max_depth"], opts["folds"], opts["C"]) == (3, 8, 10.0)        # the reference's values
    y = [i % 2 for i in range(32)]
    tr = [constructed_streams(i, a) for i, a in enumerate(y)]
    fit = gb.fit_ghostbuster(tr, y, opts, seed=0)
    assert fit["selection"]["n_expressions"] == 2534 and fit["selection"]["features"]
    assert fit["selection"]["trace"][-1]["cv_balanced_accuracy"] == 1.0
    ev_y = [i % 2 for i in range(20)]
    ev = [constructed_streams(1000 + i, a) for i, a in enumerate(ev_y)]
    for s, lab in ((tr, y), (ev, ev_y)):
        p = predict_logistic(fit["model"], gb.featurize(s, fit["selection"]["features"]))
        assert roc_auc_score(lab, p) == 1.0
    assert gb.fit_ghostbuster(tr, y, opts, seed=0) == fit                      # same seed: the same fit, bit for bit
    cal = gb.fit_ghostbuster(tr, y, {**opts, "max_depth": 2, "calibration": "sigmoid-cv5"}, seed=0)   # the reference's wrapper
    assert len(cal["model"]["folds"]) == 5
    assert roc_auc_score(ev_y, gb.predict_model(cal["model"], gb.featurize(ev, cal["selection"]["features"]))) == 1.0


def test_selection_refuses_a_class_too_small_to_fold():
    with pytest.raises(StealthEvalError, match="smaller class"):
        gb.select_features(np.random.default_rng(0).normal(size=(5, 3)), [0, 0, 0, 0, 1], ["a", "b", "c"])


def test_skipped_with_reason_without_a_training_split(lms, tmp_path):
    cfg = {"out_dir": str(tmp_path), "datasets": [{"name": "toy", "path": None}], "scoring_model": lms["score"],
           "ghostbuster_local": {"weak_model": lms["weak"]}}
    assert "no training split" in gb.GHOSTBUSTER_LOCAL.unavailable(cfg)


# ---------------------------------------------------------------- command line and settings

def test_listed_and_its_settings_checked():
    from stealth_eval.config import resolve_config
    from stealth_eval.schema import SettingsError
    out = run_cli("--list", timeout=300).stdout
    row = next(l for l in out.splitlines() if l.strip().startswith("ghostbuster_local"))
    assert "classifier" in row and "higher = AI" in row and "Verma et al." in row
    cfg = resolve_config("embedded", detectors=["ghostbuster_local"])
    assert cfg.detectors == ["ghostbuster_local"] and cfg.ghostbuster_local.weak_model == "smollm2-135m-instruct"
    assert resolve_config("embedded", overrides={"ghostbuster_local.max_depth": 4}).ghostbuster_local.max_depth == 4   # train.py's search
    for bad in ({"ghostbuster_local.folds": 1}, {"ghostbuster_local.max_depth": 5}, {"ghostbuster_local.corpus": "brown"},
                {"ghostbuster_local.calibration": "isotonic"}):
        with pytest.raises((SettingsError, StealthEvalError)):
            resolve_config("embedded", detectors=["ghostbuster_local"], overrides=bad)


def test_every_depth3_expression_follows_the_reference_rule_comparison_then_division_included():
    """All 2,534 expressions of depth 3 on constructed streams against the written-out reference rule; the 252 chains
    that divide a comparison's mask (`v->`/`v-<` then `v-div`) are among them, and they are boolean, not quotients."""
    r = np.random.default_rng(3)
    st = {v: list(r.uniform(0.01, 0.9, 40)) for v in gb.VECTORS}
    st["trigram"][5] = 0.0                                    # a zero divisor: the reference's where= keeps 0 there
    exprs = gb.expressions(3)
    got = gb.feature_matrix(exprs, [st])[0]
    want = [expression_reference(e, st) for e in exprs]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    masked = [i for i, e in enumerate(exprs) if re.search(r"v-[<>] \S+ v-div", e)]
    assert len(masked) == 252
    assert set(np.unique(got[[i for i in masked if exprs[i].endswith("s-max")]])) <= {0.0, 1.0}
    e = "weak v-> scoring v-div trigram s-max"
    assert got[exprs.index(e)] == 1.0                         # a float quotient would be 1 / min(trigram) > 1
