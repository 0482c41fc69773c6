"""Classifier and watermark detectors (stealth_eval.supervised) and the data stage's training split, on tiny random models."""
import json
import math

import numpy as np
import pandas as pd
import pytest
import torch

from stealth_eval.core import Cache, read_json, sha256_text, write_jsonl
from stealth_eval.data import (benchmark_train_split, load_run_dataset, load_train_split, run_data_stage, stratified_sample,
                               train_split_path)
from stealth_eval.models import load_causal_lm, make_tiny_lm, sample_continuations
from stealth_eval.supervised import (CLASSIFIER_OFFLINE, KGW_WATERMARK, ROBERTA_OPENAI, KGWLogitsProcessor, kgw_zscore,
                                     load_sequence_classifier, make_tiny_classifier, predict_logistic, watermark_params)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    return {"gen": str(make_tiny_lm(d / "gen")), "score": str(make_tiny_lm(d / "score", seed=1)),
            "emb": str(make_tiny_lm(d / "emb", seed=2)), "clf": str(make_tiny_classifier(d / "clf"))}


def base_cfg(tiny, out, **kw):
    cfg = {"datasets": [{"name": "lee_news", "path": None}, {"name": "lee_news_kgw", "path": None}], "out_dir": str(out),
           "generator": tiny["gen"], "scoring_model": tiny["score"], "embedder": tiny["emb"], "device": "cpu",
           "trust_remote_code": False, "seed": 0, "profile": "test", "validity": {"min_words": 10}, "score_max_tokens": 128,
           "detectors": ["log_likelihood", "classifier_offline", "kgw_watermark"], "methods": ["m0"],
           "data": {"n_per_class": 6, "n_train_per_class": 5, "min_tokens": 30, "max_tokens": 90, "prompt_tokens": 5,
                    "temperature": 0.7, "top_p": 1.0, "batch_size": 4},
           "watermark": {"gamma": 0.25, "delta": 2.0}, "cache_dir": str(out / "cache")}
    cfg.update(kw)
    return cfg


def direct_z(ids, gamma, key, V):
    "KGW z-score by counting green tokens one by one (lefthash: green list seeded by key x previous token)."
    g, green = torch.Generator(), 0
    for prev, tok in zip(ids[:-1], ids[1:]):
        g.manual_seed(key * prev)
        green += tok in torch.randperm(V, generator=g)[: int(V * gamma)].tolist()
    T = len(ids) - 1
    return (green - gamma * T) / math.sqrt(T * gamma * (1 - gamma))


# ---------------------------------------------------------------- watermark

def test_watermark_raises_z_and_matches_direct_count(tiny):
    lm = load_causal_lm(tiny["gen"], device="cpu")
    p = watermark_params({"watermark": {"gamma": 0.25, "delta": 2.0, "key": 12345}})
    V = lm.model.config.vocab_size
    prompts = [lm.tokenizer(t).input_ids for t in ("the police said", "a fire in the", "the minister", "news today")]
    kw = dict(seeds=[11, 12, 13, 14], max_new_tokens=100, min_new_tokens=100, temperature=0.7, batch_size=2)
    plain = sample_continuations(lm, prompts, **kw)
    marked = sample_continuations(lm, prompts, **kw, logits_processors=[KGWLogitsProcessor(p, V, 0.7)])
    assert plain != marked
    z_plain = [kgw_zscore(c, p, lm.model.config)["kgw_z"] for c in plain]
    z_marked = [kgw_zscore(c, p, lm.model.config)["kgw_z"] for c in marked]
    assert min(z_marked) > 6 and max(z_plain) < 3, (z_marked, z_plain)
    for c in plain + marked:
        st = kgw_zscore(c, p, lm.model.config)
        body = c[1:] if c[0] == lm.tokenizer.bos_token_id else c      # a leading BOS is not scored (WatermarkDetector)
        assert st["kgw_scored"] == len(body) - 1
        assert abs(st["kgw_z"] - direct_z(body, 0.25, 12345, V)) < 1e-9
    # the same key on another machine: batch composition does not change the watermarked tokens
    again = sample_continuations(lm, prompts[::-1], **{**kw, "seeds": kw["seeds"][::-1], "batch_size": 3},
                                 logits_processors=[KGWLogitsProcessor(p, V, 0.7)])
    assert again[::-1] == marked
    # a different key does not see the watermark
    other = watermark_params({"watermark": {"key": 999}})
    assert max(kgw_zscore(c, other, lm.model.config)["kgw_z"] for c in marked) < 4


def test_kgw_detector_interface(tiny, tmp_path):
    cfg = {"generator": tiny["gen"], "device": "cpu", "trust_remote_code": False, "watermark": {"key": 7}}
    assert KGW_WATERMARK.direction == 1 and KGW_WATERMARK.unavailable(cfg) == ""
    assert "watermark.gamma=0: values must lie in (0, 1]" in KGW_WATERMARK.unavailable({**cfg, "watermark": {"gamma": 0}})
    texts = ["the police said the fire was in the news today", "the"]
    out = KGW_WATERMARK.compute(texts, cfg, Cache(tmp_path))
    assert out[sha256_text("the")] is None
    st = out[sha256_text(texts[0])]
    assert st["n_tokens_input"] == 10 and st["kgw_scored"] == 9 and st["truncated"] is False
    assert KGW_WATERMARK.source(cfg) != KGW_WATERMARK.source({**cfg, "watermark": {"key": 8}})


# ---------------------------------------------------------------- data stage: training split and the watermarked dataset

@pytest.fixture(scope="module")
def data_run(tiny, tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    cfg = base_cfg(tiny, out)
    summary = run_data_stage(cfg)
    return cfg, out, summary


def test_train_split_disjoint_and_counted(data_run):
    cfg, out, summary = data_run
    for name in ("lee_news", "lee_news_kgw"):
        ev, tr = load_run_dataset(out, name), load_train_split(out, name)
        assert tr is not None and list(tr.columns[:5]) == ["id", "label", "domain", "generator", "text"]
        assert set(ev["source_id"]).isdisjoint(tr["source_id"]), name          # no document both trained on and evaluated
        assert set(ev["text"]).isdisjoint(tr["text"])
        assert (tr["label"] == "human").sum() == 5 and (tr["label"] == "ai").sum() <= 5
        h, a = set(tr.loc[tr.label == "human", "source_id"]), set(tr.loc[tr.label == "ai", "source_id"])
        assert h.isdisjoint(a)                                                # AI continues *other* unused documents
        card = read_json(out / "data" / f"{name}.card.json")
        assert card["train_split"]["path"] == f"data/{name}.train.jsonl"
        assert card["train_split"]["by_label"] == tr["label"].value_counts().to_dict()
        assert card["dropped"]["train_split"] == 10
    evs = set(load_run_dataset(out, "lee_news")["source_id"]) | set(load_run_dataset(out, "lee_news_kgw")["source_id"])
    trs = set(load_train_split(out, "lee_news")["source_id"]) | set(load_train_split(out, "lee_news_kgw")["source_id"])
    assert evs.isdisjoint(trs)
    assert list(summary["train"]) == [10 - sum(c["train_split"]["dropped"].values()) for c in
                                      (read_json(out / "data" / f"{n}.card.json") for n in ("lee_news", "lee_news_kgw"))]


def test_eval_sample_unchanged_by_train_split(data_run, tiny, tmp_path):
    cfg, out, _ = data_run
    cfg2 = base_cfg(tiny, tmp_path, detectors=["log_likelihood"], datasets=[{"name": "lee_news", "path": None}],
                    cache_dir=cfg["cache_dir"])
    (tmp_path / "data").mkdir()
    stale = train_split_path(tmp_path, "lee_news"); stale.write_text("{}\n")
    run_data_stage(cfg2)
    assert not stale.exists()                                                 # a split from an earlier run is removed
    a, b = load_run_dataset(out, "lee_news"), load_run_dataset(tmp_path, "lee_news")
    assert a["text"].tolist() == b["text"].tolist()
    assert "not needed" in read_json(tmp_path / "data" / "lee_news.card.json")["train_split"]["note"]


def test_kgw_dataset_same_humans_watermarked_ai(data_run):
    cfg, out, _ = data_run
    plain, marked = load_run_dataset(out, "lee_news"), load_run_dataset(out, "lee_news_kgw")
    hp, hm = plain[plain.label == "human"], marked[marked.label == "human"]
    common = set(hp["source_id"]) & set(hm["source_id"])
    assert len(common) >= 3
    assert (hp.set_index("source_id").loc[sorted(common), "text"] == hm.set_index("source_id").loc[sorted(common), "text"]).all()
    ap, am = plain[plain.label == "ai"].set_index("source_id"), marked[marked.label == "ai"].set_index("source_id")
    both = sorted(set(ap.index) & set(am.index))
    assert all(ap.loc[s, "text"] != am.loc[s, "text"] for s in both)
    assert set(am["generator"]) == {f"{cfg['generator']}+kgw"}
    z = KGW_WATERMARK.compute(list(ap["text"]) + list(am["text"]), cfg, Cache(cfg["cache_dir"]))
    zp = [z[sha256_text(t)]["kgw_z"] for t in ap["text"]]
    zm = [z[sha256_text(t)]["kgw_z"] for t in am["text"]]
    assert min(zm) > max(zp), (zm, zp)
    assert np.mean(zm) > 4 and abs(np.mean(zp)) < 2.5, (zm, zp)


def test_benchmark_train_split_by_source_id():
    recs = [{"id": f"h{i}", "label": "human", "source_id": f"s{i}", "text": f"human {i} " + "w " * 10} for i in range(30)]
    recs += [{"id": f"a{i}", "label": "ai", "source_id": f"s{i}", "text": f"ai {i} " + "w " * 10} for i in range(30)]
    recs += [{"id": f"e{i}", "label": "ai", "edit": "polish", "source_id": f"s{i}", "text": f"e {i} " + "w " * 10} for i in range(30)]
    ev, _ = stratified_sample(recs, 5, 0, "toy")
    tr, note = benchmark_train_split(recs, ev, 6, 0, "toy")
    assert len(tr) == 12 and not any(r.get("edit") for r in tr)
    assert {r["source_id"] for r in tr}.isdisjoint({r["source_id"] for r in ev})
    tr2, note2 = benchmark_train_split(recs, ev, 40, 0, "toy")
    assert tr2 is None and "fewer than data.n_train_per_class=40" in note2


# ---------------------------------------------------------------- offline classifier

def test_classifier_offline_trains_saves_and_scores(data_run):
    cfg, out, _ = data_run
    assert CLASSIFIER_OFFLINE.unavailable(cfg) == ""
    ev = pd.concat([load_run_dataset(out, n) for n in ("lee_news", "lee_news_kgw")])
    texts = list(dict.fromkeys(ev["text"]))
    cache = Cache(cfg["cache_dir"])
    res = CLASSIFIER_OFFLINE.compute(texts, cfg, cache)
    assert all(0 <= res[sha256_text(t)]["p_ai"] <= 1 for t in texts)
    m = json.loads((out / "models" / "classifier_offline.json").read_text())
    card = read_json(out / "models" / "classifier_offline.card.json")
    assert card["training"]["n_human"] == 5 and card["training"]["n_ai"] > 0   # the two datasets share their human texts
    assert card["training"]["n_duplicate"] == 5 and card["training"]["n_excluded_scored"] == 0
    assert len(m["coef"]) == len(m["features"]) == card["features"]["embedding_dims"] + 5
    assert not list((out / "models").glob("*.pkl"))
    # the saved JSON alone reproduces the scores
    from stealth_eval.supervised import offline_features
    _, feats = offline_features(texts[:3], cfg, cache)
    for t in texts[:3]:
        assert abs(predict_logistic(m, feats[sha256_text(t)][0][None])[0] - res[sha256_text(t)]["p_ai"]) < 1e-12
    # a second run fits nothing and gives the same scores
    hits = cache.hits["classifier_offline_fit"]
    assert CLASSIFIER_OFFLINE.compute(texts, cfg, cache) == res and cache.hits["classifier_offline_fit"] == hits + 1
    # a training text among the scored texts is left out of training, and counted
    tr_text = load_train_split(out, "lee_news")["text"].iloc[0]
    CLASSIFIER_OFFLINE.compute(texts + [tr_text], cfg, cache)
    assert read_json(out / "models" / "classifier_offline.card.json")["training"]["n_excluded_scored"] == 1


def test_classifier_offline_unavailable_without_split(tiny, tmp_path):
    cfg = base_cfg(tiny, tmp_path)
    assert "no training split" in CLASSIFIER_OFFLINE.unavailable(cfg)


# ---------------------------------------------------------------- Hugging Face sequence classifier

def test_hf_classifier_probability_truncation_and_label(tiny, monkeypatch):
    cfg = {"classifier_model": tiny["clf"], "classifier_ai_label": 0, "device": "cpu", "trust_remote_code": False,
           "classifier_batch_size": 3}
    assert ROBERTA_OPENAI.unavailable(cfg) == "" and ROBERTA_OPENAI.direction == 1
    long = " ".join(["the police said"] * 15)
    texts = ["the minister said today", "a fire in the news was", long, "he said"]
    res = ROBERTA_OPENAI.compute(texts, cfg, Cache(enabled=False))
    model, tok, _ = load_sequence_classifier(tiny["clf"], "cpu")
    for t in texts:
        with torch.no_grad():
            p = torch.softmax(model(**tok(t, truncation=True, max_length=32, return_tensors="pt")).logits.double(), -1)[0]
        assert abs(res[sha256_text(t)]["p_ai"] - float(p[0])) < 1e-6
    assert res[sha256_text(long)]["truncated"] and res[sha256_text(long)]["n_tokens_input"] == 47
    assert not res[sha256_text(texts[0])]["truncated"]
    assert "a human label" in ROBERTA_OPENAI.unavailable({**cfg, "classifier_ai_label": "Real"})
    by_name = ROBERTA_OPENAI.compute(texts[:1], {**cfg, "classifier_ai_label": "fake"}, Cache(enabled=False))
    assert abs(by_name[sha256_text(texts[0])]["p_ai"] - res[sha256_text(texts[0])]["p_ai"]) < 1e-6   # alone vs batched


def test_hf_classifier_offline_hub_id_is_skipped(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))           # an empty hub cache
    why = ROBERTA_OPENAI.unavailable({"classifier_model": "openai-community/roberta-large-openai-detector",
                                      "device": "cpu", "trust_remote_code": False})
    assert "offline" in why and "roberta-large-openai-detector" in why
    assert "no classifier_model" in ROBERTA_OPENAI.unavailable({"device": "cpu", "trust_remote_code": False})
