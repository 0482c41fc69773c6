"""Paraphrase attacks (M1-M4) and the methods stage's interface: chat-template prompting, chunking, LoRA loading,
nested candidate budgets, guided selection, token-guided decoding, validity policy, skipped methods, human-text methods.

Model code runs on tiny random models built here (a llama with a word-level tokenizer and a chat template, a tiny
RoBERTa classifier); the real SmolLM2 tokenizer (no weights) checks the chat template, MiniLM computes similarities."""
import json
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest

from stealth_eval import paraphrase as P
from stealth_eval.core import Cache, ComponentUnavailable, StealthEvalError, read_json, read_jsonl
from stealth_eval.data import dataset_path
from stealth_eval.methods import METHODS, run_methods_stage

TEXTS = [
    "The police said the fire near the town was under control by the evening. Residents who had left their homes "
    "were told they could return. The minister said the government would help people who lost property.",
    "A new report found that more people used public transport this year than last year. Two cities saw the largest "
    "increase. Officials said the trend would continue after new lines open next year.",
    "The minister said today that talks with the union had been productive. He said a new offer would be made "
    "this week. The union said it would consider any offer that improves pay and conditions for its members.",
]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    return str(P.make_tiny_chat_lm(d / "lm"))


def base_cfg(tmp, tiny, **kw):
    cfg = {"seed": 0, "device": "cpu", "out_dir": str(tmp / "run"), "generator": tiny, "paraphraser": tiny,
           "scoring_model": tiny, "embedder": "all-minilm-l6-v2", "trust_remote_code": False, "score_max_tokens": 128,
           "n_candidates": [1, 2, 4], "validity": {"min_words": 10, "max_len_ratio": 3.0},
           "paraphrase_chunk_tokens": 24, "paraphrase_max_new_ratio": 1.0, "datasets": [{"name": "toy", "path": None}]}
    cfg.update(kw)
    return cfg


def items():
    return [{"id": f"ai{i}", "dataset": "toy", "text": t, "label": "ai"} for i, t in enumerate(TEXTS)]


# ---------------------------------------------------------------- chat template and chunking

def test_chat_template_prompt_contains_instruction_text_and_generation_prompt():
    from stealth_eval.models import chat_prompt_ids
    tok = P.tokenizer_of("smollm2-135m-instruct")
    ids = chat_prompt_ids(tok, P.PARAPHRASE_PROMPT.format(text=TEXTS[0]))
    s = tok.decode(ids)
    assert "<|im_start|>user\nPlease paraphrase the following text while maintaining its meaning and style." in s
    assert TEXTS[0] in s
    assert s.endswith("<|im_start|>assistant\n")          # the generation prompt is appended


def test_pool_sends_one_message_per_chunk_and_rejoins_in_order(tmp_path, tiny, monkeypatch):
    "A stand-in backend echoes each chunk upper-cased: the candidates are the source upper-cased, chunks in order."
    sent = []
    def fake(target, messages, seeds, cache, cfg, max_new_tokens, temperature, top_p, system=None, desc=""):
        sent.extend(zip(messages, seeds))
        return [m.split("Original text:\n", 1)[1].rsplit("\n\nParaphrased text:", 1)[0].upper() for m in messages]
    monkeypatch.setattr(P, "generate_answers", fake)
    cfg = base_cfg(tmp_path, "smollm2-135m-instruct", paraphrase_chunk_tokens=20)
    pools = P.paraphrase_pool(items(), cfg, Cache(enabled=False), "smollm2-135m-instruct", 2)
    tok = P.tokenizer_of("smollm2-135m-instruct")
    n_chunks = [len(P.chunk_text(it["text"], lambda s: len(tok(s, add_special_tokens=False).input_ids), 20)) for it in items()]
    assert min(n_chunks) >= 2
    for it, pool, nc in zip(items(), pools, n_chunks):
        assert [c["text"] for c in pool] == [it["text"].upper()] * 2   # no text lost, order kept
        assert pool[0]["facts"]["n_chunks"] == nc
    assert len(sent) == 2 * sum(n_chunks)
    assert all(m.startswith("Please paraphrase the following text") for m, _ in sent)
    # one seed per (text, candidate), shared by its chunks, independent of the pool size
    from stealth_eval.models import row_seed
    seeds0 = [s for _, s in sent[:2 * n_chunks[0]]]
    assert seeds0 == [row_seed(0, "ai0", "m1", 0)] * n_chunks[0] + [row_seed(0, "ai0", "m1", 1)] * n_chunks[0]


def test_chunks_respect_the_token_limit_on_real_tokens():
    tok = P.tokenizer_of("smollm2-135m-instruct")
    count = lambda s: len(tok(s, add_special_tokens=False).input_ids)
    text = " ".join(TEXTS) + "\n\n" + TEXTS[0]
    for limit in (16, 40, 80):
        chunks = P.chunk_text(text, count, limit)
        assert "".join(chunks) == text
        assert all(count(c) <= limit + 1 for c in chunks)     # +1: a leading space merges differently at a boundary
    assert len(P.chunk_text(text, count, 40)) < len(P.chunk_text(text, count, 16))


def test_clean_answer_and_join():
    assert P.clean_answer("Paraphrased text: Hello there.") == "Hello there."
    assert P.join_chunks(["One.", "Two."], ["a. ", "b."]) == "One. Two."


# ---------------------------------------------------------------- LoRA adapter (M2)

def _make_adapter(base: str, folder: Path, seed: int = 0) -> Path:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base)
    cfg = LoraConfig(r=4, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    peft_model = get_peft_model(model, cfg)
    with torch.no_grad():        # make the update large enough to change the samples of a random tiny model
        for n, p in peft_model.named_parameters():
            if "lora_B" in n: p.normal_(0, 1.0)
    peft_model.save_pretrained(folder)
    return folder


def test_lora_adapter_changes_the_model_and_has_a_stable_identity(tmp_path, tiny):
    import torch
    from stealth_eval.models import lm_identity, load_causal_lm
    ad = _make_adapter(tiny, tmp_path / "adapter")
    s1, s2 = P.adapter_spec(tiny, str(ad)), P.adapter_spec(tiny, str(ad))
    assert s1.identity == s2.identity and s1.identity.startswith(lm_identity(tiny) + "+lora:")
    other = P.adapter_spec(tiny, str(_make_adapter(tiny, tmp_path / "adapter2", seed=1)))
    assert other.identity != s1.identity
    base = load_causal_lm(tiny, device="cpu")
    adapted = P.load_adapted_lm(tiny, str(ad), "cpu")
    assert adapted.identity == s1.identity
    ids = torch.tensor([[1, 5, 6, 7, 8]])
    with torch.no_grad():
        a, b = adapted.model(ids).logits, base.model(ids).logits
    assert (a - b).abs().max() > 1e-3                     # the adapter changes the output
    # the memoised base model is untouched by peft (M1 keeps using it)
    assert not any("lora" in n for n, _ in base.model.named_parameters())
    # through the generation path: same seeds, different answers
    cfg = base_cfg(tmp_path, tiny)
    cache = Cache(tmp_path / "store")
    pa = P.paraphrase_pool(items()[:2], cfg, cache, s1, 2, pool="m2")
    pb = P.paraphrase_pool(items()[:2], cfg, cache, tiny, 2, pool="m2")
    assert [c["text"] for c in pa[0]] != [c["text"] for c in pb[0]]
    assert pa[0][0]["facts"]["model"] == s1.identity


def test_m2_without_adapter_is_unavailable_never_m1(tmp_path, tiny):
    with pytest.raises(ComponentUnavailable, match="stealthrl_adapter=PATH"):
        P.method_m2(items(), base_cfg(tmp_path, tiny), Cache(enabled=False))
    with pytest.raises(StealthEvalError, match="no such adapter"):
        P.method_m2(items(), base_cfg(tmp_path, tiny, stealthrl_adapter="/no/such/dir"), Cache(enabled=False))


# ---------------------------------------------------------------- M1 / M3: budgets, pools, guidance

def test_m1_nested_budgets_and_generation_log(tmp_path, tiny):
    cfg = base_cfg(tmp_path, tiny, n_candidates=[1, 2, 4])
    cache = Cache(tmp_path / "store")
    out = P.method_m1(items(), cfg, cache)
    assert len(out) == 3
    for outs in out:
        assert [o["setting"] for o in outs] == ["N=1", "N=2", "N=4"]
        pool = {c["facts"]["candidate_index"]: c["text"] for c in outs[-1]["candidates"]}
        for o, n in zip(outs, (1, 2, 4)):
            idx = [c["facts"]["candidate_index"] for c in o["candidates"]]
            assert sorted(idx) == list(range(n))                        # selection under N sees only the first N
            assert all(c["text"] == pool[c["facts"]["candidate_index"]] for c in o["candidates"])   # pools are prefixes
            best = o["candidates"][0]["facts"]
            valid = [c for c in o["candidates"] if c["facts"]["valid"]]
            if valid and n > 1:   # the rule: the valid candidate most similar to the source
                assert best["sim"] == max(c["facts"]["sim"] for c in valid)
        assert outs[0]["candidates"][0]["facts"]["candidate_index"] == 0        # N=1 is the first sample
    log = read_jsonl(Path(cfg["out_dir"]) / "generations.jsonl")
    assert Counter((r["sample_id"], r["method"]) for r in log) == {(f"ai{i}", "m1"): 4 for i in range(3)}
    misses = cache.stats()["chat_generate"]["misses"]
    # M3 reuses M1's pool: nothing new is generated, nothing new is logged
    from stealth_eval.supervised import make_tiny_classifier
    clf = make_tiny_classifier(tmp_path / "clf")
    cfg3 = {**cfg, "classifier_model": str(clf), "classifier_ai_label": 0, "m3_min_sim": -1.0,
            "m3_guides": ["roberta_openai", "fast_detectgpt", "ensemble"]}
    out3 = P.method_m3(items(), cfg3, cache)
    assert cache.stats()["chat_generate"]["misses"] == misses
    assert len(read_jsonl(Path(cfg["out_dir"]) / "generations.jsonl")) == 12
    settings = [o["setting"] for o in out3[0]]
    assert settings == [f"guide={g},N={n}" for g in ("roberta_openai", "fast_detectgpt", "ensemble") for n in (1, 2, 4)]
    # guided selection: with the similarity floor off, the chosen candidate has the lowest deployed AI score
    from stealth_eval.detectors import DETECTORS
    det = DETECTORS.get("fast_detectgpt")
    for outs in out3:
        o = next(o for o in outs if o["setting"] == "guide=fast_detectgpt,N=4")
        valid = [c["text"] for c in o["candidates"] if c["facts"]["valid"]]
        if len(valid) < 2: continue
        sc = P.guide_scores(det, valid, cfg3, cache)
        stats = det.compute([o["candidates"][0]["text"]], cfg3, cache)
        chosen = det.direction * det.raw(next(iter(stats.values())))
        assert chosen == min(s for s in sc if s is not None)
    # narrowed to one setting (a recursive chain's call), M1 and M3 make exactly that output, from the pools' prefixes
    from stealth_eval.components import METHODS
    for name, full, c, settings in (("m1", out, cfg, ["N=1", "N=2"]),
                                    ("m3", out3, cfg3, ["guide=fast_detectgpt,N=2", "guide=ensemble,N=4"])):
        for st in settings:
            one = METHODS.get(name).apply(items(), METHODS.get(name).narrow(c, st), cache)
            assert [[o["setting"] for o in outs] for outs in one] == [[st]] * 3
            assert [outs[0] for outs in one] == [next(o for o in outs if o["setting"] == st) for outs in full]
    assert cache.stats()["chat_generate"]["misses"] == misses


def test_m3_guided_selection_respects_similarity_and_skips_unavailable_guides(tmp_path, tiny, monkeypatch):
    cfg = base_cfg(tmp_path, tiny, n_candidates=[1, 4], m3_guides=["roberta_openai", "fast_detectgpt", "ensemble"],
                   classifier_model=None, m3_min_sim=0.9)
    sims = {}
    def fake_sims(its, pools, cfg, cache):    # candidate k of every text has similarity 0.5 + 0.1 k
        return [[0.5 + 0.1 * k for k in range(len(p))] for p in pools]
    monkeypatch.setattr(P, "pool_similarities", fake_sims)
    out = P.method_m3(items(), cfg, Cache(tmp_path / "store"))
    skipped = read_json(Path(cfg["out_dir"]) / "skipped.json")["methods"]
    assert set(skipped) == {"m3:guide=roberta_openai", "m3:guide=ensemble"}
    assert "classifier_model" in skipped["m3:guide=roberta_openai"]
    assert [o["setting"] for o in out[0]] == ["guide=fast_detectgpt,N=1", "guide=fast_detectgpt,N=4"]
    for outs in out:
        f = outs[1]["candidates"][0]["facts"]
        if f["n_valid"] == 0: continue
        # only candidate 3 (similarity 0.8) ... none reaches 0.9: the fallback takes the most similar valid candidate
        assert f["fallback"] is True and f["selection"].startswith("fallback")
        valid_idx = [c["facts"]["candidate_index"] for c in outs[1]["candidates"] if c["facts"]["valid"]]
        assert f["candidate_index"] == max(valid_idx)


def test_m3_with_no_guide_is_unavailable(tmp_path, tiny):
    cfg = base_cfg(tmp_path, tiny, m3_guides=["roberta_openai"], classifier_model=None)
    with pytest.raises(ComponentUnavailable, match="no guidance detector"):
        P.method_m3(items(), cfg, Cache(enabled=False))


def test_token_guided_paraphrase_follows_its_guide_and_is_cached(tmp_path, tiny):
    cfg = base_cfg(tmp_path, tiny)
    cache = Cache(tmp_path / "store")
    avoid_the = lambda texts: [float(t.split().count("the")) for t in texts]
    a = P.token_guided_paraphrase(items()[:2], cfg, cache, "no_the", score_fn=avoid_the)
    assert all(c["text"].split().count("the") == 0 for c in a) and all(len(c["text"].split()) > 5 for c in a)
    seek = P.token_guided_paraphrase(items()[:1], cfg, cache, "more_the", score_fn=lambda ts: [-x for x in avoid_the(ts)])
    assert seek[0]["text"].split().count("the") > 10
    hits = cache.stats()["m3_token_guided"]["hits"]
    again = P.token_guided_paraphrase(items()[:2], cfg, cache, "no_the", score_fn=avoid_the)
    assert [c["text"] for c in again] == [c["text"] for c in a]
    assert cache.stats()["m3_token_guided"]["hits"] == hits + 2


# ---------------------------------------------------------------- M4 AuthorMist

def test_m4_offline_is_unavailable_and_a_local_folder_stands_in(tmp_path, tiny, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = base_cfg(tmp_path, tiny, n_candidates=[1, 2])
    with pytest.raises(ComponentUnavailable, match="authormist/authormist-originality"):
        P.method_m4(items(), cfg, Cache(enabled=False))
    local = str(P.make_tiny_chat_lm(tmp_path / "authormist", seed=3))
    out = P.method_m4(items(), {**cfg, "authormist_model": local}, Cache(tmp_path / "store"))
    assert [o["setting"] for o in out[0]] == ["N=1", "N=2"]
    f = out[0][0]["candidates"][0]["facts"]
    assert f["pool"] == "m4" and f["model"].startswith("authormist@local:")
    log = read_jsonl(Path(cfg["out_dir"]) / "generations.jsonl")
    assert Counter(r["method"] for r in log) == {"m4": 6}


# ---------------------------------------------------------------- the methods stage

def _toy_dataset(out_dir):
    recs = [{"id": f"{l[0]}{i}", "label": l, "text": f"{l} text number {i} " + "with enough words to be valid " * 2,
             "domain": "news", "generator": "human" if l == "human" else "toy"} for l in ("human", "ai") for i in range(3)]
    p = dataset_path(out_dir, "toy")
    p.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(recs).to_json(p, orient="records", lines=True)


def test_stage_validity_policy_skipped_methods_and_human_methods(tmp_path):
    calls = []
    def batched(its, cfg, cache):
        calls.append([it["dataset"] for it in its])
        good = " ".join(["word"] * 12)
        return [[{"setting": "N=2", "candidates": [{"text": "tiny" if it["id"] == "a0" else good, "facts": {"k": 0}},
                                                    {"text": "", "facts": {"k": 1}}]}] for it in its]
    def missing(its, cfg, cache): raise ComponentUnavailable("needs a GPU here")
    def polish(its, cfg, cache):
        return [[{"setting": "polish=degree,level=minor", "candidates": [{"text": it["text"] + " really", "facts": {}}]}] for it in its]
    _toy_dataset(tmp_path)
    (tmp_path / "skipped.json").write_text(json.dumps({"methods": {"old": "stale"}, "detectors": {"d": "kept"}}))
    from stealth_eval.components import FunctionMethod
    for m in (FunctionMethod(name="t_batched", fn=batched), FunctionMethod(name="t_missing", fn=missing),
              FunctionMethod(name="t_polish", fn=polish, applies_to="human")): METHODS.register(m)
    try:
        cfg = {"out_dir": str(tmp_path), "datasets": [{"name": "toy", "path": None}], "seed": 0,
               "methods": ["m0", "t_batched", "t_missing", "t_polish"], "sanitize": ["t_batched"],
               "validity": {"min_words": 10, "max_len_ratio": 3.0}}
        summary = run_methods_stage(cfg, Cache(enabled=False))
    finally:
        for k in ("t_batched", "t_missing", "t_polish"): METHODS.entries.pop(k)
    assert calls == [["toy"] * 3]                                      # batched: one call per dataset
    assert read_json(tmp_path / "skipped.json") == {"methods": {"t_missing": "needs a GPU here"}, "detectors": {"d": "kept"}}
    raw = pd.DataFrame(read_jsonl(tmp_path / "raw_outputs.jsonl"))
    assert "t_missing" not in set(raw["method"])
    t = raw[raw.method == "t_batched"]
    assert len(t) == 3 * 2 * 2                                         # 3 texts x 2 candidates x (none, sanitize)
    r0 = t[(t.candidate_rank == 0) & (t.defense == "none")].set_index("sample_id")
    assert r0.loc["a0", "valid"] == False and r0.loc["a0", "fail_reason"] == "all 2 candidates invalid (first: too short: 1 words < 10)"
    assert r0.loc["a1", "valid"] == True
    assert set(t.loc[t.candidate_rank == 1, "fail_reason"]) == {"empty text"}   # invalid candidates are kept
    h = raw[raw.method == "t_polish"]
    assert set(h["label"]) == {"human"} and len(h) == 3
    assert set(h["condition"]) == {"t_polish:polish=degree,level=minor"}
    s = summary.set_index("condition")
    assert s.loc["t_batched:N=2", ["n", "n_candidates", "invalid", "all_invalid"]].tolist() == [3, 6, 1, 1]
    assert s.loc["t_polish:polish=degree,level=minor", "n"] == 3
