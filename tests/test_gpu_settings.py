"""The paper run's GPU branches, exercised on the CPU (#24): the GPU's device settings (`--set device_profile=gpu`:
token budgets > 0, padded length buckets, bf16 weights, batched embeddings) run end to end on texts longer than the
encoder's 512 positions; each model loads once per process whatever the call's spelling; the scoring passes are stored
batch by batch, so a run killed in the middle recomputes only what was not stored."""
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from conftest import run_cli


def e5_style_encoder(folder: Path) -> Path:
    "A BERT encoder with E5-base's position limit (512) and real vocabulary size, random weights, one small layer."
    import torch
    from transformers import BertConfig, BertModel
    from stealth_eval.rehearsal import make_word_tokenizer
    make_word_tokenizer("bert", 30522, 512).save_pretrained(folder)
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                         max_position_embeddings=512)).save_pretrained(folder)
    return folder


def long_texts_file(path: Path, n_per_class: int = 5, words: int = 700) -> Path:
    "A user dataset of Lee news documents joined to about `words` words each (human and ai labels alternate)."
    from stealth_eval.data import lee_documents
    docs, rows, buf, k = lee_documents(), [], [], 0
    for d in docs:
        buf += d["text"].split()
        if len(buf) >= words:
            rows.append({"id": f"long{k}", "label": "human" if k % 2 == 0 else "ai", "domain": "news",
                         "generator": "human" if k % 2 == 0 else "unknown", "text": " ".join(buf[:words])})
            buf, k = [], k + 1
        if k == 2 * n_per_class: break
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_tiny_profile_under_gpu_settings_with_texts_past_512_tokens(tmp_path):
    enc = e5_style_encoder(tmp_path / "e5_style")
    data = long_texts_file(tmp_path / "long_news.jsonl", n_per_class=4, words=600)
    out = tmp_path / "run"
    # The GPU's settings, with the scoring budget cut from 8192 to 2048 tokens and short scoring windows: a padded
    # bucket is filled with dummy rows (a text's batch shape depends on its length alone), and Gemma's float32 head
    # (262,144 words) over 8192-token batches costs 2 cores minutes a batch. Budgets > 0, padded buckets, bf16 weights
    # and batched embeddings of texts past the encoder's 512 positions are what is exercised.
    run_cli("--profile", "tiny", "--datasets", data, "--methods", "m0", "m5",
            "--detectors", "log_likelihood", "log_rank", "fast_detectgpt", "binoculars_single",
            "--set", "device=cpu", "device_profile=gpu", "score_batch_tokens=2048", f"embedder={enc}",
            "homoglyph_rates=[0.02]", "sanitize=[\"m5\"]", "score_max_tokens=64", "score_windows.fast_detectgpt=128",
            "score_windows.binoculars_single=128", "--out_dir", out, "--offline", "--cache_dir", tmp_path / "store")
    cfg = json.loads((out / "config.json").read_text())
    # the GPU's settings, resolved once into config.json
    assert (cfg["device_profile"], cfg["dtype"], cfg["score_batch_tokens"], cfg["embed_batch_tokens"]) == ("gpu", "bfloat16", 2048, 16384)
    raw = pd.read_json(out / "raw_outputs.jsonl", lines=True)
    assert raw["text_out"].str.split().str.len().max() >= 590           # texts well past 512 encoder tokens
    q = pd.read_parquet(out / "quality.parquet")
    edited = q[q["valid"] & ((q["method"] != "m0") | (q["defense"] != "none"))]
    assert len(edited) > 0 and edited["sim"].notna().all(), edited[edited["sim"].isna()]   # every output's similarity
    assert ((edited["sim"] > -1.0001) & (edited["sim"] < 1.0001)).all()
    s = pd.read_parquet(out / "scores.parquet")
    assert s["valid"].all() and np.isfinite(s["detector_score_raw"]).all()
    assert s["detector_model"].str.contains("#bfloat16@cpu").all()       # dtype and device class in every model identity
    assert s["truncated"].all() and s.loc[s["detector_name"] == "fast_detectgpt", "score_window"].eq(128).all()


def test_each_model_loads_once_and_identities_load_nothing(tmp_path):
    from stealth_eval.config import resolve_config
    from stealth_eval.core import Cache
    from stealth_eval.detectors import DETECTORS, score_texts_windows
    from stealth_eval.models import LOADS, load_causal_lm, make_tiny_lm, similarities
    lm = str(make_tiny_lm(tmp_path / "lm"))
    enc = str(e5_style_encoder(tmp_path / "enc"))
    cfg = resolve_config("tiny", overrides={"device": "cpu", "device_profile": "gpu", "scoring_model": lm, "quality_lm": lm,
                                            "embedder": enc})
    before = dict(LOADS)
    for name in ("log_rank", "fast_detectgpt"): DETECTORS.get(name).model(cfg)   # identities: no load
    assert dict(LOADS) == before
    cache = Cache(tmp_path / "store")
    texts = ["the police said the fire was under control", "a minister said two people were at the news today"] * 3
    score_texts_windows(texts, lm, cfg, cache, [16, 64])
    load_causal_lm(lm, device="cpu", dtype="bfloat16")                # another spelling of the same load
    similarities([(a, b) for a, b in zip(texts, texts[1:])], enc, cfg, cache)
    similarities([(b, a + " news") for a, b in zip(texts, texts[1:])], enc, {**cfg.to_dict(), "device": "cpu"}, cache)
    grown = {k: v - before.get(k, 0) for k, v in LOADS.items() if v != before.get(k, 0)}
    assert grown == {("causal_lm", lm, "cpu", "bfloat16"): 1, ("embedder", enc, "cpu", "float32"): 1}, grown


def test_scoring_is_stored_batch_by_batch(tmp_path, monkeypatch):
    "A scoring pass that dies after its first batch keeps that batch: the rerun computes only the rest."
    import stealth_eval.detectors as D
    from stealth_eval.config import resolve_config
    from stealth_eval.core import Cache
    from stealth_eval.models import make_tiny_lm
    lm = str(make_tiny_lm(tmp_path / "lm"))
    cfg = resolve_config("tiny", overrides={"device": "cpu", "device_profile": "gpu", "scoring_model": lm,
                                            "score_batch_tokens": 256, "score_bucket_tokens": 16})
    words = "the police said the fire was under control and a minister said two people were at the news today".split()
    texts = [" ".join(words[(i % 7):] + words[: 3 + i]) for i in range(24)]   # lengths 16..39 tokens: several buckets
    real, calls = D.panel_batch, []
    def dying(*a, **k):
        calls.append(1)
        if len(calls) == 2: raise KeyboardInterrupt("killed")
        return real(*a, **k)
    monkeypatch.setattr(D, "panel_batch", dying)
    cache = Cache(tmp_path / "store")
    with pytest.raises(KeyboardInterrupt): D.score_texts_windows(texts, lm, cfg, cache, [64])
    stored = sum(1 for p in (tmp_path / "store").rglob("*.json") if p.is_file() and p.name != "stealth_eval_store.json")   # entries, not the marker
    assert stored > 0                                                     # the first batch is on disk
    monkeypatch.setattr(D, "panel_batch", real)
    import stealth_eval.stream as S
    asked, inner = [], S.forward_batches   # the sequences each scoring pass is asked to compute
    monkeypatch.setattr(S, "forward_batches", lambda models, seqs, *a, **k: asked.append(len(seqs)) or inner(models, seqs, *a, **k))
    got = D.score_texts_windows(texts, lm, cfg, Cache(tmp_path / "store"), [64])[64]
    fresh = D.score_texts_windows(texts, lm, cfg, Cache(tmp_path / "fresh"), [64])[64]
    assert asked == [len(set(texts)) - stored, len(set(texts))]                    # the rerun computed only what was not stored
    assert got == fresh                                                   # and equals an uninterrupted run


def test_no_scoring_window_runs_past_the_models_positions(tmp_path):
    "A window longer than the model's position table (here 128) scores the model's limit, never positions it never saw."
    from stealth_eval.config import resolve_config
    from stealth_eval.core import Cache
    from stealth_eval.detectors import score_texts_windows
    from stealth_eval.models import make_tiny_lm
    lm = str(make_tiny_lm(tmp_path / "lm"))                               # max_position_embeddings=128
    cfg = resolve_config("tiny", overrides={"device": "cpu", "device_profile": "gpu", "scoring_model": lm})
    text = "the police said the fire was under control " * 40               # 320 words
    got = score_texts_windows([text], lm, cfg, Cache(tmp_path / "store"), [64, 256])
    (h, st64), = got[64].items()
    st256 = got[256][h]
    assert st64["n_tokens"] == 63 and st256["n_tokens"] == 127 and st256["truncated"]


def test_repeated_set_options_are_all_kept():
    "`--set device=cpu --set device_profile=gpu` keeps both (argparse's default kept only the last, silently)."
    from stealth_eval.run import build_parser
    args = build_parser().parse_args(["--set", "device=cpu", "--set", "device_profile=gpu", "dtype=float32"])
    assert args.overrides == ["device=cpu", "device_profile=gpu", "dtype=float32"]
