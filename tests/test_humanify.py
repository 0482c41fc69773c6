"""SHIELD humanification (MI ranker, RMM / AWS / RHL) and APT-Eval polishing, on tiny models built in the test
(a random llama with a word-level tokenizer, a random RoBERTa masked LM), plus one check on the real SmolLM2."""
import math
import random

import pytest

from stealth_eval.core import Cache, ComponentUnavailable, write_jsonl
from stealth_eval.humanify import (POLISH_SYSTEM, MIRanker, content_spans, document_frequencies, humanify,
                                   is_content_word, method_polish, method_shield, mutual_information, polish_prompt,
                                   word_spans)
from stealth_eval.models import make_tiny_lm

# content words that the tiny LM's word-level vocabulary knows (sklearn counts "fire" as a stopword)
AI_WORDS = ["government", "minister", "news", "today"]
HUMAN_WORDS = ["police", "people", "year", "said"]
FILL = "the a of to and in is was for on that with as by at from it".split()


def _doc(rng, words, n=14):
    return " ".join(rng.choice(words) if i % 2 else rng.choice(FILL) for i in range(n))


def _train_records():
    "AI texts use the AI words (plus 'new' once in a while), human texts the human words: a clear split."
    rng = random.Random(0)
    recs = []
    for i in range(12):
        recs.append({"id": f"a{i}", "label": "ai", "text": _doc(rng, AI_WORDS + ["new"] * (i % 3 == 0)), "domain": "toy", "generator": "toy"})
        recs.append({"id": f"h{i}", "label": "human", "text": _doc(rng, HUMAN_WORDS), "domain": "toy", "generator": "toy"})
    return recs


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("humanify")
    lm = make_tiny_lm(root / "lm")
    write_jsonl(root / "run" / "data" / "toy.train.jsonl", _train_records())
    return {"root": root, "lm": str(lm), "out": str(root / "run")}


def _cfg(env, **shield):
    return {"seed": 0, "out_dir": env["out"], "device": "cpu", "shield_mlm": None, "shield_infill_lm": env["lm"],
            "shield": {"random_p": [], "swap_p": [], "rounds": [], **shield}}


def _long_item(n=240, seed=1):
    rng = random.Random(seed)
    return {"id": f"long{seed}", "dataset": "toy", "label": "ai", "text": _doc(rng, AI_WORDS + HUMAN_WORDS + ["new"], n)}


def _facts(out, setting_prefix):
    return [o["candidates"][0]["facts"] for o in out if o["setting"].startswith(setting_prefix)]


# ---------------------------------------------------------------- the MI ranker

def test_mi_on_a_toy_corpus_matches_a_hand_computation():
    docs = {"ai": ["we delve into the tapestry", "let us delve deeper", "a tapestry of ideas", "the police report"],
            "human": ["cops said the blaze was out", "the blaze was out by noon", "blaze at the pub", "police said noon"]}
    recs = [{"label": lab, "text": t} for lab, ts in docs.items() for t in ts]
    r = MIRanker.fit(recs, alpha=1.0)
    assert r.df["delve"] == [0, 2] and r.df["blaze"] == [3, 0] and r.df["police"] == [1, 1]
    # Eq. 1 by hand: N = 8, P(ai) = P(human) = 1/2; "delve": P(w) = 2/8, P(ai|w) = (2+1)/(2+2), P(human|w) = (0+1)/(2+2)
    delve = 2 / 8 * (3 / 4 * math.log((3 / 4) / 0.5) + 1 / 4 * math.log((1 / 4) / 0.5))
    # "blaze": P(w) = 3/8, P(human|w) = (3+1)/(3+2), P(ai|w) = (0+1)/(3+2)
    blaze = 3 / 8 * (4 / 5 * math.log((4 / 5) / 0.5) + 1 / 5 * math.log((1 / 5) / 0.5))
    assert abs(r.mi["delve"] - delve) < 1e-12 and abs(r.mi["blaze"] - blaze) < 1e-12
    assert abs(r.mi["police"]) < 1e-12                       # equally frequent: no information
    assert set(r.vocabulary("ai")) == {"delve", "tapestry", "let", "deeper", "ideas", "report"}
    assert r.vocabulary("human")[0] == "blaze" and "cops" in r.vocabulary("human") and "police" not in r.vocabulary("human")
    assert "the" not in r.df and "we" not in r.df             # stopwords never enter the vocabulary
    assert r.mi_ai("delve") > 0 and r.mi_human("delve") == 0 and r.mi_human("Blaze") == r.mi["blaze"]


def test_mi_is_nonnegative_and_grows_with_evidence():
    assert mutual_information(0, 10, 10, 10) > mutual_information(0, 5, 10, 10) > mutual_information(0, 1, 10, 10) > 0
    assert all(mutual_information(h, a, 10, 10) >= 0 for h in range(11) for a in range(11))


def test_ranker_written_with_the_run_and_cached(env):
    cache = Cache(env["root"] / "store_rank")
    method_shield([_long_item(60)], _cfg(env, random_p=[0.1]), cache)
    import json, pathlib
    saved = json.loads((pathlib.Path(env["out"]) / "models" / "shield_mi_toy.json").read_text())
    assert {w["word"] for w in saved["ai_top"]} >= set(AI_WORDS) and {w["word"] for w in saved["human_top"]} >= set(HUMAN_WORDS)
    assert saved["n_docs"] == {"human": 12, "ai": 12} and saved["alpha"] == 1.0
    method_shield([_long_item(60)], _cfg(env, random_p=[0.1]), cache)
    assert cache.stats()["shield_mi"] == {"hits": 1, "misses": 1}
    assert cache.stats()["shield_infill"] == {"hits": 1, "misses": 1}     # the rerun computes nothing


def test_no_training_split_is_a_skip_with_the_reason(env, tmp_path):
    cfg = {**_cfg(env, random_p=[0.1]), "out_dir": str(tmp_path)}
    with pytest.raises(ComponentUnavailable, match="no training split for toy"):
        method_shield([_long_item(60)], cfg, Cache(enabled=False))


# ---------------------------------------------------------------- the strategies

def test_random_mutation_edit_rate_follows_p(env):
    item = _long_item()
    n_s = len(content_spans(item["text"]))
    assert n_s >= 100
    ps = [0.05, 0.1, 0.3, 0.6]
    out = method_shield([item], _cfg(env, random_p=ps), Cache(enabled=False))[0]
    rates = [f["edit_rate_content"] for f in _facts(out, "strategy=random")]
    assert [o["setting"] for o in out] == [f"strategy=random,p={p:g},infill=causal_lm" for p in ps]
    assert rates == sorted(rates) and len(set(rates)) == len(rates)          # strictly monotone in p
    for p, f in zip(ps, _facts(out, "strategy=random")):
        assert f["n_masked"] == math.floor(p * n_s)
        assert abs(f["edit_rate_content"] - p) <= 1.0 / n_s + 1e-12          # ⌊p·|S|⌋ / |S|
        assert f["words_changed"] == f["n_masked"]                           # every masked word got a replacement


def test_ai_swap_targets_ai_words_and_picks_human_words(env):
    item = _long_item(seed=2)
    ps = [0.05, 0.1, 0.2, 0.4]
    out = method_shield([item], _cfg(env, swap_p=ps), Cache(enabled=False))[0]
    facts = _facts(out, "strategy=ai_swap")
    rates = [f["edit_rate_content"] for f in facts]
    assert rates == sorted(rates) and len(set(rates)) == len(rates)
    r = MIRanker.fit(_train_records())
    src = [w for *_, w in word_spans(item["text"])]
    n_ai_occ = sum(r.assoc.get(w.lower()) == "ai" for w in src)
    for p, o in zip(ps, out):
        new = [w for *_, w in word_spans(o["candidates"][0]["text"])]
        changed = [(a, b) for a, b in zip(src, new) if a != b]
        assert len(changed) == math.floor(p * len(content_spans(item["text"])))
        if len(changed) <= n_ai_occ:                                         # the most AI-associated words go first
            assert all(r.assoc.get(a.lower()) == "ai" for a, _ in changed)
        assert all(r.assoc.get(b.lower()) == "human" for _, b in changed)    # every candidate list holds an H word here
        assert o["candidates"][0]["facts"]["n_human_vocab_picks"] == len(changed)


def test_recursive_rounds_compound(env):
    item = _long_item(seed=3)
    n_s = len(content_spans(item["text"]))
    out = method_shield([item], _cfg(env, swap_p=[0.1], rounds=[1, 2, 3]), Cache(enabled=False))[0]
    aws = _facts(out, "strategy=ai_swap")[0]
    rhl = {f["rounds"]: f for f in _facts(out, "strategy=recursive")}
    assert [o["setting"] for o in out][1:] == [f"strategy=recursive,rounds={r},infill=causal_lm" for r in (1, 2, 3)]
    assert out[0]["candidates"][0]["text"] == out[1]["candidates"][0]["text"]   # R = 1 is AWS at p0 = 10%
    assert rhl[1]["words_changed"] < rhl[2]["words_changed"] < rhl[3]["words_changed"]
    assert rhl[3]["n_masked"] == 3 * math.floor(0.1 * n_s) and rhl[3]["words_changed"] <= rhl[3]["n_masked"]
    assert aws["words_changed"] == rhl[1]["words_changed"]


def test_stopwords_never_swapped_and_seeds_reproducible(env):
    item = _long_item(seed=4)
    cfg = _cfg(env, random_p=[0.5], swap_p=[0.5], rounds=[2])
    a = method_shield([item], cfg, Cache(enabled=False))[0]
    b = method_shield([item], cfg, Cache(enabled=False))[0]
    c = method_shield([item], {**cfg, "seed": 1}, Cache(enabled=False))[0]
    assert [o["candidates"][0]["text"] for o in a] == [o["candidates"][0]["text"] for o in b]
    assert a[0]["candidates"][0]["text"] != c[0]["candidates"][0]["text"]      # another seed masks other words
    src = word_spans(item["text"])
    for o in a:
        new = word_spans(o["candidates"][0]["text"])
        assert len(new) == len(src)
        for (_, _, x), (_, _, y) in zip(src, new):
            if not is_content_word(x): assert x == y
            if x != y: assert is_content_word(y)


def test_masked_lm_path_on_a_tiny_roberta(env, tmp_path):
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, RobertaConfig, RobertaForMaskedLM
    words = sorted(set(FILL + AI_WORDS + HUMAN_WORDS + ["new"]))
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3, "<mask>": 4, **{w: i + 5 for i, w in enumerate(words)}}
    t = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=t, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                  unk_token="<unk>", mask_token="<mask>", cls_token="<s>", sep_token="</s>")
    torch.manual_seed(0)
    cfg_m = RobertaConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                          intermediate_size=64, max_position_embeddings=66, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                          type_vocab_size=1)
    folder = tmp_path / "tiny-roberta"
    RobertaForMaskedLM(cfg_m).save_pretrained(folder)
    tok.save_pretrained(folder)
    item = _long_item(150, seed=5)                                          # longer than the model: windows
    n_s = len(content_spans(item["text"]))
    cfg = {**_cfg(env, random_p=[0.1, 0.3], swap_p=[0.1]), "shield_mlm": str(folder)}
    out = method_shield([item], cfg, Cache(enabled=False))[0]
    assert [o["setting"] for o in out] == ["strategy=random,p=0.1,infill=tiny-roberta", "strategy=random,p=0.3,infill=tiny-roberta",
                                           "strategy=ai_swap,p=0.1,infill=tiny-roberta"]
    f = [o["candidates"][0]["facts"] for o in out]
    assert f[0]["words_changed"] == math.floor(0.1 * n_s) and f[1]["words_changed"] == math.floor(0.3 * n_s)
    assert f[0]["infill_model"].startswith("tiny-roberta@local:")
    # safetensors only: the same weights as a pickle (pytorch_model.bin) are refused, never unpickled
    from safetensors.torch import load_file
    from stealth_eval.humanify import MaskedInfill
    torch.save(load_file(folder / "model.safetensors"), folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()
    with pytest.raises(ComponentUnavailable, match="cannot load"): MaskedInfill(str(folder), device="cpu")
    out = method_shield([item], {**cfg, "shield": {**cfg["shield"], "swap_p": []}}, Cache(enabled=False))[0]
    assert out[0]["setting"] == "strategy=random,p=0.1,infill=causal_lm"
    assert "cannot load" in out[0]["candidates"][0]["facts"]["infill_fallback_reason"]


def test_unloadable_masked_lm_falls_back_under_its_own_name(env, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = {**_cfg(env, random_p=[0.1]), "shield_mlm": str(tmp_path / "no-such-model")}
    out = method_shield([_long_item(60)], cfg, Cache(enabled=False))[0]
    assert out[0]["setting"] == "strategy=random,p=0.1,infill=causal_lm"
    assert "cannot load" in out[0]["candidates"][0]["facts"]["infill_fallback_reason"]


def test_real_smollm2_infill_proposes_training_words():
    "One check on the real offline model: whole words from the training split, stopwords untouched."
    import gensim, pathlib, tempfile
    lee = (pathlib.Path(gensim.__file__).parent / "test" / "test_data" / "lee_background.cor").read_text(encoding="latin-1").splitlines()
    docs = [d for d in lee if 60 < len(d.split()) < 200]
    with tempfile.TemporaryDirectory() as d:
        write_jsonl(pathlib.Path(d) / "data" / "lee.train.jsonl",
                    [{"id": f"t{i}", "label": "ai" if i % 2 else "human", "text": x, "domain": "news", "generator": "x"} for i, x in enumerate(docs[5:45])])
        item = {"id": "e0", "dataset": "lee", "label": "ai", "text": docs[0]}
        cfg = {"seed": 0, "out_dir": d, "device": "cpu", "shield_mlm": None, "shield_infill_lm": "smollm2-135m-instruct",
               "shield": {"random_p": [0.2], "swap_p": [], "rounds": []}}
        out = method_shield([item], cfg, Cache(enabled=False))[0][0]
    f = out["candidates"][0]["facts"]
    n_s = len(content_spans(docs[0]))
    assert f["n_masked"] == math.floor(0.2 * n_s) and f["words_changed"] >= 0.8 * f["n_masked"]
    src, new = word_spans(docs[0]), word_spans(out["candidates"][0]["text"])
    changed = [(a[2], b[2]) for a, b in zip(src, new) if a[2] != b[2]]
    assert len(new) == len(src) and changed
    assert all(is_content_word(b) for _, b in changed)   # candidates from the masked LM alone (SHIELD §3.2.1): any content word


# ---------------------------------------------------------------- polishing

def test_polish_prompts_through_the_chat_template():
    from transformers import AutoTokenizer
    from stealth_eval.models import chat_prompt_ids, convert_gguf
    tok = AutoTokenizer.from_pretrained(convert_gguf("smollm2-135m-instruct")[0])
    text = "The storm hit the coast late on Sunday, and residents said the damage was severe in many towns."
    s = tok.decode(chat_prompt_ids(tok, polish_prompt(text, "degree", "slight-major"), POLISH_SYSTEM))
    assert s.startswith("<|im_start|>system\nYou are a helpful chatbot who always responds with helpful information.")
    assert "<|im_start|>user\nPolish the given original text below with slight major polishing." in s
    assert "must be slight major." in s and s.rstrip().endswith("<|im_start|>assistant")
    p = tok.decode(chat_prompt_ids(tok, polish_prompt(text, "percent", 20), POLISH_SYSTEM))
    n = len(text.split())
    assert f"The text has a total of {n} words. Make sure that you edit exactly {int(n * 0.2)} words." in p


def test_polish_method_levels_filter_and_attributes(env, monkeypatch):
    from transformers import AutoTokenizer
    import stealth_eval.models as models
    tok = AutoTokenizer.from_pretrained(env["lm"])
    tok.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    folder = env["root"] / "chat_lm"
    if not folder.exists():
        import shutil
        shutil.copytree(env["lm"], folder)
        tok.save_pretrained(folder)
    from stealth_eval.components import METHODS
    assert METHODS.get("polish").applies_to == "human" and METHODS.get("polish").batched
    sims = iter([0.97, 0.60, 0.85, 0.84])
    monkeypatch.setattr(models, "similarities", lambda pairs, spec, cfg, cache: [next(sims) for _ in pairs])
    items = [{"id": "h1", "dataset": "toy", "label": "human", "text": "police said the people were there in the year"},
             {"id": "h2", "dataset": "toy", "label": "human", "text": "the minister said the news was new today"}]
    cfg = {"seed": 0, "device": "cpu", "embedder": "all-minilm-l6-v2", "paraphraser": str(folder),
           "polish": {"degrees": ["extreme-minor"], "percents": [35]}}
    out = method_polish(items, cfg, Cache(enabled=False))
    assert [o["setting"] for o in out[0]] == ["polish=degree,level=extreme-minor", "polish=percent,level=35"]
    # jobs run level by level: h1 degree 0.97, h2 degree 0.60, h1 percent 0.85, h2 percent 0.84
    f = {(i, o["setting"]): o["candidates"][0]["facts"] for i in range(2) for o in out[i]}
    assert "invalid_reason" not in f[(0, "polish=degree,level=extreme-minor")]
    assert f[(1, "polish=degree,level=extreme-minor")]["invalid_reason"] == "similarity < 0.85 (polish filter)"
    assert f[(0, "polish=percent,level=35")]["polish_filter_passed"] is True           # 0.85 itself passes
    assert f[(1, "polish=percent,level=35")]["polish_filter_passed"] is False
    g = f[(0, "polish=degree,level=extreme-minor")]
    assert g["polisher"] == str(folder) and g["polisher_model"].startswith("chat_lm@local:") and g["polish_level"] == "extreme-minor"
    with pytest.raises(Exception, match="polish.degrees=\\[\"tiny\"\\]: 'tiny' is not allowed"):
        method_polish(items, {**cfg, "polish": {"degrees": ["tiny"], "percents": []}}, Cache(enabled=False))
