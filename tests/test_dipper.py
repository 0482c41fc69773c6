"""DIPPER (14_dipper): the reference's input strings and windows, the T5 load and generate path on a tiny random T5
built here from a config, the skip with a reason when the model cannot load, and the offline stand-in's protocol.

Expected strings are written from the reference loop (martiansideofthemoon/ai-detection-paraphrases,
`dipper_paraphrases/paraphrase_minimal.py`): whitespace collapsed, sentences split, windows of `sent_interval`
sentences joined by a space, input `lexical = {100-L}, order = {100-O}` + ` {prefix}` (when non-empty) +
` <sent> {window} </sent>`, then `prefix += " " + output` and `output_text += " " + output`.
"""
from pathlib import Path

import pytest

from stealth_eval.components import METHODS
from stealth_eval.core import Cache, ComponentUnavailable
from stealth_eval import dipper as dp

TEXT = "It is quick and brown.  It jumps over\nthe lazy dog. The dog sleeps. Then it wakes up."


def _echo_numbered(log):
    "A stand-in generator: output k of the run is 'P{k}.' (records every input and seed)."
    def gen(inputs, seeds):
        log.extend(zip(inputs, seeds))
        return [f"P{len(log) - len(inputs) + i + 1}." for i in range(len(inputs))]
    return gen


def test_inputs_and_windows_are_the_reference_loops():
    log = []
    job = {"text": TEXT, "prefix": "Tracy is\na fox.", "lex_code": 40, "order_code": 40, "seed": 0}
    r = dp.dipper_loop([job], 3, _echo_numbered(log))[0]
    assert r["inputs"] == [
        "lexical = 40, order = 40 Tracy is a fox. <sent> It is quick and brown. It jumps over the lazy dog. The dog sleeps. </sent>",
        "lexical = 40, order = 40 Tracy is a fox. P1. <sent> Then it wakes up. </sent>"]
    assert r["text"] == "P1. P2." and r["n_windows"] == 2
    # no prompt: the first input has no prefix; the next holds the output after the reference's two spaces
    r = dp.dipper_loop([{**job, "prefix": "", "lex_code": 40, "order_code": 100}], 2, _echo_numbered([]))[0]
    assert r["inputs"] == ["lexical = 40, order = 100 <sent> It is quick and brown. It jumps over the lazy dog. </sent>",
                           "lexical = 40, order = 100  P1. <sent> The dog sleeps. Then it wakes up. </sent>"]


def test_codes_settings_and_the_grid_default():
    from stealth_eval.schema import Dipper, SettingsError
    assert [dp.dipper_codes(l, o) for l, o in Dipper().lex_order] == [(40, 40), (40, 100)]   # L60 O60, L60 O0
    assert [dp.dipper_setting(l, o) for l, o in Dipper().lex_order] == ["L=60,O=60", "L=60,O=0"]
    with pytest.raises(SettingsError, match="dipper.lex_order"): Dipper(lex_order=[[60]])
    with pytest.raises(SettingsError, match="dipper.lex_order"): Dipper(lex_order=[[60, 10]])


def test_jobs_run_together_window_by_window_and_each_as_alone():
    jobs = [{"text": TEXT, "prefix": "", "lex_code": 40, "order_code": 40, "seed": 1},
            {"text": "One sentence only.", "prefix": "", "lex_code": 40, "order_code": 100, "seed": 2}]
    calls = []
    def gen(inputs, seeds):
        calls.append(len(inputs))
        return [f"<{s}>" for s in seeds]            # the output depends on the row's seed alone
    together = dp.dipper_loop(jobs, 3, gen)
    assert calls == [2, 1]                            # window 0 of both jobs in one call, then the longer job's window 1
    alone = [dp.dipper_loop([j], 3, gen)[0] for j in jobs]
    assert [r["text"] for r in together] == [r["text"] for r in alone]
    seeds = [int(t.strip("<>")) for t in together[0]["text"].split()]
    assert len(set(seeds)) == 2                       # a seed per window


def _tiny_t5(folder: Path) -> Path:
    "A tiny random T5 (real architecture) and a word-level tokenizer that knows DIPPER's control words."
    import torch
    from tokenizers import Tokenizer, models as tm, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast, T5Config, T5ForConditionalGeneration
    words = ("lexical order = , . <sent> </sent> 40 100 60 it is quick and brown jumps over the lazy dog sleeps then "
             "wakes up a fox").split()
    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2, **{w: i + 3 for i, w in enumerate(words)}}
    t = Tokenizer(tm.WordLevel(vocab=vocab, unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    t.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    tok = PreTrainedTokenizerFast(tokenizer_object=t, pad_token="<pad>", eos_token="</s>", unk_token="<unk>")
    torch.manual_seed(0)
    cfg = T5Config(vocab_size=len(vocab), d_model=16, d_ff=32, d_kv=4, num_layers=1, num_decoder_layers=1, num_heads=2,
                   decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    T5ForConditionalGeneration(cfg).save_pretrained(folder); tok.save_pretrained(folder)
    return folder


def _cfg(model, **kw):
    return {"seed": 0, "device": "cpu", "dtype": "float32",
            "dipper": {"model": model, "tokenizer": None, "dtype": "auto", "lex_order": [[60, 0]], "sent_interval": 3,
                       "top_p": 0.75, "max_length": 12, "batch_size": 4, "batch_tokens": 0, **kw}}


def test_tiny_t5_loads_and_paraphrases_window_by_window(tmp_path):
    folder = _tiny_t5(tmp_path / "t5")
    cfg, items = _cfg(str(folder)), [{"id": "a", "text": TEXT}, {"id": "b", "text": "The dog sleeps."}]
    store = Cache(tmp_path / "store")
    out = METHODS.get("dipper").apply(items, cfg, store)
    assert [[o["setting"] for o in outs] for outs in out] == [["L=60,O=0"], ["L=60,O=0"]]
    f = out[0][0]["candidates"][0]["facts"]
    assert (f["lex_code"], f["order_code"], f["n_windows"], f["sent_interval"]) == (40, 100, 2, 3)
    assert f["model"].startswith("t5@local:") and f["top_p"] == 0.75
    assert out[0][0]["candidates"][0]["text"].strip()                 # sampled words of the random model
    t5 = dp.load_dipper(cfg)
    assert type(t5[0]).__name__ == "T5ForConditionalGeneration" and str(next(t5[0].parameters()).dtype) == "torch.float32"
    # each window's output is cached by content: a second call reads every window, and a text alone gives the same
    again = METHODS.get("dipper").apply(items[:1], cfg, store)
    assert again[0][0]["candidates"][0]["text"] == out[0][0]["candidates"][0]["text"] and store.hits["dipper_window"] == 2
    fresh = METHODS.get("dipper").apply(items[1:], cfg, Cache(enabled=False))   # recomputed, alone: the same sample
    assert fresh[0][0]["candidates"][0]["text"] == out[1][0]["candidates"][0]["text"]


def test_dipper_is_skipped_with_the_reason_when_the_model_cannot_load(tmp_path, monkeypatch):
    dipper = METHODS.get("dipper")
    with pytest.raises(ComponentUnavailable, match="no DIPPER model given"):
        dipper.apply([{"id": "a", "text": TEXT}], _cfg(None), Cache(enabled=False))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ComponentUnavailable, match="offline.*dipper-paraphraser-xxl"):
        dipper.apply([{"id": "a", "text": TEXT}], _cfg("kalpeshk2011/dipper-paraphraser-xxl"), Cache(enabled=False))
    (tmp_path / "empty").mkdir()                                      # a folder that holds no model
    with pytest.raises(ComponentUnavailable, match="cannot be loaded"):
        dipper.apply([{"id": "a", "text": TEXT}], _cfg(str(tmp_path / "empty")), Cache(enabled=False))


def test_the_stand_in_keeps_the_protocol_and_says_what_it_stands_in_for(tmp_path, monkeypatch):
    import stealth_eval.paraphrase as para
    from stealth_eval.models import make_tiny_lm
    seen = []
    def fake(target, messages, seeds, cache, cfg, max_new_tokens, temperature, top_p, system=None, desc=""):
        seen.extend(zip(messages, seeds))
        return [f"Paraphrased text: <sent> W{len(seen) - len(messages) + i + 1}. </sent>" for i in range(len(messages))]
    monkeypatch.setattr(para, "generate_answers", fake)
    cfg = {**_cfg(None, lex_order=[[60, 60]]), "paraphraser": str(make_tiny_lm(tmp_path / "lm")), "paraphrase_temperature": 0.9}
    out = METHODS.get("dipper_lm").apply([{"id": "a", "text": TEXT}], cfg, Cache(enabled=False))[0]
    assert out[0]["setting"] == "L=60,O=60"
    c = out[0]["candidates"][0]
    assert c["text"] == "W1. W2." and c["facts"]["stands_in_for"] == "dipper" and c["facts"]["n_windows"] == 2
    m1, m2 = seen[0][0], seen[1][0]
    assert "Lexical diversity: 60 out of 100" in m1 and "Order diversity: 60 out of 100" in m1   # 100 - the codes 40, 40
    assert m1.endswith("(do not repeat it): (none)\n\nText: It is quick and brown. It jumps over the lazy dog. The dog sleeps.")
    assert m2.endswith("(do not repeat it): W1.\n\nText: Then it wakes up.")      # the cleaned output of window 1 as context
    assert seen[0][1] != seen[1][1]
    assert METHODS.get("dipper_lm").stands_in_for == "dipper"


def test_list_shows_the_stand_in_in_the_method_table(capsys):
    from stealth_eval.run import main
    assert main(["--list"]) == 0
    out = capsys.readouterr().out.split("method table")[1]
    line = next(l for l in out.splitlines() if l.strip().startswith("dipper_lm"))
    assert line.strip().startswith("dipper_lm *") and line.endswith("[stands in for: dipper]")
    assert next(l for l in out.splitlines() if l.strip().startswith("dipper ")).strip().startswith("dipper  ")


def test_the_rehearsal_builds_and_prices_dippers_shape_only_for_a_run_with_dipper(tmp_path, monkeypatch):
    import stealth_eval.rehearsal as R
    from stealth_eval.config import PROFILES, resolve_config
    from stealth_eval.preflight import paper_stand_ins
    from transformers import AutoConfig
    c = R.model_config("dipper-paraphraser-xxl")                       # google/t5-v1_1-xxl's shape
    assert (c.d_model, c.d_ff, c.num_layers, c.num_decoder_layers, c.num_heads, c.d_kv, c.vocab_size) == (4096, 10240, 24, 24, 64, 64, 32128)
    assert c.is_gated_act and getattr(c, "scale_decoder_outputs", not c.tie_word_embeddings) is False   # v1.1: no rescaled head
    built = []
    monkeypatch.setattr(R, "build_rehearsal_models", lambda folder=None, scale="full", seed=0, names=None:
                        built.append(list(names)) or {n: tmp_path / n for n in names})
    cfg = resolve_config("rehearsal", overrides={"rehearsal.scale": "layers"})
    assert "dipper-paraphraser-xxl" not in built[-1] and cfg.dipper.model is None   # not a paper method: not built, no hub id
    cfg = resolve_config("rehearsal", methods=["m1", "dipper"], overrides={"rehearsal.scale": "layers"})
    assert "dipper-paraphraser-xxl" in built[-1]
    assert cfg.dipper.model == str(tmp_path / "dipper-paraphraser-xxl") and cfg.dipper.tokenizer is None
    assert "dipper-paraphraser-xxl" not in paper_stand_ins()                        # the preflight's list: the paper's methods
    paper = PROFILES["paper"].to_dict()
    assert not [r for r in R.paper_workload(paper) if "dipper" in r["what"]]
    rows = [r for r in R.paper_workload({**paper, "methods": paper["methods"] + ["dipper"]}) if "dipper" in r["what"]]
    assert [r["kind"] for r in rows] == ["prefill_encoder", "decode_decoder"] and all(r["dtype"] == "bfloat16" for r in rows)
    assert rows[0]["seqs"] == 1000 * 2 * 4                              # texts x (L, O) pairs x windows of 3 x 28 tokens in 300


def test_narrowed_to_one_pair_dipper_makes_that_pairs_output(tmp_path):
    "A recursive chain's call (`Method.narrow`): one (L, O) pair's output, the same as when every pair is made."
    cfg = _cfg(str(_tiny_t5(tmp_path / "t5")), lex_order=[[60, 0], [20, 40]])
    items, dipper, store = [{"id": "a", "text": TEXT}], METHODS.get("dipper"), Cache(tmp_path / "store")
    full = dipper.apply(items, cfg, store)
    assert [o["setting"] for o in full[0]] == ["L=60,O=0", "L=20,O=40"]
    one = dipper.apply(items, dipper.narrow(cfg, "L=20,O=40"), Cache(enabled=False))   # computed afresh
    assert one == [[full[0][1]]]
    assert dipper.narrow(cfg, "N=4") is None and METHODS.get("dipper_lm").narrow(cfg, "L=60,O=0")["dipper"]["lex_order"] == [[60, 0]]


def test_the_context_keeps_its_last_words_so_a_long_texts_input_grows_linearly():
    """The reference never shortens the prefix (its tokenizer call has no truncation; T5's positions are relative), so
    window j reads every output before it. `prefix_words` keeps the context's last words: within the bound the input is
    the reference's to the character; past it, the last `prefix_words` words of the reference's context."""
    text = " ".join(f"Sentence {k} has exactly seven words." for k in range(5000 // 6 + 1))   # 834 sentences, 5,004 words
    echo = lambda xs, seeds: [dp.parse_dipper_input(x)[3] for x in xs]                         # an output as long as its window
    job = {"text": text, "prefix": "Tracy is a fox.", "lex_code": 40, "order_code": 100, "seed": 0}
    full, cut = dp.dipper_loop([job], 3, echo)[0], dp.dipper_loop([job], 3, echo, prefix_words=1000)[0]
    assert full["n_windows"] == cut["n_windows"] == 278 and full["text"] == cut["text"] and full["prefix_cut"] == 0
    words = lambda r: sum(len(x.split()) for x in r["inputs"])
    # an input: the codes' 6 words, the context, the tags and the window's 18 words; unbounded, window j's context is the
    # prompt's 4 words and the 18 of each window before it (quadratic); bounded, at most 1,000
    assert words(full) == sum(6 + 4 + 18 * j + 2 + 18 for j in range(278)) == 701_394
    for x, y in zip(full["inputs"], cut["inputs"]):
        lc, oc, ctx, window = dp.parse_dipper_input(x)
        assert y == (x if len(ctx.split()) <= 1000 else dp.dipper_input(lc, oc, " ".join(ctx.split()[-1000:]), window))
    assert cut["prefix_cut"] == sum(len(dp.parse_dipper_input(x)[2].split()) > 1000 for x in full["inputs"]) == 222
    assert words(cut) == sum(6 + min(4 + 18 * j, 1000) + 2 + 18 for j in range(278)) == 257_172
    assert max(len(x.split()) for x in cut["inputs"]) == 6 + 1000 + 2 + 18                     # linear: at most 1,026 a window


def test_the_methods_read_the_bound_and_record_it(monkeypatch):
    seen = []
    monkeypatch.setattr(dp, "load_dipper", lambda cfg: (None, None, "stub-t5", "cpu"))
    monkeypatch.setattr(dp, "t5_generate", lambda t5, xs, seeds, cache, *a: seen.extend(xs) or [dp.parse_dipper_input(x)[3] for x in xs])
    out = METHODS.get("dipper").apply([{"id": "a", "text": TEXT, "prompt": "Tracy is a fox."}], _cfg("stub", prefix_words=3),
                                      Cache(enabled=False))[0][0]["candidates"][0]
    assert seen[1] == "lexical = 40, order = 100 The dog sleeps. <sent> Then it wakes up. </sent>"   # the last 3 words
    assert (out["facts"]["prefix_words"], out["facts"]["prefix_cut"]) == (3, 2)
    seen.clear()
    METHODS.get("dipper").apply([{"id": "a", "text": TEXT, "prompt": "Tracy is a fox."}], _cfg("stub", prefix_words=0), Cache(enabled=False))
    assert seen[1] == ("lexical = 40, order = 100 Tracy is a fox. It is quick and brown. It jumps over the lazy dog. The dog sleeps. "
                       "<sent> Then it wakes up. </sent>")


def test_sadasivans_recursion_on_a_tiny_t5_is_cached_by_its_own_content(tmp_path):
    "The T5 path under `recursive.protocol='sadasivan'`: max_length 750 in each window's cache key, so today's windows are not reused."
    cfg = {**_cfg(str(_tiny_t5(tmp_path / "t5")), lex_order=[[60, 0]], prefix_words=1000),
           "recursive": {"methods": ["dipper"], "depths": [1, 2]}}
    items, rec, store = [{"id": "a", "text": TEXT}], METHODS.get("recursive"), Cache(tmp_path / "store")
    today, m_today = rec.apply(items, cfg, store)[0], store.misses["dipper_window"]
    assert [o["setting"] for o in today] == ["base=dipper,L=60,O=0,depth=1", "base=dipper,L=60,O=0,depth=2"]
    sad_cfg = {**cfg, "recursive": {**cfg["recursive"], "protocol": "sadasivan"}}
    sad = rec.apply(items, sad_cfg, store)[0]
    assert store.hits.get("dipper_window", 0) == 0                  # round 1 asks what depth 1 asked, but with max_length 750
    assert [o["setting"] for o in sad] == ["base=dipper,protocol=sadasivan,L=60,O=0,depth=1",
                                           "base=dipper,protocol=sadasivan,L=60,O=60,depth=2"]
    f = [o["candidates"][0]["facts"] for o in sad]
    assert [(x["max_length"], x["order_diversity"], x["protocol"], x["prefix_words"]) for x in f] == [(750, 0, "sadasivan", 1000), (750, 60, "sadasivan", 1000)]
    m_sad = store.misses["dipper_window"]
    assert rec.apply(items, sad_cfg, store)[0] == sad                 # again: every window read back, none computed
    assert store.misses["dipper_window"] == m_sad and store.hits["dipper_window"] == m_sad - m_today >= 3
