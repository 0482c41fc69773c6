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
