"""Recursive paraphrasing (14_dipper): depths chain on the previous depth's rank-0 output, each depth draws its own
seeds, depth 1 is the base method's own call, and the quality stage records the similarity to the original source
and to the previous depth (25_quality: `sim`, `sim_previous`) in one pass. Stub base methods: the mechanism is under
test, not a model."""
import pandas as pd
import pytest

from stealth_eval.components import METHODS, FunctionMethod
from stealth_eval.core import Cache, ComponentUnavailable, StealthEvalError
from stealth_eval.dipper import recursive_outputs
from stealth_eval.models import row_seed


def _stub(calls):
    "Two settings, each candidate list of two: setting A appends 'a', B appends 'b' (rank 0) or '?' (rank 1)."
    def fn(items, cfg, cache):
        calls.append([(it["id"], it["text"]) for it in items])
        return [[{"setting": s, "candidates": [{"text": it["text"] + s.lower(), "facts": {"seed": row_seed(cfg["seed"], it["id"], s)}},
                                               {"text": it["text"] + "?", "facts": {}}]} for s in ("A", "B")] for it in items]
    return FunctionMethod(name="stubpara", fn=fn)


def test_depths_chain_on_rank_0_per_setting_with_their_own_seeds():
    calls = []
    out = recursive_outputs([{"id": "t1", "text": "x"}, {"id": "t2", "text": "y"}], {"seed": 0}, None, _stub(calls), [1, 3])
    got = [(o["setting"], o["candidates"][0]["text"], o["candidates"][0]["facts"]["previous_text"], o["candidates"][0]["facts"]["depth"])
           for o in out[0]]
    assert got == [("base=stubpara,A,depth=1", "xa", "x", 1), ("base=stubpara,B,depth=1", "xb", "x", 1),
                   ("base=stubpara,A,depth=3", "xaaa", "xaa", 3), ("base=stubpara,B,depth=3", "xbbb", "xbb", 3)]
    assert calls[0] == [("t1", "x"), ("t2", "y")]                       # depth 1: the base method's own call, unchanged
    assert calls[1] == [("t1#depth=2", "xa"), ("t1#depth=2", "xb"), ("t2#depth=2", "ya"), ("t2#depth=2", "yb")]
    assert [c[0] for c in calls[2]] == ["t1#depth=3"] * 2 + ["t2#depth=3"] * 2
    seeds = [o["candidates"][0]["facts"]["seed"] for o in out[0] if o["setting"].startswith("base=stubpara,A")]
    assert seeds == [row_seed(0, "t1", "A"), row_seed(0, "t1#depth=3", "A")] and seeds[0] != seeds[1]
    f = out[0][0]["candidates"][1]["facts"]                              # every candidate says its depth and base
    assert (f["depth"], f["base_method"], f["base_setting"]) == (1, "stubpara", "A")


def test_the_registered_method_reads_its_settings_and_skips_with_a_reason(monkeypatch):
    calls = []
    monkeypatch.setitem(METHODS.load().entries, "stubpara", _stub(calls))
    rec = METHODS.get("recursive")
    cfg = {"seed": 0, "recursive": {"methods": ["stubpara"], "depths": [2]}}
    out = rec.apply([{"id": "t", "text": "x"}], cfg, Cache(enabled=False))
    assert [(o["setting"], o["candidates"][0]["text"]) for o in out[0]] == [("base=stubpara,A,depth=2", "xaa"), ("base=stubpara,B,depth=2", "xbb")]
    with pytest.raises(ComponentUnavailable, match="recursive.methods is empty"):
        rec.apply([{"id": "t", "text": "x"}], {"seed": 0, "recursive": {"methods": [], "depths": [1]}}, Cache(enabled=False))
    # a base method that cannot run: recursive is skipped with its reason
    with pytest.raises(ComponentUnavailable, match="dipper: no DIPPER model given"):
        rec.apply([{"id": "t", "text": "x"}], {"seed": 0, "recursive": {"methods": ["dipper"], "depths": [1]}, "dipper": {"model": None}},
                  Cache(enabled=False))


def test_settings_name_only_methods_that_can_recurse():
    from stealth_eval.config import resolve_config
    from stealth_eval.schema import Settings
    assert Settings().recursive.methods == [] and Settings().recursive.depths == [1, 3, 5]
    cfg = resolve_config("tiny", overrides={"recursive.methods": ["m1", "dipper_lm"], "recursive.depths": [1, 3]})
    assert cfg.recursive.methods == ["m1", "dipper_lm"]
    for bad in (["m0"], ["recursive"], ["polish"]):
        with pytest.raises(StealthEvalError, match="cannot be recursed"): resolve_config("tiny", overrides={"recursive.methods": bad})
    with pytest.raises(StealthEvalError, match="unknown"): resolve_config("tiny", overrides={"recursive.methods": ["m9"]})


def test_quality_records_the_similarity_to_the_source_and_to_the_previous_depth(tmp_path):
    from stealth_eval.models import make_tiny_lm, similarities
    from stealth_eval.quality import compute_quality, quality_summary
    src, d1, d3, prev3 = ("markets rose on friday as investors cheered the news", "markets went up on friday as investors cheered",
                          "on friday the stock market climbed", "stocks climbed on friday, cheering investors")
    outs = pd.DataFrame({"dataset": "d", "label": "ai", "method": ["m0", "m1", "recursive", "recursive"],
                         "setting": ["", "N=1", "base=m1,N=1,depth=1", "base=m1,N=1,depth=3"], "defense": "none",
                         "condition": ["m0", "m1:N=1", "recursive:base=m1,N=1,depth=1", "recursive:base=m1,N=1,depth=3"],
                         "candidate_rank": 0, "sample_id": "x__ai", "text_out": [src, d1, d1, d3], "valid": True, "fail_reason": "",
                         "facts": [{}, {"pool": "m1"}, {"depth": 1, "previous_text": src}, {"depth": 3, "previous_text": prev3}]})
    cfg = {"embedder": "all-minilm-l6-v2", "quality_lm": str(make_tiny_lm(tmp_path / "lm")), "device": "cpu",
           "score_max_tokens": 64, "score_batch_tokens": "auto", "trust_remote_code": False}
    store = Cache(tmp_path / "cache")
    q = compute_quality(outs, cfg, store).set_index("condition")
    direct = similarities([(src, d1), (src, d3), (prev3, d3)], "all-minilm-l6-v2", cfg, Cache(enabled=False))
    assert q.loc["recursive:base=m1,N=1,depth=1", "sim"] == pytest.approx(direct[0], abs=1e-6)
    assert q.loc["recursive:base=m1,N=1,depth=1", "sim_previous"] == pytest.approx(direct[0], abs=1e-6)   # depth 1: previous = source
    assert q.loc["recursive:base=m1,N=1,depth=3", "sim"] == pytest.approx(direct[1], abs=1e-6)
    assert q.loc["recursive:base=m1,N=1,depth=3", "sim_previous"] == pytest.approx(direct[2], abs=1e-6)
    assert q.loc[["m0", "m1:N=1"], "sim_previous"].isna().all()
    s = quality_summary(q.reset_index())["d"]
    assert "sim_previous_mean" in s["recursive:base=m1,N=1,depth=3"] and "sim_previous_mean" not in s["m1:N=1"]


def test_the_methods_stage_writes_each_depth_as_a_condition_and_skips_dipper_with_its_reason(tmp_path, monkeypatch):
    import json
    from stealth_eval.core import read_json, read_jsonl
    from stealth_eval.data import dataset_path
    from stealth_eval.methods import run_methods_stage
    recs = [{"id": f"{l[0]}{i}", "label": l, "text": f"{l} text number {i} " + "with enough words to be valid " * 2,
             "domain": "news", "generator": "human" if l == "human" else "toy"} for l in ("human", "ai") for i in range(2)]
    p = dataset_path(tmp_path, "toy"); p.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(recs).to_json(p, orient="records", lines=True)
    monkeypatch.setitem(METHODS.load().entries, "stubpara", _stub([]))
    cfg = {"out_dir": str(tmp_path), "datasets": [{"name": "toy", "path": None}], "seed": 0, "sanitize": [],
           "methods": ["m0", "dipper", "recursive"], "validity": {"min_words": 10, "max_len_ratio": 3.0},
           "dipper": {"model": None}, "recursive": {"methods": ["stubpara"], "depths": [1, 3]}}
    summary = run_methods_stage(cfg, Cache(enabled=False))
    assert read_json(tmp_path / "skipped.json")["methods"]["dipper"].startswith("no DIPPER model given")
    raw = pd.DataFrame(read_jsonl(tmp_path / "raw_outputs.jsonl"))
    r = raw[(raw.method == "recursive") & (raw.candidate_rank == 0)].set_index(["sample_id", "condition"])
    assert set(summary["condition"]) >= {"recursive:base=stubpara,A,depth=1", "recursive:base=stubpara,B,depth=3"}
    row = r.loc[("a0", "recursive:base=stubpara,A,depth=3")]
    assert row["text_out"].endswith("valid aaa") and row["facts"]["depth"] == 3 and row["facts"]["previous_text"].endswith("valid aa")
    assert row["valid"]                                                 # judged against the original AI text


# --- Sadasivan et al.'s recursion beside today's, against a re-statement of the references' loops -----------------------
# Re-stated from a reading of two scripts (no code copied): martiansideofthemoon/ai-detection-paraphrases,
# `dipper_paraphrases/paraphrase_minimal.py` (`DipperParaphraser.paraphrase`: whitespace collapsed, sentences split,
# windows of `sent_interval` = 3, input `lexical = {100-L}, order = {100-O}` + ` {prefix}` when non-empty +
# ` <sent> {window} </sent>`, then `prefix += " " + out`, `output_text += " " + out`), and
# vinusankars/Reliability-of-AI-text-detectors, `rephrase/recursive_paraphrase.py` (`__main__`: P = 5 rounds, the
# context `prompt = ""` in round 1, `lex_diversity=60` every round, `order_diversity=60` in round P and 0 before,
# `do_sample=True, top_p=0.75, top_k=None, max_length=750`, then `prompt = input_text; input_text = output`).
import hashlib
import re

_SENT = re.compile(r"(?<=\.) ")          # the test texts have no abbreviations: every '. ' ends a sentence


def _stub_paraphrase(x: str) -> str:
    "A stand-in DIPPER: each sentence of the window gets a word made from a hash of the whole input (prefix and codes too)."
    x = " ".join(x.split())
    tag = "".join(chr(97 + int(c, 16)) for c in hashlib.sha1(x.encode()).hexdigest()[:6])
    window = x.split(" <sent> ", 1)[1].rsplit(" </sent>", 1)[0]
    return " ".join(s[:-1] + f" {tag}." for s in _SENT.split(window))


def _ref_paraphrase(calls, input_text, lex_diversity, order_diversity, prefix="", sent_interval=3, **kw):
    "DipperParaphraser.paraphrase, re-stated; `calls` records (model input, top_p, max_length) per window."
    lex_code, order_code = 100 - lex_diversity, 100 - order_diversity
    sentences = _SENT.split(" ".join(input_text.split()))
    prefix, output_text = " ".join(prefix.replace("\n", " ").split()), ""
    for k in range(0, len(sentences), sent_interval):
        x = f"lexical = {lex_code}, order = {order_code}" + (f" {prefix}" if prefix else "")
        x += f" <sent> {' '.join(sentences[k:k + sent_interval])} </sent>"
        calls.append((x, kw["top_p"], kw["max_length"]))
        out = _stub_paraphrase(x)
        prefix += " " + out
        output_text += " " + out
    return output_text


def _ref_sadasivan(calls, text, rounds):
    "recursive_paraphrase.py's loop over rounds for one text, re-stated: the output of every round."
    prompt, outs = "", []
    for j in range(rounds):
        out = _ref_paraphrase(calls, text, 60, 60 if j == rounds - 1 else 0, prefix=prompt, top_p=0.75, max_length=750)
        outs.append(out.strip())
        prompt, text = text, out
    return outs


def _ref_today(calls, text, prompt, lex, order, rounds, max_length):
    "Today's protocol: the method applied to its own output, the text's prompt as context and one (L, O) every round."
    outs = []
    for _ in range(rounds):
        text = _ref_paraphrase(calls, text, lex, order, prefix=prompt, top_p=0.75, max_length=max_length).strip()
        outs.append(text)
    return outs


_ITEMS = [{"id": "t1", "text": "It is quick and brown.  It jumps over\nthe lazy dog. The dog sleeps. Then it wakes up.",
           "prompt": "Tracy is\na fox."},
          {"id": "t2", "text": "Markets rose on the news. Investors cheered.", "prompt": ""}]


def _stub_dipper(monkeypatch, tmp_path, base):
    "Route `base`'s model calls to `_stub_paraphrase`; returns the list its calls are recorded in, as DIPPER inputs."
    import stealth_eval.dipper as dp
    seen = []
    if base == "dipper":
        monkeypatch.setattr(dp, "load_dipper", lambda cfg: (None, None, "stub-t5", "cpu"))
        def t5(t5_, inputs, seeds, cache, top_p=0.75, max_length=512, batch_tokens=0, max_rows=16, step_mode=None):
            seen.extend((x, top_p, max_length) for x in inputs)
            return [_stub_paraphrase(x) for x in inputs]
        monkeypatch.setattr(dp, "t5_generate", t5)
        return seen, {}
    import stealth_eval.paraphrase as para
    from stealth_eval.models import make_tiny_lm
    form = re.compile(r"Lexical diversity: (\d+) .*Order diversity: (\d+) .*\(do not repeat it\): (.*)\n\nText: (.*)", re.S)
    def answers(target, messages, seeds, cache, cfg, max_new_tokens, temperature, top_p, system=None, desc=""):
        out = []
        for m in messages:                         # the stand-in's message, read back into DIPPER's input string
            lex, order, ctx, window = form.search(m).groups()
            x = dp.dipper_input(100 - int(lex), 100 - int(order), "" if ctx == "(none)" else ctx, window)
            seen.append((x, top_p, None)); out.append(_stub_paraphrase(x))
        return out
    monkeypatch.setattr(para, "generate_answers", answers)
    return seen, {"paraphraser": str(make_tiny_lm(tmp_path / "lm")), "paraphrase_temperature": 0.9}


def _norm(calls, base):
    "Calls as comparable: the stand-in reads no max_length and its prompt loses the reference's double space."
    return sorted((" ".join(x.split()), p, m if base == "dipper" else None) for x, p, m in calls)


@pytest.mark.parametrize("base", ["dipper", "dipper_lm"])
def test_the_sadasivan_protocol_makes_the_reference_scripts_calls(monkeypatch, tmp_path, base):
    seen, extra = _stub_dipper(monkeypatch, tmp_path, base)
    dcfg = {"model": "stub", "tokenizer": None, "dtype": "auto", "lex_order": [[60, 60], [60, 0]], "sent_interval": 3,
            "top_p": 0.75, "max_length": 512, "batch_size": 4, "batch_tokens": 0, "prefix_words": 1000}
    cfg = {"seed": 0, "device": "cpu", "dtype": "float32", "dipper": dcfg, **extra,
           "recursive": {"methods": [base], "depths": [1, 3], "protocol": "sadasivan"}}
    out = METHODS.get("recursive").apply([dict(it) for it in _ITEMS], cfg, Cache(enabled=False))
    ref_calls = []
    ref = [_ref_sadasivan(ref_calls, it["text"], 3) for it in _ITEMS]
    assert _norm(seen, base) == _norm(ref_calls, base)            # every DIPPER call the script makes, and no other
    assert len(seen) == 3 * (2 + 1)                                # 3 rounds x (2 windows of t1 + 1 of t2)
    for o, r in zip(out, ref):
        assert [(x["setting"], x["candidates"][0]["text"]) for x in o] == [
            (f"base={base},protocol=sadasivan,L=60,O=0,depth=1", r[0]), (f"base={base},protocol=sadasivan,L=60,O=60,depth=3", r[2])]
    f = out[0][1]["candidates"][0]["facts"]
    assert (f["protocol"], f["rounds"], f["depth"], f["lex_diversity"], f["order_diversity"], f["previous_text"]) == \
           ("sadasivan", 3, 3, 60, 60, ref[0][1])
    # round 1 has no context though t1 has a prompt; round 2's context is the original text, round 3's round 1's output
    first = [x for x, _, _ in seen if x.endswith("<sent> It is quick and brown. It jumps over the lazy dog. The dog sleeps. </sent>")]
    assert first == ["lexical = 40, order = 100 <sent> It is quick and brown. It jumps over the lazy dog. The dog sleeps. </sent>"]
    assert any(" ".join(x.split()).startswith("lexical = 40, order = 100 It is quick and brown. It jumps over the lazy dog. "
                                              "The dog sleeps. Then it wakes up. <sent> It is quick") for x, _, _ in seen)


@pytest.mark.parametrize("base", ["dipper", "dipper_lm"])
def test_todays_protocol_keeps_the_prompt_and_each_pair_and_makes_the_reference_loops_calls(monkeypatch, tmp_path, base):
    seen, extra = _stub_dipper(monkeypatch, tmp_path, base)
    dcfg = {"model": "stub", "tokenizer": None, "dtype": "auto", "lex_order": [[60, 60], [60, 0]], "sent_interval": 3,
            "top_p": 0.75, "max_length": 512, "batch_size": 4, "batch_tokens": 0, "prefix_words": 1000}
    cfg = {"seed": 0, "device": "cpu", "dtype": "float32", "dipper": dcfg, **extra,
           "recursive": {"methods": [base], "depths": [1, 3]}}                         # no protocol: today's
    out = METHODS.get("recursive").apply([dict(it) for it in _ITEMS], cfg, Cache(enabled=False))
    ref_calls = []
    ref = {(it["id"], lo): _ref_today(ref_calls, it["text"], it["prompt"], *lo, 3, 512) for it in _ITEMS for lo in ((60, 60), (60, 0))}
    assert _norm(seen, base) == _norm(ref_calls, base)
    for it, o in zip(_ITEMS, out):
        assert [(x["setting"], x["candidates"][0]["text"]) for x in o] == [
            (f"base={base},L={l},O={r},depth={d}", ref[(it["id"], (l, r))][d - 1]) for d in (1, 3) for l, r in ((60, 60), (60, 0))]
    assert out[0][0]["candidates"][0]["facts"]["protocol"] == "stealth_eval"


def test_the_protocol_setting_and_its_refusals():
    from stealth_eval.config import resolve_config
    from stealth_eval.dipper import recursive_outputs
    from stealth_eval.schema import Settings
    assert Settings().recursive.protocol == "stealth_eval"
    cfg = resolve_config("tiny", overrides={"recursive.methods": ["dipper_lm"], "recursive.protocol": "sadasivan"})
    assert cfg.recursive.protocol == "sadasivan"
    with pytest.raises(StealthEvalError, match="recursive.protocol"):
        resolve_config("tiny", overrides={"recursive.methods": ["m1", "dipper"], "recursive.protocol": "sadasivan"})
    with pytest.raises(StealthEvalError, match="recursive.protocol"):
        resolve_config("tiny", overrides={"recursive.protocol": "padben"})
    with pytest.raises(StealthEvalError, match="sadasivan.*DIPPER"):
        recursive_outputs([{"id": "t", "text": "x"}], {"seed": 0}, None, _stub([]), [1], protocol="sadasivan")
