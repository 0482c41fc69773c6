"""T5 perturbations at the paper's scale: stored batch by batch (a SIGKILLed run resumes without recomputing a stored
pair), a length cap that grows with the number of masks (long texts fill on their first attempt), fills that do not
depend on their batch mates, T5's dtype from the settings, and a filler identity that loads nothing.

Tiny T5s are built here: `make_tiny_t5` (random weights) and `_counting_t5` below (real architecture, weights set so
that every decoding step draws from one fixed distribution: a word with probability 0.8, one of the sentinels
`<extra_id_0..9>` with about 0.2, never EOS), which makes "how many masks fit in the cap" a known quantity.
"""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from stealth_eval import perturbation as pt
from stealth_eval.core import Cache, sha256_text

WORDS = "the police said the fire was under control and a minister said it was the news of the government".split()
TEXTS = [" ".join((WORDS * 8)[k:k + n]) for k, n in enumerate([20, 24, 28, 32, 36, 40, 44, 48, 52, 56, 60, 64])]


@pytest.fixture(scope="module")
def tiny_t5(tmp_path_factory):
    return str(pt.make_tiny_t5(tmp_path_factory.mktemp("t5") / "t5"))


def _cfg(t5, **pert):
    return {"device": "cpu", "trust_remote_code": False, "seed": 0, "score_bucket_tokens": 64,
            "perturbation": {"n_perturbations": 2, "t5_model": t5, "t5_max_length": 30, "batch_size": 2, **pert}}


def _entries(store: Path) -> set:
    "Cache keys of the perturbation entries in a store folder."
    return {f"perturbation/{p.stem}" for p in (store / "perturbation").rglob("*.json")}


# ---- 1. stored batch by batch: SIGKILL in the middle, then a rerun computes only what is missing ----------------
CHILD = r"""
import json, sys, threading
from transformers import T5ForConditionalGeneration
from stealth_eval.core import Cache
from stealth_eval import perturbation as pt
cfg, store, texts, block_at = json.loads(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4])
generate, calls = T5ForConditionalGeneration.generate, [0]
def held(self, *a, **k):   # the block_at-th fill batch never ends: the parent kills the process there
    calls[0] += 1
    if calls[0] == block_at:
        print("blocked", flush=True)
        threading.Event().wait()
    return generate(self, *a, **k)
T5ForConditionalGeneration.generate = held
pt.perturb_texts(texts, "t5", cfg, Cache(store))
print("finished", flush=True)
"""


def test_sigkill_mid_perturbation_then_rerun_recomputes_no_stored_pair(tiny_t5, tmp_path, monkeypatch):
    cfg, store = _cfg(tiny_t5), tmp_path / "store"
    env = dict(os.environ, STEALTH_EVAL_PROGRESS="0", PYTHONPATH=str(Path(pt.__file__).resolve().parents[1]))   # this package
    log = open(tmp_path / "child.log", "w")
    child = subprocess.Popen([sys.executable, "-c", CHILD, json.dumps(cfg), str(store), json.dumps(TEXTS), "4"],
                             cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        line = child.stdout.readline().strip()      # waits for the child's marker: three fill batches have ended
        assert line == "blocked", (line, (tmp_path / "child.log").read_text()[-3000:])
        stored = _entries(store)                    # the store folder as the kill finds it
        child.send_signal(signal.SIGKILL)
        assert child.wait(timeout=60) == -signal.SIGKILL
    finally:
        if child.poll() is None: child.kill(); child.wait()
        log.close()
    n_pairs = len(TEXTS) * cfg["perturbation"]["n_perturbations"]
    assert 1 <= len(stored) < n_pairs, f"{len(stored)} of {n_pairs} pairs stored before the kill (0: nothing saved)"
    assert _entries(store) == stored

    rows, puts = [], []
    real_fill = pt.iter_t5_fill
    def counting_fill(t5, jobs, *a, **k):           # every (text, i) row the fill function computes
        rows.append(len(jobs))
        yield from real_fill(t5, jobs, *a, **k)
    monkeypatch.setattr(pt, "iter_t5_fill", counting_fill)
    class Recording(Cache):
        def put(self, key, value):
            puts.append(key)
            return super().put(key, value)
    resumed = pt.perturb_texts(TEXTS, "t5", cfg, Recording(store))
    assert puts and not set(puts) & stored, "a stored pair was computed again"
    assert set(puts) | stored == _entries(store) and len(_entries(store)) == n_pairs
    attempts = {k: Cache(store).get(k)["attempts"] for k in _entries(store)}
    assert sum(rows) == sum(attempts[k] for k in puts)  # fill rows only for the missing pairs (their redraws included)

    rows.clear()
    fresh = pt.perturb_texts(TEXTS, "t5", cfg, Cache(tmp_path / "uninterrupted"))
    assert resumed == fresh                         # the same perturbations as a run that was never killed
    assert sum(rows) == sum(attempts.values()) > sum(attempts[k] for k in puts)
    assert any(t is not None for v in fresh.values() for t in v["perturbed"])


# ---- 2. the length cap grows with the number of masks --------------------------------------------------------------
def _counting_t5(folder: Path, n_sentinels: int = 100) -> Path:
    """A tiny T5 whose decoder draws i.i.d. tokens: a word with probability about 0.8, one of `<extra_id_0..9>` with
    about 0.2, EOS and the other sentinels never. Every layer writes nothing but the cross-attention, whose values are equal at
    every source position: it adds one constant to the decoder's residual column 0, and the (tied) head reads the
    wanted logits from the embeddings' column 0."""
    from tokenizers import Tokenizer, models as tm, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, T5Config, T5ForConditionalGeneration
    words = sorted(set(WORDS))
    sent = [f"<extra_id_{i}>" for i in range(n_sentinels)]
    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2, **{w: i + 3 for i, w in enumerate(words + sent)}}
    t = Tokenizer(tm.WordLevel(vocab=vocab, unk_token="<unk>")); t.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=t, pad_token="<pad>", eos_token="</s>", unk_token="<unk>",
                                  additional_special_tokens=sent)
    m = T5ForConditionalGeneration(T5Config(vocab_size=len(vocab), d_model=16, d_ff=32, d_kv=4, num_layers=1, num_heads=2,
                                            decoder_start_token_id=0, pad_token_id=0, eos_token_id=1))
    logp = torch.full((len(vocab),), -30.0)     # pad, EOS, unk and sentinels 10 and up: never drawn
    logp[[vocab[w] for w in words]] = torch.log(torch.tensor(0.8 / len(words)))
    logp[[vocab[s] for s in sent[:10]]] = torch.log(torch.tensor(0.2 / 10))
    K = 1e4
    with torch.no_grad():
        for stack in (m.encoder, m.decoder):
            for blk in stack.block:
                for layer in blk.layer:
                    for att in ("SelfAttention", "EncDecAttention"):
                        if hasattr(layer, att): getattr(layer, att).o.weight.zero_()
                    if hasattr(layer, "DenseReluDense"): layer.DenseReluDense.wo.weight.zero_()
        E = m.shared.weight                         # tied: the embeddings are also the head
        E.zero_(); E[:, 1] = K
        m.encoder.final_layer_norm.weight.zero_(); m.encoder.final_layer_norm.weight[1] = 1.0   # source: 4 e_1 everywhere
        xa = m.decoder.block[0].layer[1].EncDecAttention
        xa.v.weight.zero_(); xa.v.weight[:, 1] = 1.0
        xa.o.weight[0, 0] = K / 4                   # the decoder's column 0 gets K at every step
        m.decoder.final_layer_norm.weight.zero_(); m.decoder.final_layer_norm.weight[0] = 1.0
        E[:, 0] = logp                              # calibrate the head's scale on one step, then set the logits
        enc = torch.tensor([[vocab[words[0]], vocab[words[1]]]])
        z = m(input_ids=enc, decoder_input_ids=torch.tensor([[0]])).logits[0, -1]
        E[:, 0] = logp * (logp[3] - logp[1]) / (z[3] - z[1])
    m.save_pretrained(folder); tok.save_pretrained(folder)
    return Path(folder)


def test_long_text_fills_on_its_first_attempt(tmp_path, monkeypatch):
    t5 = str(_counting_t5(tmp_path / "t5"))
    long = " ".join((WORDS * 50)[:700])
    cfg = _cfg(t5, n_perturbations=3, t5_max_length=150, t5_max_input_tokens=1024, max_attempts=10)
    rows = []
    real_fill = pt.iter_t5_fill
    def counting_fill(t5_, jobs, *a, **k):
        rows.append(len(jobs))
        yield from real_fill(t5_, jobs, *a, **k)
    monkeypatch.setattr(pt, "iter_t5_fill", counting_fill)
    P = pt.perturb_texts([long], "t5", cfg, Cache(tmp_path / "store"))[sha256_text(long)]
    assert not P["truncated"] and all(t is not None for t in P["perturbed"]), P["perturbed"]
    assert rows == [3]                              # one round, three rows: no redraw
    # the same jobs under the reference's fixed cap: too few sentinels fit, every fill fails
    loaded = pt.load_t5(t5, "cpu")
    jobs = [pt.mask_spans(long, 2, 0.3, 1, s) for s in range(3)]
    n_masks = [sum(t is pt.MASK for t in j) for j in jobs]
    assert n_masks == [52] * 3 and pt.t5_fill_length(52, 150, 10) == 522
    floor = pt.t5_fill(loaded, jobs, [0, 1, 2], max_length=150)
    scaled = pt.t5_fill(loaded, jobs, [0, 1, 2], max_length=[pt.t5_fill_length(n) for n in n_masks])
    assert all(len(f) < n for f, n in zip(floor, n_masks)), [len(f) for f in floor]
    assert all(pt.apply_fills(j, f) is not None for j, f in zip(jobs, scaled))
    # below the floor's reach the cap is the reference's 150: short texts are filled exactly as before
    assert pt.t5_fill_length(14) == 150


# ---- 3. a row's fills do not depend on its batch mates ------------------------------------------------------------
def test_fills_independent_of_batch_mates(tiny_t5):
    t5 = pt.load_t5(tiny_t5, "cpu")
    jobs = [pt.mask_spans(" ".join((WORDS * 10)[:n]), 2, 0.3, 1, s) for s, n in enumerate([70, 120, 30, 90, 100])]
    caps = [pt.t5_fill_length(sum(t is pt.MASK for t in j), floor=20, per_span=6) for j in jobs]
    ids = [len(t5[1](pt.t5_masked_text(j)).input_ids) for j in jobs]
    assert len(set(caps)) == 5 and len({n // 128 for n in ids}) == 1    # one padded bucket, five different caps
    for budget in (1024, 0):                         # padded buckets (a GPU's setting) and one unpadded text a pass
        together = pt.t5_fill(t5, jobs, list(range(5)), max_length=caps, batch_tokens=budget, granule=128, max_rows=8)
        alone = [pt.t5_fill(t5, [j], [s], max_length=[c], batch_tokens=budget, granule=128, max_rows=8)[0]
                 for s, (j, c) in enumerate(zip(jobs, caps))]
        assert together == alone
    assert len({len(f) for f in together}) > 1      # the caps matter: the rows' fills differ in number


def test_perturbations_independent_of_the_texts_beside_them(tiny_t5, tmp_path):
    cfg = _cfg(tiny_t5, n_perturbations=3, t5_max_length=20, batch_size=4)
    a = TEXTS[6]
    alone = pt.perturb_texts([a], "t5", cfg, Cache(tmp_path / "a"))
    mixed = pt.perturb_texts([TEXTS[0], a, TEXTS[11], TEXTS[3]], "t5", cfg, Cache(tmp_path / "b"))
    assert alone[sha256_text(a)] == mixed[sha256_text(a)]


# ---- 4. T5's dtype is a setting (the run's by default), and its identity loads nothing --------------
def test_t5_dtype_from_settings_and_one_load_per_spelling(tiny_t5):
    from stealth_eval.models import LOADS
    before = sum(n for k, n in LOADS.items() if k[0] == "t5" and k[1] == tiny_t5)
    a = pt.load_t5(tiny_t5, "cpu")
    assert pt.load_t5(tiny_t5, device="cpu", dtype="float32") is a and pt.load_t5(tiny_t5, "cpu", "float32") is a
    assert a[0].dtype == torch.float32
    b = pt.load_t5(tiny_t5, "cpu", dtype="bfloat16")
    assert b[0].dtype == torch.bfloat16
    assert sum(n for k, n in LOADS.items() if k[0] == "t5" and k[1] == tiny_t5) - before <= 2


def test_t5_dtype_follows_the_run_unless_set(tiny_t5, tmp_path, monkeypatch):
    """`t5_dtype='auto'` (the default) is the run's dtype: bfloat16 under the GPU settings (the reference's --half), float32
    on a CPU; a dtype set explicitly holds on every device. The dtype is in the fills' cache keys: a bf16 fill never
    answers for a float32 one (the device string alone picks nothing: device 'cpu:0' with the gpu profile here)."""
    from transformers import AutoModelForSeq2SeqLM
    seen, real = [], AutoModelForSeq2SeqLM.from_pretrained
    def recording(*a, **k):
        seen.append(k.get("dtype"))
        return real(*a, **k)
    monkeypatch.setattr(AutoModelForSeq2SeqLM, "from_pretrained", recording)
    pt._load_t5.cache_clear()
    gpu = dict(_cfg(tiny_t5, n_perturbations=1), device="cpu:0", device_profile="gpu", dtype="bfloat16")
    cpu = dict(gpu, device_profile="cpu", dtype="float32")
    pinned = dict(gpu, perturbation={**gpu["perturbation"], "t5_dtype": "float32"})
    store = Cache(tmp_path / "s")
    for c in (gpu, cpu, pinned): pt.perturb_texts(TEXTS[:1], "t5", c, store)
    assert seen == [torch.bfloat16, torch.float32]         # the pinned run loads nothing new: it is the CPU run's model
    assert len(_entries(tmp_path / "s")) == 2              # and reads the CPU run's fill: one entry per dtype


def test_hub_t5_identity_loads_no_weights(monkeypatch):
    import stealth_eval.models as models
    monkeypatch.setattr(models, "hub_identity", lambda spec, *a, **k: f"{spec}@0123abcd")
    def no_load(*a, **k): raise AssertionError("the T5 weights were loaded to read an identity")
    monkeypatch.setattr(pt, "_load_t5", no_load, raising=False)
    monkeypatch.setattr(pt, "load_t5", no_load)
    cfg = {"device": "cpu", "trust_remote_code": False, "perturbation": {"t5_model": "google-t5/t5-large"}}
    assert pt.filler_identity("t5", cfg) == "google-t5/t5-large@0123abcd"
