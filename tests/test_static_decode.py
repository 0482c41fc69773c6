"""Decoding with fixed shapes (02_models, "A decode step as one captured graph over a static cache"), on the CPU: the
static step, the step compiled whole (`torch.compile(fullgraph=True)` with the aot_eager backend: it traces the step
without a graph break, with eager numerics) and the CUDA-graph branch with a stand-in graph all draw the dynamic loop's
tokens, for a causal LM and for T5's seq2seq sampling; every static step samples from the logits of an uncached pass
(positions, masks and cache slots exact); the step asks the host nothing; `decode_step` is a device setting that
reaches every decoder of a run. Models are tiny and built here: `make_tiny_lm`'s llama, `make_tiny_t5`'s T5 (its
output head nudged toward EOS and the sentinels, so rows end at their own steps), a tiny Mistral with a sliding window.
"""
import inspect
import sys
from contextlib import contextmanager, nullcontext
from pathlib import Path
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from stealth_eval import models as M
from stealth_eval.core import Cache

PKG = str(Path(M.__file__).resolve().parent)
AOT_EAGER = {"backend": "aot_eager", "fullgraph": True}   # the CPU's stand-in for mode="reduce-overhead": the same trace


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return M.load_causal_lm(str(M.make_tiny_lm(tmp_path_factory.mktemp("tiny") / "lm", seed=3)), device="cpu")


@pytest.fixture(scope="module")
def t5(tmp_path_factory):
    "A tiny T5 whose head favours EOS (+1.5) and the first sentinels (+2): rows end at EOS or their stop token early."
    from transformers import AutoTokenizer, T5ForConditionalGeneration
    from stealth_eval.perturbation import make_tiny_t5
    f = make_tiny_t5(tmp_path_factory.mktemp("t5") / "t5")
    model, tok = T5ForConditionalGeneration.from_pretrained(f).eval(), AutoTokenizer.from_pretrained(f)
    bias = torch.zeros(model.config.vocab_size)
    bias[tok.eos_token_id] = 1.5
    bias[[tok.convert_tokens_to_ids(f"<extra_id_{k}>") for k in range(4)]] = 2.0
    model.lm_head.register_forward_hook(lambda mod, inp, out: out + bias)
    return model, tok, str(f)


@pytest.fixture
def aot_eager(monkeypatch):
    monkeypatch.setattr(M, "STEP_COMPILE", dict(AOT_EAGER))
    yield
    torch._dynamo.reset()


PROMPTS = ("the police said", "a fire", "the minister said the government", "news", "the police said")
MAX, MIN, SEEDS = [40, 3, 40, 17, 40], [0, 0, 30, 5, 30], [5, 6, 7, 8, 5]   # row 4: row 0 with EOS banned before 30


def _jobs(lm, rows=range(5)):
    return [{"prompt": lm.tokenizer(PROMPTS[r]).input_ids, "new": [], "seed": SEEDS[r], "mn": MIN[r], "mx": MAX[r]} for r in rows]


def _decode(lm, mode, top_p, rows=range(5), **kw):
    jobs = _jobs(lm, rows)
    M._decode_batch(lm, jobs, M._eos_ids(lm), 3, 0.9, top_p, mode=mode, rows=8, **kw)
    return [(j["new"], j.get("ended", False)) for j in jobs]


def test_static_and_compiled_steps_draw_the_dynamic_loops_tokens(tiny, aot_eager):
    "Rows of 1 to 5 prompt tokens, one ending at EOS, one with EOS banned before 30, top-p below 1 and at 1, dummy rows."
    for top_p in (0.9, 1.0):
        ref = _decode(tiny, "dynamic", top_p)
        assert len(ref[0][0]) < 30 <= len(ref[4][0]) and len(ref[1][0]) == 3 and all(e for _, e in ref), ref
        assert _decode(tiny, "static", top_p) == ref
        assert [_decode(tiny, "static", top_p, rows=[r])[0] for r in range(5)] == ref   # each row alone: its tokens
    runs = dict(M.DECODE_RUNS)
    assert _decode(tiny, "compile", 0.9) == _decode(tiny, "dynamic", 0.9)   # traced whole (fullgraph), eager numerics
    assert M.DECODE_RUNS["causal", "compile"] == runs.get(("causal", "compile"), 0) + 1   # compiled, not fallen back


def test_the_queue_with_refills_gives_the_same_tokens(tiny):
    "Through `sample_continuations`: batches of 4 with refills, the static decoder of a shape reused; and the KGW-style"
    "logits processors, which read the sequence on the host, keep the dynamic loop."
    q = [tiny.tokenizer(" ".join([PROMPTS[i % 4]] * (1 + i % 3))).input_ids for i in range(11)]
    args = (tiny, q, list(range(11)), [4 + (7 * i) % 33 for i in range(11)], [0, 6] * 5 + [0], 0.9, 0.95)
    built, real = [], M._CausalDecoder
    class Counted(real):
        def __init__(self, *a, **k): built.append(a[1:3]); super().__init__(*a, **k)
    M._CausalDecoder = Counted
    try: static = M.sample_continuations(*args, batch_size=4, decode_step="static")
    finally: M._CausalDecoder = real
    assert static == M.sample_continuations(*args, batch_size=4)
    before = M.DECODE_RUNS["causal", "static"]
    assert before > len(built) >= 1, (before, built)                   # several batches, fewer decoders
    proc = lambda ids, scores: scores                                  # a processor: the dynamic loop, whatever the mode
    dyn = M.DECODE_RUNS["causal", "dynamic"]
    assert M.sample_continuations(*args, batch_size=4, decode_step="static", logits_processors=[proc]) == static
    assert M.DECODE_RUNS["causal", "static"] == before and M.DECODE_RUNS["causal", "dynamic"] > dyn


def _fills(t5, mode, top_p, stops):
    model, tok, _ = t5
    texts = ("the police said <extra_id_0> minister <extra_id_1> the", "fire <extra_id_0> news of the government",
             "he was <extra_id_0>", "a <extra_id_0> of <extra_id_1> to <extra_id_2> in", "<extra_id_0> the")
    ids = [tok(t).input_ids for t in texts]
    st = [tok.convert_tokens_to_ids(f"<extra_id_{t.count('<extra_id')}>") for t in texts] if stops else None
    return st, [(rows, g.tolist()) for rows, g in M.iter_seq2seq_sample(
        model, tok, "cpu", ids, [3, 4, 5, 6, 7], [30, 12, 40, 25, 9], top_p, batch_tokens=64, granule=16, max_rows=4,
        stop_ids=st, step_mode=mode)]


def test_seq2seq_static_and_compiled_fills_are_generates(t5, aot_eager):
    "T5's fills: the same ids as `generate` with `SeededSampler` (stop tokens, EOS, pads after it, generate's width)."
    for top_p in (1.0, 0.9):
        for stops in (False, True):
            st, ref = _fills(t5, "dynamic", top_p, stops)
            assert _fills(t5, "static", top_p, stops)[1] == ref
    eos = t5[1].eos_token_id
    assert [r for rows, g in ref for r, s in zip(g, [st[i] for i in rows]) if s in r and r[r.index(s) + 1] == eos]
    assert len(ref[1][1][0]) < 9, ref                                  # generate stopped before the cap: so does the loop
    before = M.DECODE_RUNS["seq2seq", "compile"]
    assert _fills(t5, "compile", 0.9, True)[1] == ref
    assert M.DECODE_RUNS["seq2seq", "compile"] == before + 2           # both batches compiled, none fallen back


def test_every_static_step_sees_the_logits_of_an_uncached_pass(tiny, t5, monkeypatch):
    """Positions, masks and cache slots checked below the tokens: the logits each static step samples from are, to 1e-4,
    those of one uncached, unpadded forward pass over the row's prompt and drawn tokens (teacher forcing); for T5 the
    decoder's pass over the generated ids, up to each row's EOS."""
    seen, real = [], M.seeded_sample
    monkeypatch.setattr(M, "seeded_sample", lambda scores, *a, **k: (seen.append(scores.float().clone()), real(scores, *a, **k))[1])
    jobs = _jobs(tiny)
    M._decode_batch(tiny, jobs, M._eos_ids(tiny), 3, 0.9, 0.9, mode="static", rows=8)
    with torch.no_grad():
        for r, j in enumerate(jobs):                           # prompts of 1 to 5 tokens: left padding of 0 to 4
            full = tiny.model(input_ids=torch.tensor([j["prompt"] + j["new"]])).logits[0]
            for i in range(len(j["new"])):
                assert torch.allclose(seen[i][r], full[len(j["prompt"]) - 1 + i], atol=1e-4), (r, i)
    seen.clear()
    model, tok, _ = t5
    (rows, g), *_ = _fills(t5, "static", 0.9, True)[1]
    enc, mask = M.pad_batch([tok(t).input_ids for t in ("the police said <extra_id_0> minister <extra_id_1> the",
                             "fire <extra_id_0> news of the government", "he was <extra_id_0>",
                             "a <extra_id_0> of <extra_id_1> to <extra_id_2> in")], 4, 16, 0)
    with torch.no_grad():
        for r in range(4):
            ids = g[r][:g[r].index(tok.eos_token_id) if tok.eos_token_id in g[r] else len(g[r])]
            full = model(input_ids=enc[r:r + 1], attention_mask=mask[r:r + 1], decoder_input_ids=torch.tensor([ids])).logits[0]
            for i in range(min(len(ids), len(g[r]) - 1)):     # the draw at position i gave id i + 1
                assert torch.allclose(seen[i][r], full[i], atol=1e-4), (r, i)


class HostReads:
    "Counts every host synchronisation a tensor is asked for, from any file (ours and transformers')."
    READS = ("__bool__", "__int__", "__float__", "__index__", "item", "tolist", "cpu", "numpy", "nonzero")

    def __init__(self, monkeypatch):
        self.n = 0
        for name in self.READS: monkeypatch.setattr(torch.Tensor, name, self._wrap(getattr(torch.Tensor, name)))
        orig_nz, orig_get = torch.nonzero, torch.Tensor.__getitem__
        monkeypatch.setattr(torch, "nonzero", lambda *a, **k: (self._hit(), orig_nz(*a, **k))[1])
        def getitem(t, idx):   # boolean-mask indexing has a data-dependent shape: a synchronisation
            if any(isinstance(p, torch.Tensor) and p.dtype == torch.bool for p in (idx if isinstance(idx, tuple) else (idx,))):
                self._hit()
            return orig_get(t, idx)
        monkeypatch.setattr(torch.Tensor, "__getitem__", getitem)

    def _hit(self): self.n += 1

    def _wrap(self, orig):
        def read(t, *a, **k):
            self._hit()
            return orig(t, *a, **k)
        return read


def test_the_static_steps_ask_the_host_nothing(tiny, t5, monkeypatch):
    "20 causal steps (top-p, EOS banned until the minimum) and 20 T5 steps: no host read at all, in our code or below it."
    dec = M._CausalDecoder(tiny, 8, 64, M._eos_ids(tiny), 0.9, 0.9, "static")
    s2s = M._Seq2SeqDecoder(t5[0], 4, 16, 64, 0, 1, 0.9, True, "static", "cpu")
    with torch.no_grad():
        dec.start(_jobs(tiny), 3)
        enc, mask = M.pad_batch([t5[1]("the police said <extra_id_0> minister").input_ids] * 4, 4, 16, 0)
        s2s.start(enc, mask, [1, 2, 3, 4], [28] * 4, 0)
        reads = HostReads(monkeypatch)
        for _ in range(20): dec.run(); s2s.run()
    monkeypatch.undo()
    assert reads.n == 0
    reads = HostReads(monkeypatch)                                     # a whole batch: one look every 8 steps
    M._decode_batch(tiny, _jobs(tiny), M._eos_ids(tiny), 3, 0.9, 0.9, mode="static", rows=8)
    monkeypatch.undo()
    assert reads.n <= 40 // M.DECODE_CHECK_EVERY + 6, reads.n        # the looks, the prefill's setup, the final copy


class FakeGraph:
    "A CUDA graph on the CPU: capturing records the step and runs nothing (the state is put back); replay runs it."
    made = []

    def __init__(self):
        FakeGraph.made.append(self)
        self.replays = 0

    def replay(self):
        self.replays += 1
        self.step()


def test_the_cuda_graph_branch_with_a_stand_in_graph(tiny, monkeypatch):
    """decode_step=cuda_graph as a CUDA device runs it: the warm-up steps as is, one capture (which runs nothing), then
    replays; a second batch of the same shape replays the same graph. Tokens: the dynamic loop's."""
    pool = {}
    def state(dec):
        return [v for v in vars(dec).values() if isinstance(v, torch.Tensor)] + \
               [t for l in dec.cache.layers for t in (l.keys, l.values, l.cumulative_length)]
    @contextmanager
    def capture(g, stream=None):
        dec = pool["dec"]
        saved = [t.clone() for t in state(dec)]
        g.step = dec.step
        yield
        for t, s in zip(state(dec), saved): t.copy_(s)
    stream = SimpleNamespace(wait_stream=lambda s: None)
    monkeypatch.setattr(M, "device_class", lambda device="auto": "cuda")
    monkeypatch.setattr(torch.cuda, "CUDAGraph", FakeGraph)
    monkeypatch.setattr(torch.cuda, "graph", capture)
    monkeypatch.setattr(torch.cuda, "Stream", lambda: stream)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: nullcontext())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: stream)
    FakeGraph.made = []
    for top_p in (0.9, 0.9):                                           # the same shape twice: one capture
        jobs = _jobs(tiny)
        M._decode_batch(tiny, jobs, M._eos_ids(tiny), 3, 0.9, top_p, mode="cuda_graph", rows=8, pool=pool)
        monkeypatch.setattr(M, "device_class", lambda device="auto": "cpu")
        assert [(j["new"], j.get("ended", False)) for j in jobs] == _decode(tiny, "dynamic", top_p)
        monkeypatch.setattr(M, "device_class", lambda device="auto": "cuda")
    assert len(FakeGraph.made) == 1 and FakeGraph.made[0].replays > 40, FakeGraph.made
    assert pool["dec"].run.ran == "cuda_graph" and pool["dec"].run.calls - FakeGraph.made[0].replays == M.CUDA_GRAPH_WARMUP


def test_models_with_sliding_windows_keep_the_dynamic_loop(tiny):
    from transformers import MistralConfig, MistralForCausalLM
    torch.manual_seed(0)
    cfg = MistralConfig(vocab_size=tiny.model.config.vocab_size, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                        num_attention_heads=2, num_key_value_heads=1, head_dim=8, sliding_window=8, eos_token_id=2, pad_token_id=3)
    lm = M.LoadedLM("mistral", "mistral@test", MistralForCausalLM(cfg).eval(), tiny.tokenizer, "cpu")
    runs = dict(M.DECODE_RUNS)
    assert _decode(lm, "static", 0.9) == _decode(lm, "dynamic", 0.9)
    assert M.DECODE_RUNS["causal", "dynamic"] == runs.get(("causal", "dynamic"), 0) + 2
    assert M.DECODE_RUNS["causal", "static"] == runs.get(("causal", "static"), 0)


class Seen(Exception): pass


def _spy(real, key):
    "A stand-in for `real` that stops the caller with the value it passed for `key` (by keyword or by position)."
    def spy(*a, **k):
        raise Seen(inspect.signature(real).bind(*a, **k).arguments.get(key))
    return spy


def test_decode_step_is_a_device_setting_that_reaches_every_decoder(tiny, t5, tmp_path, monkeypatch):
    from stealth_eval import data as D, dipper as dp, humanify as H, paraphrase as P, perturbation as pt
    from stealth_eval.config import resolve_device_settings
    from stealth_eval.schema import Settings, SettingsError
    assert resolve_device_settings({"device": "cpu"})["decode_step"] == "dynamic"
    assert resolve_device_settings({"device": "cpu", "device_profile": "gpu"})["decode_step"] == "cuda_graph"
    assert resolve_device_settings({"device": "cpu", "decode_step": "static"})["decode_step"] == "static"
    with pytest.raises(SettingsError, match="decode_step"): Settings.from_dict({"decode_step": "graph"})
    cfg = {**Settings().to_dict(), "device": "cpu", "dtype": "float32", "decode_step": "compile", "seed": 0}
    cache = Cache(tmp_path / "store")
    # 00_data's continuations
    monkeypatch.setattr(M, "iter_continuations", _spy(M.iter_continuations, "decode_step"))
    docs = [{"id": "d0", "ids": list(range(4, 40))}]
    with pytest.raises(Seen, match="compile"):
        D._lee_continue({**cfg, "generator": tiny.name, "data": {**cfg["data"], "prompt_tokens": 8}}, cache, "x", docs, "toy")
    # the paraphrasers (M1-M4, dipper_lm, recursion: generate_answers) and polishing
    monkeypatch.setattr(M, "chat_generate", _spy(M.chat_generate, "decode_step"))
    with pytest.raises(Seen, match="compile"): P.generate_answers(tiny, ["the police"], [0], cache, cfg, 8, 0.9, 0.95)
    item = {"id": "h0", "text": "the police said the fire was under control", "label": "human", "dataset": "toy"}
    with pytest.raises(Seen, match="compile"): H.method_polish([item], cfg, cache)
    # DIPPER and T5's fills
    monkeypatch.setattr(dp, "load_dipper", lambda c: (t5[0], t5[1], "t5@test", "cpu"))
    monkeypatch.setattr(dp, "t5_generate", _spy(dp.t5_generate, "step_mode"))
    with pytest.raises(Seen, match="compile"): dp.method_dipper([{**item, "label": "ai"}], cfg, cache)
    monkeypatch.setattr(pt, "load_t5", lambda *a, **k: (t5[0], t5[1], "t5@test", "cpu"))
    monkeypatch.setattr(pt, "iter_t5_fill", _spy(pt.iter_t5_fill, "step_mode"))
    with pytest.raises(Seen, match="compile"):
        pt.perturb_texts([item["text"] * 3], "t5", {**cfg, "perturbation": {**cfg["perturbation"], "t5_model": t5[2]}}, cache)
