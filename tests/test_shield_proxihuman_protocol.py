"""SHIELD's and ProxiHuman's protocols as their papers state them (issue 26, items 2 and 4), on tiny local models.

- SHIELD §3.2.1: RMM takes the masked LM's top candidate that differs from the original, whatever the MI ranker's
  vocabulary; AWS takes argmax MI_H over the MLM's own list (Eq. 4). The paper's masked LM, Longformer-base-4096
  (App. B), is exercised on a tiny random `LongformerForMaskedLM` (real architecture, local attention windows).
- Statistical Turing test §4.1: ProxiHuman masks 10% of the tokens (single words here), fills with T5-large and
  embeds with MPNet; its own settings, cache keys that follow them, and a sentence-transformers embedder read as its
  authors encode (checked against `SentenceTransformer.encode`).
"""
import math
import random

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from stealth_eval import perturbation as pt
from stealth_eval.core import Cache, sha256_text, write_jsonl
from stealth_eval.humanify import MIRanker, MaskedInfill, content_spans, is_content_word, method_shield, word_spans
from stealth_eval.models import make_tiny_lm

from test_humanify import AI_WORDS, FILL, HUMAN_WORDS, _doc   # the same toy vocabulary as the SHIELD tests


def _train_records():
    rng = random.Random(0)
    out = []
    for i in range(12):
        out.append({"id": f"a{i}", "label": "ai", "text": _doc(rng, AI_WORDS), "domain": "toy", "generator": "toy"})
        out.append({"id": f"h{i}", "label": "human", "text": _doc(rng, HUMAN_WORDS), "domain": "toy", "generator": "toy"})
    return out


def _tiny_longformer(folder, boost: str | None = None, n_pos: int = 66, seed: int = 0):
    "A tiny random LongformerForMaskedLM (2 layers, windows of 8) with a word-level RoBERTa-style tokenizer."
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import LongformerConfig, LongformerForMaskedLM, PreTrainedTokenizerFast
    words = sorted(set(FILL + AI_WORDS + HUMAN_WORDS + ["new", "zebra"]))
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3, "<mask>": 4, **{w: i + 5 for i, w in enumerate(words)}}
    t = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    t.post_processor = processors.TemplateProcessing(single="<s> $A </s>", special_tokens=[("<s>", 0), ("</s>", 2)])
    tok = PreTrainedTokenizerFast(tokenizer_object=t, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>",
                                  mask_token="<mask>", cls_token="<s>", sep_token="</s>")
    torch.manual_seed(seed)
    cfg = LongformerConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=64, max_position_embeddings=n_pos, attention_window=[8, 8], pad_token_id=1,
                           bos_token_id=0, eos_token_id=2, sep_token_id=2, type_vocab_size=1)
    m = LongformerForMaskedLM(cfg).eval()
    if boost:   # the masked LM's first choice everywhere: a word no training text contains
        with torch.no_grad(): m.lm_head.bias[vocab[boost]] += 50.0
    m.save_pretrained(folder, safe_serialization=True)
    tok.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("shield_protocol")
    write_jsonl(root / "run" / "data" / "toy.train.jsonl", _train_records())
    return {"root": root, "out": str(root / "run"), "lm": str(make_tiny_lm(root / "lm")),
            "zebra": str(_tiny_longformer(root / "lf-zebra", boost="zebra")), "plain": str(_tiny_longformer(root / "lf-plain", seed=3))}


def _cfg(env, mlm, **shield):
    return {"seed": 0, "out_dir": env["out"], "device": "cpu", "shield_mlm": mlm, "shield_infill_lm": env["lm"],
            "shield": {"random_p": [], "swap_p": [], "rounds": [], **shield}}


def _item(n=60, seed=1):
    rng = random.Random(seed)
    return {"id": f"x{seed}", "dataset": "toy", "label": "ai", "text": _doc(rng, AI_WORDS + HUMAN_WORDS + ["new"], n)}


def _changed(src, out):
    return [(a[2], b[2]) for a, b in zip(word_spans(src), word_spans(out)) if a[2] != b[2]]


# ---------------------------------------------------------------- SHIELD: candidates from the masked LM alone

def test_random_mutation_takes_a_proposal_outside_the_ranker_vocabulary(env):
    "§3.2.1: the MLM's first candidate (zebra, in no training text) replaces every masked word."
    assert "zebra" not in MIRanker.fit(_train_records()).df
    it = _item()
    out = method_shield([it], _cfg(env, env["zebra"], random_p=[0.3]), Cache(enabled=False))[0][0]
    assert out["setting"] == "strategy=random,p=0.3,infill=lf-zebra"
    ch = _changed(it["text"], out["candidates"][0]["text"])
    assert len(ch) == math.floor(0.3 * len(content_spans(it["text"]))) > 0
    assert {b.lower() for _, b in ch} == {"zebra"}
    assert out["candidates"][0]["facts"]["candidate_vocab"] == "mlm"


def test_ai_swap_picks_the_human_word_of_the_mlm_list_and_training_restriction_is_opt_in(env):
    r = MIRanker.fit(_train_records())
    it = _item(seed=2)
    cfg = _cfg(env, env["zebra"], swap_p=[0.2])
    aws = method_shield([it], cfg, Cache(enabled=False))[0][0]
    ch = _changed(it["text"], aws["candidates"][0]["text"])
    assert ch and all(r.assoc.get(b.lower()) == "human" for _, b in ch)           # Eq. 4: argmax MI_H over the list
    best = max(r.mi_human(w) for w in HUMAN_WORDS)                                 # every list holds every H word here
    assert all(r.mi_human(b) == best or r.mi_human(a) == best for a, b in ch)
    # the project's old rule, now a setting: only training words, named in the setting
    cfg = _cfg(env, env["zebra"], random_p=[0.3], candidate_vocab="training")
    o = method_shield([it], cfg, Cache(enabled=False))[0][0]
    assert o["setting"] == "strategy=random,p=0.3,infill=lf-zebra,candidates=training"
    ch = _changed(it["text"], o["candidates"][0]["text"])
    assert ch and all(b.lower() in r.df for _, b in ch) and not any(b.lower() == "zebra" for _, b in ch)


# ---------------------------------------------------------------- SHIELD: Longformer as the masked LM

def _slow_candidates(folder, text, spans, k):
    "The definition written out: the full model's logits at each <mask> (float64), content-word tokens by logit."
    from transformers import AutoModelForMaskedLM, AutoTokenizer
    tok, m = AutoTokenizer.from_pretrained(folder), AutoModelForMaskedLM.from_pretrained(folder).eval()
    parts, last = [], 0
    for s, e, _ in spans: parts += [text[last:s], tok.mask_token]; last = e
    ids = tok("".join(parts + [text[last:]]), return_tensors="pt").input_ids           # <s> ... </s>
    with torch.no_grad(): z = m(input_ids=ids).logits[0].double()
    pos = [i for i, t in enumerate(ids[0].tolist()) if t == tok.mask_token_id]
    words = {i: tok.decode([i]) for i in range(len(tok)) if i not in tok.all_special_ids}
    out = []
    for p, (_, _, w) in zip(pos, spans):
        ranked = sorted((i for i, s in words.items() if is_content_word(s) and s.isalpha() and s.lower() != w.lower()),
                        key=lambda i: (-float(z[p, i]), i))
        out.append([words[i] for i in ranked[:k]])
    return out


def test_longformer_infill_matches_the_full_model_and_its_position_limit(env):
    eng = MaskedInfill(env["plain"], device="cpu")
    assert type(eng.model).__name__ == "LongformerForMaskedLM" and eng.max_len == 64      # 66 positions less RoBERTa's offset of 2
    assert eng.identity.startswith("lf-plain@local:")
    long_pos = _tiny_longformer(env["root"] / "lf-4098", n_pos=4098)                    # the real model's position limit
    assert MaskedInfill(str(long_pos), device="cpu").max_len == 4096                     # read whole, not cut at 512
    a, b = _item(20, seed=5)["text"], _item(30, seed=6)["text"]                          # unequal lengths: Longformer pads to its window
    reqs = [(t, content_spans(t)[::3]) for t in (a, b)]
    got = eng.propose(reqs, 4, Cache(enabled=False))
    for (t, spans), g in zip(reqs, got):
        assert g == _slow_candidates(env["plain"], t, spans, 4)
    assert eng.propose(reqs[1:], 4, Cache(enabled=False)) == got[1:]                     # batch mates change nothing
    long = _item(150, seed=7)["text"]                                                   # longer than the model: windows
    spans = content_spans(long)[::7]
    lists = eng.propose([(long, spans)], 3, Cache(enabled=False))[0]
    assert len(lists) == len(spans) and all(len(c) == 3 for c in lists)


def test_paper_profile_uses_longformer_and_the_proxihuman_protocol():
    from stealth_eval.config import PROFILES
    from stealth_eval.schema import Settings
    paper = PROFILES["paper"]
    assert paper["shield_mlm"] == "allenai/longformer-base-4096"
    doc = Settings.__dataclass_fields__["shield_mlm"].metadata.get("doc", "") or str(Settings.__dataclass_fields__["shield_mlm"])
    assert "longformer-base-4096" in doc and "roberta-base" not in doc
    p = paper["perturbation"]
    assert (p["proxihuman_t5_model"], p["proxihuman_embedder"]) == ("t5-large", "sentence-transformers/all-mpnet-base-v2")
    assert (p["proxihuman_pct_masked"], p["proxihuman_span_length"]) == (0.1, 1)
    assert paper["embedder"] == "intfloat/e5-base-v2"                                   # similarity keeps E5
    assert pt.proxihuman_embedder({**paper.to_dict()}) == "sentence-transformers/all-mpnet-base-v2"
    assert PROFILES["embedded"]["perturbation"]["proxihuman_embedder"] is None


# ---------------------------------------------------------------- ProxiHuman: its own perturbations

@pytest.mark.parametrize("n", [20, 37, 60, 213])
def test_proxihuman_masks_ten_percent_of_single_words(n):
    text = " ".join(f"w{i}" for i in range(n))
    m = pt.masking(pt.PERTURBATION_DEFAULTS, "proxihuman")
    for seed in range(3):
        toks = pt.mask_spans(text, m["span_length"], m["pct_words_masked"], m["buffer_size"], seed)
        assert len(toks) == n and sum(t is pt.MASK for t in toks) == math.floor(0.1 * n)   # one word per mask
    g = pt.masking(pt.PERTURBATION_DEFAULTS, "detectgpt")
    d = pt.mask_spans(text, g["span_length"], g["pct_words_masked"], g["buffer_size"], 0)
    assert sum(t is pt.MASK for t in d) == int(0.3 * n / 4)                                 # DetectGPT's rule unchanged


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("proxi")
    return {"lm": str(make_tiny_lm(d / "lm")), "t5": str(pt.make_tiny_t5(d / "t5")), "t5b": str(pt.make_tiny_t5(d / "t5b", seed=1)),
            "st": str(_tiny_sentence_transformer(d)), "d": d}


def _pcfg(tiny, **pert):
    return {"scoring_model": tiny["lm"], "embedder": "all-minilm-l6-v2", "device": "cpu", "trust_remote_code": False,
            "score_max_tokens": 64, "seed": 0,
            "perturbation": {"n_perturbations": 3, "infill_model": tiny["lm"], "t5_model": tiny["t5"], "t5_max_length": 40, **pert}}


TEXT = ("the police said the fire was under control and the minister said the news today was that the government "
        "and the people of the year said it was from the police")


def test_proxihuman_perturbations_have_their_own_cache_keys(tiny, tmp_path):
    cache = Cache(tmp_path / "store")
    miss = lambda: cache.misses.get("perturbation", 0)
    def run(cfg, stat):
        before = miss(); pt.perturb_texts([TEXT], "t5", cfg, cache, stat); return miss() - before
    cfg = _pcfg(tiny)
    assert run(cfg, "proxihuman") == 3 and run(cfg, "proxihuman") == 0
    assert run(cfg, "detectgpt") == 3                                                    # other masks: not shared
    assert run(_pcfg(tiny, proxihuman_pct_masked=0.2), "proxihuman") == 3                 # the share is in the key
    assert run(_pcfg(tiny, proxihuman_span_length=2), "proxihuman") == 3                  # the span length too
    assert run(_pcfg(tiny, proxihuman_t5_model=tiny["t5b"]), "proxihuman") == 3           # ProxiHuman's own T5
    assert run(_pcfg(tiny, proxihuman_t5_model=tiny["t5b"], proxihuman_pct_masked=0.2), "detectgpt") == 0   # DetectGPT's untouched
    fid = pt.filler_identity("t5", _pcfg(tiny, proxihuman_t5_model=tiny["t5b"]), "proxihuman")
    assert fid.startswith("t5b@local:") and pt.filler_identity("t5", _pcfg(tiny), "detectgpt").startswith("t5@local:")


def _tiny_sentence_transformer(d):
    "A tiny random MPNet wrapped as a sentence-transformers model (mean pooling, normalisation), as all-mpnet-base-v2."
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer import modules as stm
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import MPNetConfig, MPNetModel, PreTrainedTokenizerFast
    words = sorted(set(FILL + AI_WORDS + HUMAN_WORDS + "fire under control new he has be are were".split()))
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3, **{w: i + 4 for i, w in enumerate(words)}, "<mask>": len(words) + 4}
    t = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    t.post_processor = processors.TemplateProcessing(single="<s> $A </s>", special_tokens=[("<s>", 0), ("</s>", 2)])
    tok = PreTrainedTokenizerFast(tokenizer_object=t, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>",
                                  mask_token="<mask>", cls_token="<s>", sep_token="</s>", model_max_length=64)
    torch.manual_seed(0)
    MPNetModel(MPNetConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                           intermediate_size=64, max_position_embeddings=66, pad_token_id=1)).save_pretrained(d / "mpnet")
    tok.save_pretrained(d / "mpnet")
    word = stm.Transformer(str(d / "mpnet"), max_seq_length=48)
    st = SentenceTransformer(modules=[word, stm.Pooling(word.get_embedding_dimension(), "mean"), stm.Normalize()], device="cpu")
    st.save(str(d / "tiny-mpnet-st"))
    return d / "tiny-mpnet-st"


def test_proxihuman_embeds_with_its_own_sentence_transformer(tiny, tmp_path):
    "The distance with `proxihuman_embedder` = Algorithm 1 written out on SentenceTransformer.encode's vectors (float64)."
    from sentence_transformers import SentenceTransformer
    cache = Cache(tmp_path / "store")
    cfg = _pcfg(tiny, proxihuman_k=2, proxihuman_embedder=tiny["st"])
    det = pt.PROXIHUMAN_LMINFILL
    got = det.compute([TEXT], cfg, cache)[sha256_text(TEXT)]
    P = pt.perturb_texts([TEXT], "lminfill", cfg, cache, "proxihuman")[sha256_text(TEXT)]
    pert = [t for t in P["perturbed"] if t]
    assert len(pert) >= 2 and got["n_perturbed"] == len(pert)
    E = SentenceTransformer(tiny["st"], device="cpu").encode([P["source"]] + pert, normalize_embeddings=True).astype(np.float64)
    d = sorted(1.0 - float(np.dot(E[0], e)) / (np.linalg.norm(E[0]) * np.linalg.norm(e)) for e in E[1:])
    assert abs(got["proxihuman"] - (d[0] + d[1]) / 2) <= 1e-5
    # the embedder and the filler are recorded in the detector's model identity, under the stand-in's own name
    ident = det.model(cfg)
    assert ident.startswith("tiny-mpnet-st@local:") and "/st-mean-pool" in ident and "| fill: lm@local:" in ident
    assert det.name == "proxihuman_lminfill" and det.source(cfg)[3] == tiny["st"]
    # the run's embedder when unset; another embedder is another cache entry
    before = cache.misses.get("proxihuman", 0)
    other = det.compute([TEXT], _pcfg(tiny, proxihuman_k=2), cache)[sha256_text(TEXT)]
    assert cache.misses.get("proxihuman", 0) == before + 1 and other["proxihuman"] != got["proxihuman"]
    assert det.model(_pcfg(tiny)).startswith("all-minilm-l6-v2@local:")


def test_a_non_mean_pooled_sentence_transformer_is_refused(tiny, tmp_path):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer import modules as stm
    word = stm.Transformer(str(tiny["d"] / "mpnet"), max_seq_length=48)
    SentenceTransformer(modules=[word, stm.Pooling(word.get_embedding_dimension(), "cls")], device="cpu").save(str(tmp_path / "cls-st"))
    from stealth_eval.core import StealthEvalError
    with pytest.raises(StealthEvalError, match="pools by 'cls'"):
        pt.load_proxihuman_embedder(str(tmp_path / "cls-st"), {"device": "cpu"})
