"""The decode path under the GPU's settings, on the CPU: no host synchronisation per decode step, decode batches sized
from a KV-cache budget, vLLM's arguments derived from the run (with a stand-in `vllm` module: no GPU here), and what
is deterministic (stored generations are reused exactly; in float32 a row's tokens do not depend on its batch mates).

Models are tiny random llamas built here (real architecture, word-level tokenizer); the LoRA adapter is built with peft.
"""
import gc
import json
import sys
import types
import weakref
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from stealth_eval import models as M
from stealth_eval import paraphrase as P
from stealth_eval.core import Cache

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device here: the decode loop's syncs are counted on the CPU only (CI has no GPU)"))]
PKG = str(Path(M.__file__).resolve().parent)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(M.make_tiny_lm(tmp_path_factory.mktemp("tiny") / "lm", seed=3))


@pytest.fixture(scope="module")
def chat(tmp_path_factory):
    "A tiny chat LM whose configuration claims 4,096 positions (RoPE: no table), so a context can round up to 256s."
    d = P.make_tiny_chat_lm(tmp_path_factory.mktemp("chat") / "lm")
    conf = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**conf, "max_position_embeddings": 4096}))
    return str(d)


def _prompts(lm, n):
    words = "the a of to and in is was for on that with as by at from it he said has be are were its".split()
    return [lm.tokenizer(" ".join(words[(5 * i + j) % len(words)] for j in range(2 + i % 7))).input_ids for i in range(n)]


# ---------------------------------------------------------------- host synchronisations

class SyncCounter:
    "Counts the host synchronisations that code of the stealth_eval package asks of tensors (reads and data-dependent shapes)."
    READS = ("__bool__", "__int__", "__float__", "__index__", "item", "tolist", "cpu", "numpy", "nonzero")

    def __init__(self, monkeypatch):
        self.ours, self.theirs = 0, 0
        for name in self.READS:
            orig = getattr(torch.Tensor, name)
            monkeypatch.setattr(torch.Tensor, name, self._wrap(orig, name))
        orig_nz = torch.nonzero
        monkeypatch.setattr(torch, "nonzero", lambda *a, **k: (self._count(), orig_nz(*a, **k))[1])
        orig_get = torch.Tensor.__getitem__
        def getitem(t, idx):   # boolean-mask indexing has a data-dependent shape: a synchronisation
            parts = idx if isinstance(idx, tuple) else (idx,)
            if any(isinstance(p, torch.Tensor) and p.dtype == torch.bool for p in parts): self._count()
            return orig_get(t, idx)
        monkeypatch.setattr(torch.Tensor, "__getitem__", getitem)

    def _count(self):
        f = sys._getframe(2).f_code.co_filename
        if f.startswith(PKG): self.ours += 1
        else: self.theirs += 1

    def _wrap(self, orig, name):
        def read(t, *a, **k):
            self._count()
            return orig(t, *a, **k)
        return read


@pytest.mark.parametrize("device", DEVICES)
def test_decode_steps_make_no_host_sync(tiny, device, monkeypatch):
    "40 decode steps of 4 rows (top-p, EOS banned until the minimum) ask the host at most once per DECODE_CHECK_EVERY steps."
    monkeypatch.setattr(M, "NUCLEUS_PREFIX", ())   # the GPU's sampler on the CPU too (a CPU reads its nucleus prefixes' sizes)
    lm = M.load_causal_lm(tiny, device=device)
    prompts, steps = _prompts(lm, 4), 40
    ref = M.sample_continuations(lm, prompts, [1, 2, 3, 4], steps, [steps, steps, 10, 0], 0.9, 0.95, batch_size=4)
    counter = SyncCounter(monkeypatch)
    got = M.sample_continuations(lm, prompts, [1, 2, 3, 4], steps, [steps, steps, 10, 0], 0.9, 0.95, batch_size=4)
    monkeypatch.undo()
    assert got == ref and len(got[0]) == steps
    # one look per DECODE_CHECK_EVERY steps, one copy of the drawn tokens at the end, the queue's bookkeeping around it
    assert counter.ours <= steps // M.DECODE_CHECK_EVERY + 3, (counter.ours, counter.theirs)


def test_seeded_sample_reads_nothing_on_the_host(monkeypatch):
    z, seeds, steps = torch.randn(6, 300), torch.arange(6), torch.full((6,), 4)
    counter = SyncCounter(monkeypatch)
    for top_p in (1.0, 0.9, 0.3):
        M.seeded_sample(z, seeds, steps, 0.8, top_p, prefixes=())      # the GPU's way: the whole vocabulary
    monkeypatch.undo()
    assert counter.ours == 0
    counter = SyncCounter(monkeypatch)                                  # a CPU's way reads each prefix's size: the same draw
    for top_p in (0.9, 0.3):
        assert M.seeded_sample(z, seeds, steps, 0.8, top_p, prefixes=(8, 64)).tolist() == \
            M.seeded_sample(z, seeds, steps, 0.8, top_p, prefixes=()).tolist()
    monkeypatch.undo()
    assert counter.ours > 0


def _seeded_sample_before(scores, seeds, steps, temperature=1.0, top_p=1.0, banned=None):
    "The sampler as it was (noise drawn for the nucleus only, its size read on the host): the reference for its draws."
    z = scores.float() / max(float(temperature), 1e-6)
    if banned is not None: z = z.masked_fill(banned, float("-inf"))
    logp = torch.log_softmax(z, -1)
    cand = None
    if top_p < 1.0:
        sp, idx = torch.sort(logp, dim=-1, descending=True, stable=True)
        pr = sp.exp()
        drop = (torch.cumsum(pr, -1) - pr) >= top_p
        K = int((~drop).sum(-1).max())
        cand, logp = idx[:, :K], sp[:, :K].masked_fill(drop[:, :K], float("-inf"))
    g = -torch.log(-torch.log(M.counter_uniform(seeds, steps, logp.shape[-1] if cand is None else cand)))
    j = torch.argmax(logp.double() + g, -1)
    return j if cand is None else cand.gather(1, j[:, None])[:, 0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_full_vocabulary_noise_draws_what_the_nucleus_noise_drew(dtype):
    g = torch.Generator().manual_seed(0)
    z = (torch.randn(256, 1000, generator=g) * 4).to(dtype)
    z[:64] = z[:64].round()                                     # ties among logits: the order of ids decides
    banned = torch.zeros(256, 1000, dtype=torch.bool); banned[::5, :100] = True
    seeds, steps = torch.arange(256) * 7919, torch.arange(256) % 13
    for T, top_p in [(1.0, 1.0), (0.9, 0.95), (0.7, 0.5), (1.3, 0.999), (0.5, 0.05)]:
        for b in (None, banned):
            assert torch.equal(M.seeded_sample(z, seeds, steps, T, top_p, b), _seeded_sample_before(z, seeds, steps, T, top_p, b))


# ---------------------------------------------------------------- decode batches from a KV budget

def test_kv_bytes_match_the_cache_a_forward_pass_builds(tiny):
    "The formula against the KV cache transformers builds: a llama with grouped-query attention, float32 and bfloat16."
    lm = M.load_causal_lm(tiny, device="cpu")
    for dt in (torch.float32, torch.bfloat16):
        model = lm.model.to(dt) if dt != torch.float32 else lm.model
        with torch.no_grad(): cache = model(input_ids=torch.ones((3, 17), dtype=torch.long), use_cache=True).past_key_values
        built = sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))
        assert built == 3 * 17 * M.kv_bytes_per_token(model.config, dt)
    lm.model.to(torch.float32)
    falcon = pytest.importorskip("transformers").FalconConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=8,
                                                             multi_query=True, vocab_size=50)
    fm = __import__("transformers").FalconForCausalLM(falcon).eval()
    with torch.no_grad(): cache = fm(input_ids=torch.ones((2, 9), dtype=torch.long), use_cache=True).past_key_values
    built = sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))
    assert built == 2 * 9 * M.kv_bytes_per_token(falcon, torch.float32)


def test_decode_batches_follow_the_kv_budget_and_rows_keep_their_tokens(tiny, monkeypatch):
    "Float32: a row's tokens do not depend on its batch mates, at GPU batch sizes, under a KV cap and with refills."
    lm = M.load_causal_lm(tiny, device="cpu")
    prompts, n = _prompts(lm, 24), 24
    mx, seeds = [(7 * i) % 45 + 1 for i in range(n)], list(range(500, 500 + n))
    alone = [M.sample_continuations(lm, [p], [s], [m], 0, 0.9, 0.95)[0] for p, s, m in zip(prompts, seeds, mx)]
    per_token = M.kv_bytes_per_token(lm.model.config, torch.float32)
    longest = max(len(p) for p in prompts) + max(mx)
    kv_gb = 5.5 * per_token * longest / 2**30                  # holds 5 rows of the longest length
    sizes = []
    real = M._decode_batch
    monkeypatch.setattr(M, "_decode_batch", lambda lm_, jobs, *a, **k: (sizes.append(len(jobs)), real(lm_, jobs, *a, **k))[1])
    capped = M.sample_continuations(lm, prompts, seeds, mx, 0, 0.9, 0.95, batch_size=128, kv_gb=kv_gb)
    assert max(sizes) <= 5 and sizes[0] == 5, sizes
    sizes.clear()
    wide = M.sample_continuations(lm, prompts, seeds, mx, 0, 0.9, 0.95, batch_size=128)
    assert sizes[0] == n
    assert capped == alone and wide == alone
    assert any(len(a) < m for a, m in zip(alone, mx))          # rows ended at EOS too


def test_paraphrase_batches_take_decode_kv_gb_from_the_run(chat, tmp_path, monkeypatch):
    sizes = []
    real = M._decode_batch
    monkeypatch.setattr(M, "_decode_batch", lambda lm_, jobs, *a, **k: (sizes.append(len(jobs)), real(lm_, jobs, *a, **k))[1])
    msgs = [f"the police said the fire {'was under control ' * (i % 3)}today" for i in range(10)]
    cfg = {"seed": 0, "device": "cpu", "dtype": "float32", "paraphrase_batch_size": 8}
    tok = P.tokenizer_of(chat)
    longest = P._longest_row(tok, msgs, None, 12)
    per_token = M.kv_bytes_per_token(M.load_causal_lm(chat, device="cpu").model.config, torch.float32)
    kv_gb = 3.5 * per_token * longest / 2**30
    out = P.generate_answers(chat, msgs, list(range(10)), Cache(tmp_path / "a"), {**cfg, "decode_kv_gb": kv_gb}, 12, 0.9, 0.95)
    assert sizes and max(sizes) == 3, sizes
    sizes.clear()
    assert P.generate_answers(chat, msgs, list(range(10)), Cache(tmp_path / "b"), cfg, 12, 0.9, 0.95) == out
    assert max(sizes) == 8


# ---------------------------------------------------------------- vLLM's arguments (a stand-in vllm module)

class FakeLLM:
    "Records its arguments; answers every prompt with its last token ids and its seed; no GPU."
    made, alive = [], []

    def __init__(self, **kwargs):
        FakeLLM.made.append(kwargs)
        FakeLLM.alive.append(weakref.ref(self))

    def generate(self, prompts, params, lora_request=None):
        out = types.SimpleNamespace
        return [out(outputs=[out(text=f" ids {p['prompt_token_ids'][-2:]} seed {sp.seed} max {sp.max_tokens} "
                                     f"lora {getattr(lora_request, 'path', None)} ")]) for p, sp in zip(prompts, params)]


@pytest.fixture
def fake_vllm(monkeypatch):
    FakeLLM.made, FakeLLM.alive = [], []
    vllm = types.ModuleType("vllm")
    vllm.__version__ = "0.0-stand-in"
    vllm.LLM = FakeLLM
    vllm.SamplingParams = lambda **kw: types.SimpleNamespace(**kw)
    lora, request = types.ModuleType("vllm.lora"), types.ModuleType("vllm.lora.request")
    request.LoRARequest = lambda name, i, path: types.SimpleNamespace(name=name, id=i, path=path)
    for name, mod in (("vllm", vllm), ("vllm.lora", lora), ("vllm.lora.request", request)):
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    import transformers
    loads = []
    real = transformers.AutoModelForCausalLM.from_pretrained.__func__
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained",
                        classmethod(lambda cls, *a, **k: (loads.append(a[:1]), real(cls, *a, **k))[1]))
    return loads


def _adapter(base: str, folder: Path, r: int) -> Path:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(base)
    get_peft_model(model, LoraConfig(r=r, lora_alpha=16, target_modules=["q_proj", "v_proj"])).save_pretrained(folder)
    return folder


def test_vllm_arguments_come_from_the_run_and_no_transformers_model_loads(chat, tmp_path, fake_vllm):
    ad = str(_adapter(chat, tmp_path / "adapter", r=12))       # built before the count starts
    fake_vllm.clear()
    spec = P.adapter_spec(chat, ad, "cuda")
    cfg = {"seed": 7, "device": "cuda", "dtype": "bfloat16", "generation_backend": "vllm", "paraphrase_batch_size": 48,
           "vllm_memory_share": 0.45, "decode_kv_gb": 32.0, "trust_remote_code": False}
    msgs = [f"paraphrase: the police said the fire {'was under control ' * i}today" for i in range(6)]
    mx = [30, 200, 12, 40, 300, 5]
    cache = Cache(tmp_path / "store")
    out = P.generate_answers(spec, msgs, list(range(100, 106)), cache, cfg, mx, 0.9, 0.95)
    tok = P.tokenizer_of(chat)
    longest = max(len(M.chat_prompt_ids(tok, m)) + k for m, k in zip(msgs, mx))
    assert 256 < longest <= 512
    assert FakeLLM.made == [{"model": chat, "seed": 7, "dtype": "bfloat16", "gpu_memory_utilization": 0.45,
                             "max_model_len": 512, "max_num_seqs": 48, "trust_remote_code": False, "enable_lora": True,
                             "max_lora_rank": 16, "max_loras": 1}]
    assert out[1] == f"ids {M.chat_prompt_ids(tok, msgs[1])[-2:]} seed 101 max 200 lora {ad}"
    assert fake_vllm == []                                      # no transformers model was loaded
    gc.collect()
    assert all(r() is None for r in FakeLLM.alive)              # the engine was given back after the call
    assert P.generate_answers(spec, msgs, list(range(100, 106)), cache, cfg, mx, 0.9, 0.95) == out
    assert len(FakeLLM.made) == 1                               # all cached: no engine starts


def test_m4_with_vllm_loads_no_transformers_model(chat, tmp_path, fake_vllm, monkeypatch):
    monkeypatch.setattr(P, "pool_similarities", lambda items, pools, cfg, cache: [[1.0] * len(p) for p in pools])
    items = [{"id": f"ai{i}", "dataset": "toy", "text": "The police said the fire near the town was under control. "
              "Residents who had left their homes were told they could return today.", "label": "ai"} for i in range(2)]
    cfg = {"seed": 0, "device": "cuda", "dtype": "bfloat16", "generation_backend": "vllm", "out_dir": str(tmp_path / "run"),
           "authormist_model": chat, "n_candidates": [1, 2], "paraphrase_batch_size": 16, "trust_remote_code": False,
           "validity": {"min_words": 1, "max_len_ratio": 9.0}, "paraphrase_chunk_tokens": 24}
    out = P.method_m4(items, cfg, Cache(tmp_path / "store"))
    assert [o["setting"] for o in out[0]] == ["N=1", "N=2"]
    assert len(FakeLLM.made) == 1 and FakeLLM.made[0]["model"] == chat and FakeLLM.made[0]["enable_lora"] is False
    assert "max_lora_rank" not in FakeLLM.made[0]
    assert fake_vllm == []


# ---------------------------------------------------------------- what is deterministic under the GPU's dtype

def _bf16(spec):
    "The tiny LM in bfloat16 (the GPU's dtype), on the CPU."
    lm = M.load_causal_lm(spec, device="cpu")
    model = type(lm.model).from_pretrained(spec, dtype=torch.bfloat16).eval()
    return M.LoadedLM(lm.name, lm.identity + "#bf16-test", model, lm.tokenizer, "cpu", dict(lm.meta))


def test_bf16_stored_generations_are_reused_exactly_and_a_resumed_run_recomputes_none(chat, tmp_path):
    lm = _bf16(chat)
    msgs = [f"the minister said {'the police ' * (i % 4)}news {i}" for i in range(8)]
    seeds = list(range(40, 48))
    cache = Cache(tmp_path / "store")
    first = M.chat_generate(lm, msgs[:4], seeds[:4], cache, max_new_tokens=20, temperature=0.9, top_p=0.95, batch_size=2)
    # the same rows again beside new batch mates, another batch size and order: the stored answers come back as they were
    again = M.chat_generate(lm, msgs[::-1], seeds[::-1], cache, max_new_tokens=20, temperature=0.9, top_p=0.95, batch_size=3)
    assert again[::-1][:4] == first
    assert cache.stats()["chat_generate"] == {"hits": 4, "misses": 8}    # 4 + 8 looked up, the 4 stored ones reused
    # a run killed in its second batch keeps the first batch; the rerun computes only what is missing
    class Killed(Exception): pass
    calls, forward = {"n": 0}, lm.model.forward
    def dying(*a, **k):                                         # the process dies in the second batch's decoding
        calls["n"] += 1
        if calls["n"] > 25: raise Killed()
        return forward(*a, **k)
    lm.model.forward = dying
    killed = Cache(tmp_path / "killed")
    with pytest.raises(Killed):
        M.chat_generate(lm, msgs, seeds, killed, max_new_tokens=20, temperature=0.9, top_p=0.95, batch_size=2)
    lm.model.forward = forward
    stored = Cache(tmp_path / "killed")
    rerun = M.chat_generate(lm, msgs, seeds, stored, max_new_tokens=20, temperature=0.9, top_p=0.95, batch_size=2)
    hits = stored.stats()["chat_generate"]["hits"]
    assert 0 < hits < 8 and stored.stats()["chat_generate"]["misses"] == 8 - hits
    assert M.chat_generate(lm, msgs, seeds, stored, max_new_tokens=20, temperature=0.9, top_p=0.95, batch_size=5) == rerun


def test_the_cache_carrying_loops_raise_no_deprecation_warning(tiny):
    """The decode loop, M2's token-guided decoding and the perturbation fills' KV cache pass the cache under the name
    the installed transformers takes (`cache` since the rename, `past_key_values` before): no deprecation warning,
    neither through `warnings` nor through transformers' logger (its once-only memory cleared first, so an earlier test
    cannot hide one)."""
    import logging
    import warnings
    import transformers
    from transformers.utils import logging as hf_logging
    from stealth_eval.perturbation import _HoleyBatch
    hf_logging.warning_once.cache_clear()
    records = []
    handler = logging.Handler(); handler.emit = records.append
    hf_logging.get_logger("transformers").addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            lm = M.load_causal_lm(tiny, device="cpu")
            p = _prompts(lm, 3)
            M.sample_continuations(lm, p, [1, 2, 3], max_new_tokens=[6, 4, 9], min_new_tokens=0, temperature=0.9,
                                   top_p=0.95, batch_size=3)
            P.token_guided_generate(lm, p[0], lambda texts: [float(len(t)) for t in texts], max_new_tokens=3)
            hb = _HoleyBatch(lm, 2)
            hb.feed([p[0], p[1]]); hb.feed([[5], []], score=True)
            # M2's path: the decode loop through a LoRA-wrapped model (peft's forward takes **kwargs: found by the preflight)
            from peft import LoraConfig, get_peft_model
            from dataclasses import replace
            import copy
            adapted = replace(lm, model=get_peft_model(copy.deepcopy(lm.model), LoraConfig(r=2, target_modules=["q_proj"])).eval())
            M.sample_continuations(adapted, p[:2], [1, 2], max_new_tokens=3, min_new_tokens=0, temperature=0.9, top_p=0.95, batch_size=2)
    finally:
        hf_logging.get_logger("transformers").removeHandler(handler)
    said = [str(w.message) for w in caught] + [r.getMessage() for r in records]
    assert not [s for s in said if "past_key_values" in s or "cache_params" in s], (transformers.__version__, said)
