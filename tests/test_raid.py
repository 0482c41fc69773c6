"RAID's attacks (stealth_eval.raid) against outputs of RAID's own code, and the method's validity and seeding."
import json, random, sys
from pathlib import Path

import pytest

from stealth_eval.components import METHODS
from stealth_eval.core import ComponentUnavailable
from stealth_eval.raid import RAID_ATTACKS, RAID_OFFLINE, method_raid
from stealth_eval.schema import Raid, Settings

REF = Path(__file__).parent / "data" / "raid_reference"
sys.path.insert(0, str(REF))
from make_reference import FAKE_STOPWORDS, SYN_VOCAB, fake_fill_mask, fake_nlls, fake_pos_tag, fake_vector   # the reference's stand-ins

import numpy as np


def _cosine(a, b):
    u, v = np.array(fake_vector(a)), np.array(fake_vector(b))
    return float(u @ v / (np.linalg.norm(u) * np.linalg.norm(v)))

# RAID's synonym thresholds (synonym.py) with the stand-in models make_reference.py gave RAID's SynonymAttack
FAKE_SYNONYM = {"top_k": 20, "min_prob": 0.0025, "min_cosine": 0.5, "mask_window": 20, "pos_window": 4, "mask_token": "[MASK]",
                "stopwords": FAKE_STOPWORDS, "pos_tag": fake_pos_tag, "cosine": _cosine,
                "fill_mask": lambda s, k: fake_fill_mask(s, top_k=k)}
STAND_INS = {"misspelling": {"nlls": fake_nlls}, "synonym": {"components": FAKE_SYNONYM}}

LONG = ("The committee met on 12 March 2024 and approved a budget of 3.5 million dollars. An analysis of the plan showed "
        "a 20% rise in costs. Dr. Lee said the center will open in the fall, and the neighbor agreed. Because of the "
        "weather, the library will open later. The color of the theater is gray.")


@pytest.mark.parametrize("path", sorted(REF.glob("*.json")), ids=lambda p: p.stem)
def test_equals_raid_reference(path):
    "Every reference case: the same text, edit count and edit spans as RAID's attacker given random.seed(seed)."
    ref = json.loads(path.read_text())
    assert ref["rate"] == Raid().get(f"{ref['attack']}_rate", 1.0)   # RAID's rates are the defaults (homoglyph: none, always 1)
    kw = STAND_INS.get(ref["attack"], {})
    for c in ref["cases"]:
        r = RAID_ATTACKS[ref["attack"]](c["text"], random.Random(c["seed"]), ref["rate"], **kw)
        assert (r["generation"], r["num_edits"], [list(e) for e in r["edits"]]) == (c["generation"], c["num_edits"], c["edits"]), (ref["attack"], c["seed"], c["text"][:40])


@pytest.mark.parametrize("path", sorted(REF.glob("*.json")), ids=lambda p: p.stem)
def test_one_shared_stream_equals_raid_pipeline(path):
    """RAID's pipeline seeds once (`random.seed(42)`) and attacks its rows in order, so a row's output depends on the rows
    before it: one generator fed through the project's attack over the reference texts in order gives RAID's outputs."""
    ref = json.loads(path.read_text())
    st, kw, rng = ref["stream"], STAND_INS.get(ref["attack"], {}), random.Random(ref["stream"]["seed"])
    got = [RAID_ATTACKS[ref["attack"]](t, rng, ref["rate"], **kw) for t in st["texts"]]
    assert [(r["generation"], r["num_edits"], [list(e) for e in r["edits"]]) for r in got] == \
        [(o["generation"], o["num_edits"], o["edits"]) for o in st["outputs"]]
    if ref["attack"] in ("whitespace", "insert_paragraphs", "number"):   # and it is not each text seeded alone
        alone = [RAID_ATTACKS[ref["attack"]](t, random.Random(st["seed"]), ref["rate"], **kw)["generation"] for t in st["texts"]]
        assert alone != [o["generation"] for o in st["outputs"]]


def test_reference_has_both_tokenizer_cases():
    "The reference was made with RAID's pinned NLTK 3.8.1 and holds the texts where NLTK's tokenizers part from others."
    refs = {p.stem: json.loads(p.read_text()) for p in REF.glob("*.json")}
    assert {r["nltk"] for r in refs.values()} == {"3.8.1"}
    texts = {c["text"] for c in refs["insert_paragraphs"]["cases"]}
    assert any("great!! !" in t for t in texts) and any("'urban'" in t for t in texts)


def test_reference_covers_every_offline_attack():
    assert sorted(p.stem for p in REF.glob("*.json")) == sorted(RAID_OFFLINE + ["synonym"]) == sorted(Raid().attacks + ["synonym"])
    ranked = json.loads((REF / "misspelling.json").read_text())["cases"]
    assert any(0 < c["num_edits"] for c in ranked if c["text"].startswith("Because I really"))   # the LM-ranked path


@pytest.mark.parametrize("text, attacks", [("", RAID_OFFLINE), ("Sun hum.", [a for a in RAID_OFFLINE if a != "zero_width_space"])])
def test_no_target_is_invalid_with_reason(text, attacks):
    out = method_raid([{"id": "x", "text": text}], {"seed": 0, "raid": {"attacks": attacks}})[0]
    assert [o["setting"] for o in out] == attacks
    for o in out:
        c = o["candidates"][0]
        assert c["text"] == text and c["facts"]["invalid_reason"].startswith(f"raid:{o['setting']}: "), o


def test_facts_and_seeding():
    items = [{"id": "a", "text": LONG}, {"id": "b", "text": LONG}]
    cfg = {"seed": 0, "raid": {"attacks": RAID_OFFLINE}}
    out = method_raid(items, cfg)
    for o in out[0]:
        f = o["candidates"][0]["facts"]
        assert "invalid_reason" not in f and f["num_edits"] > 0 and f["rate_achieved"] == f["num_edits"] / f["rate_denominator"], o["setting"]
        assert o["candidates"][0]["text"] != LONG
    assert method_raid(items, cfg) == out                                   # deterministic per seed
    assert method_raid(items[1:], cfg)[0] == out[1]                         # independent of batch mates
    differs = lambda a, b: [x["candidates"][0]["text"] != y["candidates"][0]["text"] for x, y in zip(a, b)]
    assert any(differs(out[0], out[1]))                                     # the id is part of the seed
    assert any(differs(out[0], method_raid(items, {**cfg, "seed": 1})[0]))  # and so is the run's seed


def test_rates_are_settings():
    out = method_raid([{"id": "a", "text": LONG}], {"seed": 0, "raid": {"attacks": ["whitespace"], "whitespace_rate": 1.0}})[0][0]
    assert out["candidates"][0]["facts"]["num_edits"] == len(LONG.split(" "))
    assert Settings().raid.attacks == RAID_OFFLINE and METHODS.get("raid").name == "raid"


def test_model_attacks_unavailable(tmp_path, monkeypatch):
    "Synonym without its models: skipped with the reasons (alone: the method is); a ranked misspelling without its LM: invalid."
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = {"seed": 0, "out_dir": str(tmp_path), "raid": {"attacks": ["whitespace", "synonym"], "synonym_mlm": str(tmp_path / "no-mlm"),
                                                           "synonym_vectors": str(tmp_path / "no.bin")}}
    out = method_raid([{"id": "a", "text": LONG}], cfg)[0]
    assert [o["setting"] for o in out] == ["whitespace"]
    assert "no-mlm" in json.loads((tmp_path / "skipped.json").read_text())["methods"]["raid:synonym"]
    with pytest.raises(ComponentUnavailable, match="raid synonym"):
        method_raid([{"id": "a", "text": LONG}], {**cfg, "raid": {**cfg["raid"], "attacks": ["synonym"]}})
    ranked = "Because I really believe whether we receive weird weather until tomorrow is definitely a business question."
    cfg = {"seed": 0, "raid": {"attacks": ["misspelling"], "misspelling_lm": str(tmp_path / "no-lm")}}
    got = method_raid([{"id": "a", "text": ranked}, {"id": "b", "text": LONG}], cfg)
    assert "cannot load" in got[0][0]["candidates"][0]["facts"]["invalid_reason"]
    assert "invalid_reason" not in got[1][0]["candidates"][0]["facts"]   # every candidate misspelt: no LM needed


def test_the_methods_stage_runs_raid(tmp_path):
    "Through run_methods_stage: one condition per attack (raid:<attack>), the facts kept, no-target outputs invalid with their reason."
    import pandas as pd
    from stealth_eval.core import Cache, read_jsonl
    from stealth_eval.data import dataset_path
    from stealth_eval.methods import run_methods_stage
    recs = [{"id": "h0", "label": "human", "text": LONG, "domain": "news", "generator": "human"},
            {"id": "a0", "label": "ai", "text": LONG, "domain": "news", "generator": "toy"},
            {"id": "a1", "label": "ai", "text": "Snow fell and wind blew and birds sang all day long in our small quiet town.",
             "domain": "news", "generator": "toy"}]
    p = dataset_path(tmp_path, "toy"); p.parent.mkdir(parents=True)
    pd.DataFrame(recs).to_json(p, orient="records", lines=True, force_ascii=False)
    cfg = {"out_dir": str(tmp_path), "datasets": [{"name": "toy", "path": None}], "methods": ["m0", "raid"], "sanitize": [],
           "validity": {"min_words": 10, "max_len_ratio": 3.0}, "seed": 0, "raid": {"attacks": ["article_deletion", "number"]}}
    run_methods_stage(cfg, Cache(enabled=False))
    rows = {(r["sample_id"], r["condition"]): r for r in read_jsonl(tmp_path / "raw_outputs.jsonl") if r["method"] == "raid"}
    assert sorted(rows) == [(s, f"raid:{a}") for s in ("a0", "a1") for a in ("article_deletion", "number")]
    assert all(rows[("a0", c)]["valid"] and rows[("a0", c)]["facts"]["num_edits"] > 0 for c in ("raid:article_deletion", "raid:number"))
    assert rows[("a1", "raid:number")]["valid"] is False and rows[("a1", "raid:number")]["fail_reason"] == "raid:number: no numbers"
    assert rows[("a1", "raid:article_deletion")]["fail_reason"] == "raid:article_deletion: no articles (' a ', ' an ', ' the ')"



MISSPELL = ("The chief said the weather was really great because the library and the restaurant were necessary. The "
            "professor believed the foreign colleague would receive a surprise tomorrow. The secretary caught the speech, "
            "and the business was successful.")   # 19 words of RAID's misspelling table in 42 tokens: ranked, 8 misspelt


def _tiny_gpt2(folder):
    "A tiny random GPT-2 (RAID's misspelling LM's architecture) with a byte-level BPE tokenizer trained here, saved to `folder`."
    import torch
    from tokenizers import ByteLevelBPETokenizer
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator([LONG, MISSPELL], vocab_size=400, min_frequency=1, special_tokens=["<|endoftext|>"])
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, bos_token="<|endoftext|>", eos_token="<|endoftext|>",
                                  unk_token="<|endoftext|>", model_max_length=128)
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=2, n_head=4, n_positions=128, bos_token_id=0,
                               eos_token_id=0)).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def test_misspelling_ranks_with_a_real_causal_lm(tmp_path):
    """`lm_nlls` through the project's loader on a GPT-2 built here: its pieces join to the text (RAID aligns them by
    length), its log-probabilities are the model's own loss, and the misspelt words are the likeliest candidates by
    the model's log-probabilities summed over each word's tokens (found here by the tokenizer's offsets instead)."""
    import torch
    from transformers import AutoTokenizer, GPT2LMHeadModel
    from stealth_eval.raid import lm_nlls, raid_misspelling, raid_resource, word_spans
    folder = _tiny_gpt2(tmp_path / "gpt2")
    nlls = lm_nlls(str(folder), "cpu")
    got = nlls(MISSPELL)
    assert "".join(p for p, _ in got) == MISSPELL
    tok, model = AutoTokenizer.from_pretrained(folder), GPT2LMHeadModel.from_pretrained(folder).eval()
    enc = tok(tok.bos_token + MISSPELL, return_tensors="pt", return_offsets_mapping=True)
    ids = enc["input_ids"]
    with torch.no_grad(): logits = model(ids).logits[0, :-1]
    logp = torch.log_softmax(logits, -1).gather(1, ids[0, 1:, None])[:, 0].tolist()
    assert sum(v for _, v in got) == pytest.approx(sum(logp), rel=1e-5)
    assert sum(logp) == pytest.approx(-torch.nn.functional.cross_entropy(logits, ids[0, 1:]).item() * len(logp), rel=1e-5)
    # the ranking by hand: each candidate word's summed log-probability over the tokens its offsets overlap
    shift = len(tok.bos_token)
    offs = [(s - shift, e - shift) for s, e in enc["offset_mapping"][0, 1:].tolist()]
    table, spans = raid_resource("raid_misspellings.json"), word_spans(MISSPELL)
    cands = [j for j, (s, e) in enumerate(spans) if MISSPELL[s:e].lower() in table]
    k = int(len(spans) * 0.2)
    assert 0 < k < len(cands)                                    # the ranked branch, the one that needs the LM
    score = {j: sum(v for (s, e), v in zip(offs, logp) if spans[j][0] < e and spans[j][1] > s) for j in cands}
    want = sorted(sorted(cands, key=lambda j: score[j], reverse=True)[:k])
    r = raid_misspelling(MISSPELL, random.Random(0), 0.2, nlls=nlls)
    before, after = [MISSPELL[s:e] for s, e in spans], [r["generation"][s:e] for s, e in word_spans(r["generation"])]
    assert len(after) == len(before) and r["num_edits"] == k
    assert [j for j, (a, b) in enumerate(zip(before, after)) if a != b] == want


def test_synonym_components_load_a_real_masked_lm(tmp_path, monkeypatch):
    """`synonym_components` through transformers' fill-mask pipeline on a BERT built here (RAID's synonym proposer), the
    fastText vectors and NLTK's tagger and stopwords (not installable offline) replaced by the reference's stand-ins:
    the proposals come in RAID's shape (token_str, score; best first) and the attack runs on them."""
    import types
    import nltk
    import torch
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import BertConfig, BertForMaskedLM, PreTrainedTokenizerFast
    from stealth_eval.raid import raid_synonym, synonym_components
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab = {w: i for i, w in enumerate(dict.fromkeys(specials + [w for w in LONG.lower().replace(".", " . ").replace(",", " , ").split()] + SYN_VOCAB))}
    t = Tokenizer(models.WordPiece(vocab=vocab, unk_token="[UNK]"))
    t.normalizer, t.pre_tokenizer = normalizers.BertNormalizer(lowercase=True), pre_tokenizers.BertPreTokenizer()
    t.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    tok = PreTrainedTokenizerFast(tokenizer_object=t, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]",
                                  mask_token="[MASK]", model_max_length=64)
    torch.manual_seed(0)
    BertForMaskedLM(BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                               intermediate_size=64, max_position_embeddings=64)).save_pretrained(tmp_path / "bert")
    tok.save_pretrained(tmp_path / "bert")
    monkeypatch.setitem(sys.modules, "fasttext", types.SimpleNamespace(load_model=lambda path: _Vectors()))
    monkeypatch.setattr(nltk, "pos_tag", fake_pos_tag)
    monkeypatch.setattr(nltk, "corpus", types.SimpleNamespace(stopwords=types.SimpleNamespace(words=lambda lang: sorted(FAKE_STOPWORDS))))
    c = synonym_components(str(tmp_path / "bert"), str(tmp_path / "vectors.bin"), "cpu")
    assert c["mask_token"] == "[MASK]"
    props = c["fill_mask"]("the committee [MASK] on the plan", 5)
    assert len(props) == 5 and all(isinstance(p["token_str"], str) and 0 <= p["score"] <= 1 for p in props)
    assert [p["score"] for p in props] == sorted((p["score"] for p in props), reverse=True)
    assert c["fill_mask"]("the plan " * 80 + "[MASK]", 5) == []   # the mask past the model's 64 positions: none (RAID's behaviour)
    r = raid_synonym(LONG, random.Random(0), 0.5, components={**c, "min_prob": 0.0, "min_cosine": -1.0})
    assert r["num_edits"] > 0 and r["generation"] != LONG


class _Vectors:
    "fastText's model as the attack reads it: `m[word]` a vector (the reference's seeded stand-in)."
    def __getitem__(self, w): return np.array(fake_vector(w))


def test_punkt_is_nltks_as_raid_pins_it():
    """Sentences: NLTK's own Punkt (RAID's `nltk.sent_tokenize`, nltk 3.8.1) on NLTK's English parameters: a trailing
    punctuation-only "!"/"?" is a sentence of its own; a curly closing quote is not closing punctuation (3.9+: it is)."""
    from stealth_eval.raid import sentence_tokenizer
    tok = sentence_tokenizer()
    assert tok.tokenize("The meal was great!! ! We will come back.") == ["The meal was great!!", "!", "We will come back."]
    assert tok.tokenize("Would we return?? ? Yes.") == ["Would we return??", "?", "Yes."]
    assert tok.tokenize("Dr. Lee came. He sat.") == ["Dr. Lee came.", "He sat."]
    assert tok.tokenize("\u201cWe believe it.\u201d The committee met. (It rained.) Then.") == \
        ["\u201cWe believe it.\u201d The committee met.", "(It rained.)", "Then."]
    assert list(tok.span_tokenize("One.  Two!\n\nThree")) == [(0, 4), (6, 10), (12, 17)]
    from stealth_eval.dipper import split_for_dipper   # DIPPER's windows split with the same Punkt
    assert split_for_dipper("The meal was great!! ! We\nleft.") == (["The meal was great!!", "!", "We left."], "nltk-punkt")


def test_word_tokenizer_is_nltk_3_8_1():
    "Words: NLTK 3.8.1's NLTKWordTokenizer (RAID's pin): a leading apostrophe stays on its word, dashes and clitics too."
    from stealth_eval.raid import raid_upper_lower, word_spans, word_tokenizer
    toks = lambda t: [t[s:e] for s, e in word_tokenizer().span_tokenize(t)]
    assert toks("the 'urban' district") == ["the", "'urban", "'", "district"]   # 3.9+: "'", "urban", "'"
    assert toks("an 'a' grade") == ["an", "'", "a", "'", "grade"]                # 3.8.1 splits a one-letter word
    assert toks("in 2020\u20132024\u2014a plan") == ["in", "2020\u20132024\u2014a", "plan"]   # 3.9+ splits the dashes
    assert toks("the committee's\nreport") == ["the", "committee's", "report"]   # 3.9+: "committee", "'s"
    assert toks("I don't \"know\" it.") == ["I", "do", "n't", '"', "know", '"', "it", "."]
    t = "'urban " * 40
    assert [t[s:e] for s, e in word_spans(t)] == ["'urban"] * 40
    r = raid_upper_lower(t, random.Random(0))   # no token starts with a letter: nothing to flip (3.9+: 40 candidates)
    assert (r["num_edits"], r["targets"], r["generation"]) == (0, 0, t)


def test_rate_achieved_is_over_raids_denominators():
    "misspelling and synonym: int(rate x word tokens) (RAID's `len(word_spans)`); homoglyph: over characters, as zero-width."
    from stealth_eval.raid import attack_facts, raid_homoglyph, raid_misspelling, raid_synonym, word_spans
    t = "Because of the weather, we stayed home all day."   # 11 tokens, 2 of RAID's table: int(0.2 x 11) = 2 misspelt
    f = attack_facts("misspelling", t, raid_misspelling(t, random.Random(0)), 0.2)
    assert (f["num_edits"], f["targets"], f["rate_denominator"], f["rate_achieved"]) == (2, 2, 11, 2 / 11)
    f = attack_facts("homoglyph", "cat sat", raid_homoglyph("cat sat", random.Random(0)), 1.0)
    assert (f["num_edits"], f["targets"], f["rate_denominator"], f["rate_achieved"]) == (3, 3, 7, 3 / 7)
    r = raid_synonym("the dog ran", random.Random(0), components=FAKE_SYNONYM)
    assert r["rate_denominator"] == len(word_spans("the dog ran")) == 3
    f = attack_facts("whitespace", LONG, RAID_ATTACKS["whitespace"](LONG, random.Random(0)), 0.2)
    assert f["rate_denominator"] == f["targets"] == len(LONG.split(" "))   # the others: the places it could edit


def test_insert_paragraphs_joins_sentences_with_spaces_as_raid():
    "RAID rejoins Punkt's sentences with single spaces: the line breaks between sentences go, those inside one stay."
    from stealth_eval.raid import raid_insert_paragraphs
    t = "One came.\nTwo went\nhome. Three sat.\n\nFour."
    r = raid_insert_paragraphs(t, random.Random(0), rate=0.0)
    assert (r["generation"], r["targets"]) == ("One came. Two went\nhome. Three sat. Four.", 3)


def test_homoglyph_is_linear():
    "Each letter's edit is appended, not the list copied (quadratic: seconds on a 20,000-word text)."
    import time
    from stealth_eval.raid import raid_homoglyph
    t = " ".join(["Cocoa", "taxi", "pie", "coy"] * 5000)   # 20,000 words, 70,000 letters of RAID's table
    t0 = time.perf_counter(); r = raid_homoglyph(t, random.Random(0)); dt = time.perf_counter() - t0
    assert r["num_edits"] == sum(c in "Cocaxipey" for c in t) == 70000 and dt < 2.0, dt
