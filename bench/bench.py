"""On-demand benchmark (not a test, not run in CI): the project's hot paths against plain batched PyTorch/transformers
baselines on the same model and texts, as throughput ratios measured in one run.

    python bench/bench.py [--device auto|cpu|cuda] [--scale auto|full|reduced] [--out bench_out]
                          [--rehearsal [--rehearsal_set KEY=VALUE ...] | --rehearsal_dir RUN] [--pipeline]

Paths (ratio = project throughput / baseline throughput; 1.0 = as fast as the plain baseline):
- scoring: `detectors.score_texts` (the likelihood panel, into a fresh cache) vs length-sorted, right-padded batches,
  one forward each, log-likelihood, log-rank, entropy and the Fast-DetectGPT statistic computed on the device;
- generation: `models.sample_continuations` (temperature 1, top-p 0.95, seeded per row) vs
  `model.generate(do_sample=True, top_p=0.95)` at the same batch size and the same number of new tokens;
- embeddings: `models.load_embedder(spec).encode` vs one padded batch of 64 at a time with masked mean pooling;
- readers (`--paths readers`, the embedded scoring LM, Gemma-3-270m): one scoring pass read by the likelihood panel,
  Lastde/Lastde++ and Ghostbuster's stream: seconds a text of the model's body, of its output head, and of each
  reader's statistics, with the head made once for all readers (`HeadLogits.once`) against once per reader;
- sampler (`--paths sampler`): one decode step's draw at Qwen3's vocabulary, no model: `models.seeded_sample` vs
  `torch.multinomial` on the softmax;
- decode_step (`--paths decode_step t5_step`): the fixed-shape decode step as `--decode_step` runs it (default: the
  device profile's, a CUDA graph on a GPU; `static`, the step as is, on a CPU) vs the dynamic loop, on the same prompts
  and seeds (the tokens are checked equal): the paraphraser's `sample_continuations` (Qwen3-4B's stand-in) and T5's
  seq2seq sampling (`iter_seq2seq_sample` on T5-large's stand-in, `generate` as the dynamic loop). The ratio is the
  speed-up of a decode step (the median of three A/B pairs); on a CPU at `--scale layers` it shows what the fixed
  shapes cost where nothing is launch-bound (the real widths, one or two layers).

Models: on CUDA the random-weight stand-ins of the paper's real shapes (`stealth_eval.rehearsal`, scale "full":
Falcon-7b for scoring, Qwen3-4B for generation, E5-base for embeddings); on the CPU the same architectures at reduced
shapes (a smoke test: CPU numbers on a shared machine are not measurements to quote).

`--rehearsal` also runs the rehearsal profile end to end and prints its stage table (`--rehearsal_dir` reads an existing
rehearsal run instead). On CUDA that is the paper's full configuration (hours); shorten it with e.g.
`--rehearsal_set data.n_per_class=20 perturbation.n_perturbations=10`. `--pipeline` adds the older end-to-end measurements on the embedded profile (warm/cold rerun,
perturbation-detector throughput, budget-sweep generation). Output: a markdown table on stdout and OUT/bench.json.
"""
import argparse
import copy
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------- inputs
def lee_texts(n, words=150):
    "The first `n` Lee corpus documents (human news, offline) with at least 40 words, cut to `words` words."
    from stealth_eval.data import lee_documents
    docs = [d["text"] for d in lee_documents() if len(d["text"].split()) >= 40]
    docs = (docs * (n // max(len(docs), 1) + 1))[:n]
    return [" ".join(t.split()[:words]) for t in docs]


def sync(device):
    import torch
    if device.startswith("cuda"): torch.cuda.synchronize()


def machine(device):
    import torch
    if device.startswith("cuda"):
        p = torch.cuda.get_device_properties(0)
        return f"{p.name} ({p.total_memory / 2**30:.0f} GiB), torch {torch.__version__}"
    return (f"CPU {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__} "
            f"({torch.get_num_threads()} threads)")


def bench_cfg(device, score_max_tokens):
    "A full configuration for the project's functions (the paper profile's keys; models are passed explicitly)."
    from stealth_eval.config import PROFILES
    cfg = copy.deepcopy(PROFILES["paper"])
    cfg.update(device=device, score_max_tokens=score_max_tokens, seed=0, no_cache=False)
    return cfg


# ---------------------------------------------------------------- scoring
def baseline_scores(lm, texts, max_tokens, batch_size):
    "Plain batched scoring: length-sorted right-padded batches, one forward, statistics on the device; seconds, stats."
    import torch
    tok, model, dev = lm.tokenizer, lm.model, lm.device
    ids = [tok(t, truncation=True, max_length=max_tokens).input_ids for t in texts]
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    out = [None] * len(ids)
    sync(dev); t0 = time.perf_counter()
    with torch.no_grad():
        for b in range(0, len(order), batch_size):
            rows = order[b:b + batch_size]
            L = max(len(ids[i]) for i in rows)
            x = torch.full((len(rows), L), pad, dtype=torch.long)
            m = torch.zeros((len(rows), L), dtype=torch.long)
            for r, i in enumerate(rows):
                x[r, :len(ids[i])] = torch.tensor(ids[i]); m[r, :len(ids[i])] = 1
            x, m = x.to(dev), m.to(dev)
            logits = model(input_ids=x, attention_mask=m).logits[:, :-1].float()
            tgt, mask = x[:, 1:], m[:, 1:].to(torch.float64)
            lp = torch.log_softmax(logits, -1)
            tlp = lp.gather(-1, tgt.unsqueeze(-1)).squeeze(-1)
            rank = (logits > logits.gather(-1, tgt.unsqueeze(-1))).sum(-1) + 1
            p = lp.exp()
            ent = -(p * lp).sum(-1)
            mu, var = -ent, (p * lp * lp).sum(-1) - ent * ent       # Fast-DetectGPT: mean and variance of log p
            n = mask.sum(1).clamp(min=1)
            ll = (tlp.double() * mask).sum(1) / n
            lrank = (torch.log(rank.double()) * mask).sum(1) / n
            fdg = ((tlp.double() - mu.double()) * mask).sum(1) / ((var.double() * mask).sum(1).clamp(min=1e-12).sqrt())
            stats = torch.stack([ll, lrank, (ent.double() * mask).sum(1) / n, fdg], 1).cpu().tolist()
            for r, i in enumerate(rows): out[i] = stats[r]
    sync(dev)
    return time.perf_counter() - t0, out


def bench_scoring(spec, texts, device, max_tokens, batch_size):
    from stealth_eval.core import Cache
    from stealth_eval.detectors import score_texts
    from stealth_eval.models import load_causal_lm
    cfg = bench_cfg(device, max_tokens)
    with tempfile.TemporaryDirectory() as d:        # warm-up: loads the model, compiles kernels (not timed)
        score_texts(texts[:2], spec, cfg, Cache(d))
    lm = load_causal_lm(spec, device=cfg["device"], trust_remote_code=cfg["trust_remote_code"])   # score_texts' copy
    n_tokens = sum(len(lm.tokenizer(t, truncation=True, max_length=max_tokens).input_ids) for t in texts)
    baseline_scores(lm, texts[:2], max_tokens, batch_size)
    with tempfile.TemporaryDirectory() as d:
        sync(device); t0 = time.perf_counter()
        got = score_texts(texts, spec, cfg, Cache(d))    # a fresh cache: everything computed
        sync(device); t_proj = time.perf_counter() - t0
    t_base, base = baseline_scores(lm, texts, max_tokens, batch_size)
    from stealth_eval.core import sha256_text
    diffs = []
    for t, b in zip(texts, base):   # the same log-likelihood? (bf16 on a GPU: loose; float32 on the CPU: close)
        v = got.get(sha256_text(t))
        ll = v.get("ll") if isinstance(v, dict) else None
        if ll is not None: diffs.append(abs(ll - b[0]))
    return {"path": "scoring (likelihood panel)", "project": "detectors.score_texts (fresh cache)",
            "baseline": f"sorted right-padded batches of {batch_size}, one forward, stats on the device",
            "model": Path(spec).name, "items": f"{len(texts)} texts / {n_tokens} tokens", "unit": "tokens/s",
            "project_per_s": n_tokens / t_proj, "baseline_per_s": n_tokens / t_base,
            "project_s": t_proj, "baseline_s": t_base,
            "max_abs_diff_log_likelihood": max(diffs) if diffs else None}


def bench_readers(texts, max_tokens=256, reps=2):
    """Seconds a text of one scoring pass's parts on the embedded scoring LM: body, head, and each reader's statistics;
    the readers fed one head product per batch vs one per reader (the code before `HeadLogits.once`)."""
    import torch
    from stealth_eval.config import PROFILES
    from stealth_eval.core import sha256_text
    from stealth_eval.detectors import lm_logits, panel_batch
    from stealth_eval.ghostbuster import _batch_token_logprobs
    from stealth_eval.lastde import lastde_params, lastde_rows, text_uniforms
    from stealth_eval.models import load_causal_lm
    lm = load_causal_lm(PROFILES["embedded"]["scoring_model"], device="cpu")
    prm = lastde_params({})
    seqs = [lm.tokenizer(t, truncation=True, max_length=max_tokens).input_ids for t in texts]
    t = {k: 0.0 for k in ("body", "head", "panel", "lastde", "ghostbuster", "pass, head per reader", "pass, head once")}
    def clock(k, f):
        t0 = time.perf_counter(); out = f(); t[k] += time.perf_counter() - t0; return out
    readers = lambda z, ids, n, U: (panel_batch(z, ids, [n]), lastde_rows(z, ids, [n], U, prm), _batch_token_logprobs(z, ids, [n]))
    with torch.no_grad():
        for rep in range(reps):
            for s in seqs:
                ids, mask, n = torch.tensor([s]), torch.ones((1, len(s)), dtype=torch.long), len(s)
                U = text_uniforms(sha256_text(str(s)), 0, n, prm["n_samples"])[None]
                hl = clock("body", lambda: lm_logits(lm, ids, mask))
                z = clock("head", lambda: hl.once())
                clock("panel", lambda: panel_batch(z, ids, [n]))
                clock("lastde", lambda: lastde_rows(z, ids, [n], U, prm))
                clock("ghostbuster", lambda: _batch_token_logprobs(z, ids, [n]))
                # the whole pass, the two ways, alternated: each reader computing its own head blocks, then one product
                clock("pass, head per reader", lambda: readers(lm_logits(lm, ids, mask), ids, n, U))
                clock("pass, head once", lambda: readers(lm_logits(lm, ids, mask).once(), ids, n, U))
    k = reps * len(seqs)
    per = {a: b / k for a, b in t.items()}
    H, V = lm.head_fp32()[0].shape[1], lm.head_fp32()[0].shape[0]
    n_tok = sum(len(s) for s in seqs) / len(seqs)
    return {"path": "readers of one scoring pass", "project": "head once (HeadLogits.once)", "baseline": "head per reader",
            "model": Path(lm.identity).name if hasattr(lm, "identity") else "scoring LM",
            "items": f"{len(seqs)} texts x {reps}, {n_tok:.0f} tokens a text", "unit": "texts/s",
            "project_per_s": 1 / per["pass, head once"], "baseline_per_s": 1 / per["pass, head per reader"],
            "seconds_a_text": per, "head_gflop_a_text": 2 * n_tok * H * V / 1e9,
            "head_gflop_per_s": 2 * n_tok * H * V / 1e9 / per["head"]}


# ---------------------------------------------------------------- generation
def bench_generation(spec, texts, device, n_prompts, new_tokens, batch_size, prompt_tokens=64):
    import torch
    from stealth_eval.models import load_causal_lm, sample_continuations
    lm = load_causal_lm(spec, device=device)
    tok = lm.tokenizer
    prompts = [tok(t, add_special_tokens=False).input_ids[:prompt_tokens] for t in texts[:n_prompts]]
    seeds = list(range(len(prompts)))
    sample_continuations(lm, prompts[:2], seeds[:2], 4, 4, temperature=1.0, top_p=0.95, batch_size=2)   # warm-up
    sync(device); t0 = time.perf_counter()
    outs = sample_continuations(lm, prompts, seeds, new_tokens, new_tokens, temperature=1.0, top_p=0.95, batch_size=batch_size)
    sync(device); t_proj = time.perf_counter() - t0
    n_proj = sum(len(o) for o in outs)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    torch.manual_seed(0)
    n_base = 0
    sync(device); t0 = time.perf_counter()
    with torch.no_grad():
        for b in range(0, len(prompts), batch_size):
            rows = prompts[b:b + batch_size]
            L = max(map(len, rows))
            x = torch.full((len(rows), L), pad, dtype=torch.long); m = torch.zeros_like(x)
            for r, p in enumerate(rows): x[r, L - len(p):] = torch.tensor(p); m[r, L - len(p):] = 1
            g = lm.model.generate(input_ids=x.to(device), attention_mask=m.to(device), do_sample=True, top_p=0.95,
                                  temperature=1.0, top_k=0, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                  pad_token_id=pad)
            n_base += (g.shape[1] - L) * len(rows)
    sync(device); t_base = time.perf_counter() - t0
    return {"path": "generation (seeded sampling)", "project": "models.sample_continuations (T=1, top-p 0.95)",
            "baseline": f"model.generate(do_sample=True, top_p=0.95), batch {batch_size}",
            "model": Path(spec).name, "items": f"{len(prompts)} prompts x {new_tokens} new tokens", "unit": "new tokens/s",
            "project_per_s": n_proj / t_proj, "baseline_per_s": n_base / t_base, "project_s": t_proj, "baseline_s": t_base}


# ---------------------------------------------------------------- sampler
def bench_sampler(device, vocab, rows, steps=20):
    """One decode step's draw without the model: `models.seeded_sample` (T=1, top-p 1: Gumbel-max with counter-based
    noise over the whole vocabulary, each row its own seed) vs `torch.multinomial` on the softmax (one generator)."""
    import torch
    from stealth_eval.models import seeded_sample
    z = torch.randn(rows, vocab, device=device) * 3
    seeds = torch.arange(rows, device=device)
    seeded_sample(z, seeds, torch.zeros(rows, dtype=torch.long, device=device))   # warm-up
    sync(device); t0 = time.perf_counter()
    for s in range(steps): seeded_sample(z, seeds, torch.full((rows,), s, dtype=torch.long, device=device))
    sync(device); t_proj = time.perf_counter() - t0
    gen = torch.Generator(device=device).manual_seed(0)
    torch.multinomial(torch.softmax(z, -1), 1, generator=gen)
    sync(device); t0 = time.perf_counter()
    for s in range(steps): torch.multinomial(torch.softmax(z, -1), 1, generator=gen)
    sync(device); t_base = time.perf_counter() - t0
    return {"path": "sampling step (top-p 1)", "project": "models.seeded_sample (a seed per row)",
            "baseline": "torch.multinomial(softmax) (one generator)", "model": f"vocabulary {vocab:,}",
            "items": f"{rows} rows x {steps} steps", "unit": "rows/s", "project_per_s": rows * steps / t_proj,
            "baseline_per_s": rows * steps / t_base, "project_s": t_proj, "baseline_s": t_base}


# ---------------------------------------------------------------- the decode step: fixed shapes vs the dynamic loop
def _timed_call(fn, device):
    sync(device); t0 = time.perf_counter()
    out = fn()
    sync(device)
    return out, time.perf_counter() - t0


def _paired(project, baseline, device, reps):
    """Both calls `reps` times in turn (A B A B ...), their outputs checked equal: the median seconds of each, and the
    median of the pairs' ratios (a machine whose speed drifts moves both sides of a pair alike)."""
    import statistics
    ta, tb, ratios = [], [], []
    for _ in range(reps):
        got, a = _timed_call(project, device)
        ref, b = _timed_call(baseline, device)
        assert got == ref, "the fixed-shape step drew other tokens than the dynamic loop"
        ta.append(a); tb.append(b); ratios.append(b / a)
    return got, statistics.median(ta), statistics.median(tb), statistics.median(ratios)


def bench_decode_step(spec, texts, device, n_prompts, new_tokens, batch_size, mode, prompt_tokens=64, reps=3):
    """`models.sample_continuations` with `decode_step=mode` vs the dynamic loop: the same prompts and seeds, every row
    drawing `new_tokens` (EOS banned before), so both run the same steps; the tokens must be equal."""
    from stealth_eval.models import load_causal_lm, sample_continuations
    lm = load_causal_lm(spec, device=device)
    prompts = [lm.tokenizer(t, add_special_tokens=False).input_ids[:prompt_tokens] for t in texts[:n_prompts]]
    seeds = list(range(len(prompts)))
    go = lambda m, k=new_tokens, ps=prompts: sample_continuations(lm, ps, seeds[:len(ps)], k, k, temperature=1.0, top_p=0.95,
                                                                  batch_size=batch_size, decode_step=m)
    go("dynamic", 4, prompts[:2]); go(mode, 4, prompts[:2])                       # warm-up: first kernels of both
    got, t_proj, t_base, ratio = _paired(lambda: go(mode), lambda: go("dynamic"), device, reps)
    n = sum(map(len, got))
    return {"path": f"decode step ({mode})", "project": f"sample_continuations(decode_step={mode!r})",
            "baseline": f"the dynamic loop (decode_step='dynamic'), batch {batch_size}", "model": Path(spec).name,
            "items": f"{len(prompts)} prompts x {new_tokens} new tokens", "unit": "new tokens/s",
            "project_per_s": n / t_proj, "baseline_per_s": n / t_base, "project_s": t_proj, "baseline_s": t_base,
            "paired_ratio": ratio, "reps": reps}


def bench_t5_step(spec, texts, device, rows, steps, mode, reps=3):
    """T5's seq2seq sampling (`models.iter_seq2seq_sample`: the fills' and DIPPER's) with `decode_step=mode` vs
    `generate` with the seeded sampler: `rows` masked texts in one batch, `steps` decoder steps; the same ids."""
    import torch
    from transformers import AutoTokenizer, T5ForConditionalGeneration
    from stealth_eval.models import iter_seq2seq_sample
    tok = AutoTokenizer.from_pretrained(spec)
    model = T5ForConditionalGeneration.from_pretrained(spec).to(device).eval()
    words = [t.split() for t in texts]
    ids = [tok(" ".join(w[:12] + ["<extra_id_0>"] + w[14:40] + ["<extra_id_1>"] + w[42:60])).input_ids for w in (words * rows)[:rows]]
    L = max(map(len, ids))
    go = lambda m, k=steps + 1: [g.tolist() for _, g in iter_seq2seq_sample(model, tok, device, ids, list(range(rows)), [k] * rows,
                                                                              0.95, batch_tokens=rows * (L + 64), granule=64,
                                                                              max_rows=rows, step_mode=m)]
    go("dynamic", 4); go(mode, 4)                                                 # warm-up
    got, t_proj, t_base, ratio = _paired(lambda: go(mode), lambda: go("dynamic"), device, reps)
    n = rows * (len(got[0][0]) - 1)
    del model
    return {"path": f"T5 decoder step ({mode})", "project": f"iter_seq2seq_sample(step_mode={mode!r})",
            "baseline": "generate + SeededSampler (dynamic)", "model": Path(spec).name,
            "items": f"{rows} rows x {len(got[0][0]) - 1} steps, {L}-token sources", "unit": "row-steps/s",
            "project_per_s": n / t_proj, "baseline_per_s": n / t_base, "project_s": t_proj, "baseline_s": t_base,
            "paired_ratio": ratio, "reps": reps}


# ---------------------------------------------------------------- embeddings
def bench_embeddings(spec, texts, device, batch_size=64, max_length=512):
    import numpy as np
    import torch
    from transformers import AutoModel, AutoTokenizer
    from stealth_eval.models import load_embedder
    emb = load_embedder(spec, device=device)
    emb.encode(texts[:2])                                          # warm-up
    sync(device); t0 = time.perf_counter()
    a = emb.encode(texts)
    sync(device); t_proj = time.perf_counter() - t0
    tok = AutoTokenizer.from_pretrained(spec)
    model = AutoModel.from_pretrained(spec).to(device).eval()   # the dtype load_embedder uses (the checkpoint's)
    def plain(ts):
        out = []
        with torch.no_grad():
            for i in range(0, len(ts), batch_size):
                enc = tok([f"query: {t}" for t in ts[i:i + batch_size]], padding=True, truncation=True,
                          max_length=max_length, return_tensors="pt").to(device)
                h = model(**enc).last_hidden_state
                mk = enc["attention_mask"].unsqueeze(-1).to(h.dtype)
                e = (h * mk).sum(1) / mk.sum(1).clamp(min=1)
                out.append(torch.nn.functional.normalize(e.float(), dim=-1).cpu().numpy())
        return np.concatenate(out)
    plain(texts[:2])
    sync(device); t0 = time.perf_counter()
    b = plain(texts)
    sync(device); t_base = time.perf_counter() - t0
    return {"path": "embeddings", "project": "models.load_embedder(spec).encode",
            "baseline": f"padded batches of {batch_size}, masked mean pooling", "model": Path(spec).name,
            "items": f"{len(texts)} texts", "unit": "texts/s", "project_per_s": len(texts) / t_proj,
            "baseline_per_s": len(texts) / t_base, "project_s": t_proj, "baseline_s": t_base,
            "max_abs_diff": float(np.abs(np.asarray(a) - b).max())}


# ---------------------------------------------------------------- rehearsal stage table
def rehearsal_table(run_dir):
    info = json.loads((Path(run_dir) / "run_info.json").read_text())
    st = info["stages"]
    total = sum(v.get("seconds", 0) for v in st.values()) or 1
    lines = ["| stage | seconds | share | peak RSS (GB) | peak GPU in use (GB) |", "|---|---|---|---|---|"]
    for k, v in st.items():
        lines.append(f"| {k} | {v.get('seconds')} | {100 * v.get('seconds', 0) / total:.0f}% | {v.get('peak_rss_gb', '–')} | "
                     f"{v.get('peak_gpu_used_gb', '–')} |")
    lines.append(f"| total | {total:.1f} | 100% | | |")
    rows = info.get("rehearsal_models", [])
    if rows:
        lines += ["", "| model | measured | throughput | peak memory (GB) |", "|---|---|---|---|"]
        for m in rows:
            thr = f"{m['per_s']:,} {m['unit']}" if "per_s" in m else m.get("error", "–")
            lines.append(f"| {m['model']} | {m.get('what')} | {thr} | {m.get('peak_gb', '–')} |")
    return {"run_dir": str(run_dir), "stages": st, "models": rows}, "\n".join(lines)


def run_rehearsal(base, sets, device):
    out, store = Path(base) / "rehearsal", Path(base) / "rehearsal_store"
    cmd = [sys.executable, "-m", "stealth_eval.run", "--profile", "rehearsal", "--out_dir", str(out), "--cache_dir", str(store),
           "--offline", "--set", f"device={device}", *sets]
    subprocess.run(cmd, cwd=ROOT, check=True, env={**os.environ, "STEALTH_EVAL_PROGRESS": "0"})
    return out


# ---------------------------------------------------------------- older end-to-end measurements (--pipeline)
def run(profile, out, store, extra=()):
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "stealth_eval.run", "--profile", profile, "--out_dir", str(out),
                    "--cache_dir", str(store), *extra], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "STEALTH_EVAL_PROGRESS": "0"})
    return time.perf_counter() - t


def perturbation_throughput(texts, cfg, store, names=("detectgpt_lminfill", "npr_lminfill", "proxihuman_lminfill")):
    "Texts/s of the perturbation detectors, cold (an empty cache): fills + scoring forward passes (+ embeddings)."
    from stealth_eval.core import Cache
    from stealth_eval.detectors import DETECTORS
    from stealth_eval.models import load_causal_lm, load_embedder
    from stealth_eval.perturbation import perturbation_params
    p = perturbation_params(cfg)
    load_causal_lm(p["infill_model"], device=cfg["device"]); load_causal_lm(cfg["scoring_model"], device=cfg["device"])
    load_embedder(cfg["embedder"], device=cfg["device"])             # model loading is not timed
    cache, done, out = Cache(store), set(), {}
    for n in names:
        det = DETECTORS.get(n)
        t0 = time.perf_counter()
        det.compute(texts, cfg, cache)
        dt = time.perf_counter() - t0
        note = ("cold: fills, then the scoring forward passes" if not done else
                "same source as an earlier detector: nothing recomputed" if det.source(cfg) in done else
                "reuses the cached perturbations; embeds them")
        out[n] = {"seconds": round(dt, 2), "texts_per_s": round(len(texts) / dt, 3), "note": note}
        done.add(det.source(cfg))
    total = sum(v["seconds"] for v in out.values())
    return {"texts": len(texts), "n_perturbations": p["n_perturbations"], "infill_model": p["infill_model"],
            "detectors": out, "all_texts_per_s": round(len(texts) / total, 3)}


def budget_sweep_ratio(texts, cfg, base):
    "M1 generation for the budget sweep N in {1, 2, 4, 8} over generating eight candidates, each into an empty cache."
    from stealth_eval.core import Cache
    from stealth_eval.models import load_causal_lm, load_embedder
    from stealth_eval.paraphrase import method_m1
    load_causal_lm(cfg.get("paraphraser") or cfg["generator"], device=cfg["device"])
    load_embedder(cfg["embedder"], device=cfg["device"])
    items = [{"id": f"bench-{i}", "text": t, "dataset": "bench"} for i, t in enumerate(texts)]
    out = {}
    for name, ns in (("sweep_1_2_4_8", [1, 2, 4, 8]), ("eight", [8])):
        d = Path(base) / name
        d.mkdir(parents=True, exist_ok=True)
        c = {**cfg, "n_candidates": ns, "out_dir": str(d)}
        t = time.perf_counter()
        method_m1(items, c, Cache(d / "store"))
        log = [json.loads(l) for l in (d / "generations.jsonl").read_text().splitlines()]
        out[name] = {"seconds": round(time.perf_counter() - t, 1), "candidates_per_text": len(log) / len(items)}
    out["ratio"] = round(out["sweep_1_2_4_8"]["seconds"] / out["eight"]["seconds"], 3)
    return out


def pipeline_measurements(base, n, perturb_n, sweep_n):
    from stealth_eval.config import resolve_config
    store = base / "store"
    extra = ["--set", f"data.n_per_class={n}"] if n else []
    cold = run("embedded", base / "cold", store, extra)
    warm = run("embedded", base / "warm", store, extra)
    cfg = resolve_config("embedded", out_dir=str(base / "cfg"))
    texts = [json.loads(l)["text"] for l in (base / "cold" / "data" / "lee_news.jsonl").read_text().splitlines()]
    info = json.loads((base / "cold" / "run_info.json").read_text())
    return {"cold_run_s": round(cold, 1), "warm_rerun_s": round(warm, 1), "warm_over_cold": round(warm / cold, 4),
            "stage_seconds_cold": {k: v["seconds"] for k, v in info["stages"].items()},
            "perturbation": perturbation_throughput(texts[:perturb_n], cfg, base / "perturb_store"),
            "budget_sweep_over_8_candidates": budget_sweep_ratio(texts[:sweep_n], cfg, base / "budget")}


# ---------------------------------------------------------------- main
def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="auto")
    ap.add_argument("--scale", default="auto", help="stand-in shapes: full (real), reduced; auto: full on CUDA")
    ap.add_argument("--out", default=str(ROOT / "bench_out"))
    ap.add_argument("--n_score", type=int, default=None, help="texts scored (default 96 on CUDA, 24 on the CPU)")
    ap.add_argument("--score_max_tokens", type=int, default=None, help="token window (default 1024 / 256)")
    ap.add_argument("--score_batch", type=int, default=None, help="baseline scoring batch (default 32 / 8)")
    ap.add_argument("--n_prompts", type=int, default=None, help="generation prompts (default 32 / 8)")
    ap.add_argument("--new_tokens", type=int, default=None, help="new tokens per prompt (default 128 / 32)")
    ap.add_argument("--gen_batch", type=int, default=None, help="generation batch size for both (default 32 / 8)")
    ap.add_argument("--n_embed", type=int, default=None, help="texts embedded (default 256 / 64)")
    ap.add_argument("--paths", nargs="+", default=["scoring", "generation", "embeddings"],
                    help="scoring, generation, embeddings, sampler (a decode step's draw at Qwen3's vocabulary, no model), readers "
                         "(one scoring pass's readers on the embedded scoring LM), decode_step and t5_step (the fixed-shape "
                         "decode step vs the dynamic loop)")
    ap.add_argument("--decode_step", default="auto", help="decode_step and t5_step paths: static, cuda_graph or compile "
                    "(auto: the device profile's GPU value on CUDA, static on a CPU)")
    ap.add_argument("--t5_rows", type=int, default=None, help="t5_step: rows of the batch (default 128 / 16)")
    ap.add_argument("--t5_steps", type=int, default=None, help="t5_step: decoder steps (default 64 / 24)")
    ap.add_argument("--rehearsal", action="store_true", help="also run the rehearsal profile and print its stage table")
    ap.add_argument("--rehearsal_set", nargs="*", default=None, help="--set values for that run (default on the CPU: tiny sizes)")
    ap.add_argument("--rehearsal_dir", default=None, help="print the stage table of this existing rehearsal run")
    ap.add_argument("--pipeline", action="store_true", help="also the embedded profile's end-to-end measurements")
    ap.add_argument("--n", type=int, default=None, help="--pipeline: data.n_per_class of the runs")
    args = ap.parse_args()
    from stealth_eval.models import resolve_device
    from stealth_eval.rehearsal import build_rehearsal_models
    device = resolve_device(args.device)
    cuda = device.startswith("cuda")
    scale = args.scale if args.scale != "auto" else ("full" if device.startswith("cuda") else "reduced")   # CPU: a smoke test
    pick = lambda v, g, c: v if v is not None else (g if cuda else c)
    base = Path(args.out); shutil.rmtree(base, ignore_errors=True); base.mkdir(parents=True)
    names = {"scoring": "falcon-7b", "generation": "qwen3-4b-instruct-2507", "embeddings": "e5-base-v2", "sampler": None, "readers": None,
             "decode_step": "qwen3-4b-instruct-2507", "t5_step": "t5-large"}
    step_mode = args.decode_step if args.decode_step != "auto" else ("cuda_graph" if cuda else "static")
    stand_ins = [p for p in args.paths if names[p]]   # the readers path reads the real embedded scoring LM; the sampler no model
    report = {"machine": machine(device), "device": device, "scale": scale, "paths": [],
              "note": "ratio = project / baseline throughput, measured in this run" +
                      ("" if cuda or not stand_ins or scale == "full" else
                       f"; CPU, {', '.join(stand_ins)} on stand-ins at the {scale} shapes: a smoke test, not figures to quote")}
    folders = build_rehearsal_models(scale=scale, names=[names[p] for p in args.paths if names[p]])
    texts = lee_texts(max(pick(args.n_score, 96, 24), pick(args.n_embed, 256, 64), pick(args.n_prompts, 32, 8)))
    for path in args.paths:
        if path == "sampler":
            r = bench_sampler(device, 151936, pick(args.gen_batch, 32, 8))
            r["ratio"] = r["project_per_s"] / r["baseline_per_s"]
            report["paths"].append(r)
            continue
        if path == "readers":
            r = bench_readers(texts[:pick(args.n_score, 96, 8)], pick(args.score_max_tokens, 1024, 256))
            r["ratio"] = r["project_per_s"] / r["baseline_per_s"]
            report["paths"].append(r)
            print(json.dumps({k: round(v, 3) for k, v in r["seconds_a_text"].items()}), file=sys.stderr)
            continue
        spec = str(folders[names[path]])
        print(f"[bench] {path} on {Path(spec).name} ({scale}, {device}) ...", file=sys.stderr)
        if path == "scoring":
            r = bench_scoring(spec, texts[:pick(args.n_score, 96, 24)], device, pick(args.score_max_tokens, 1024, 256),
                              pick(args.score_batch, 32, 8))
        elif path == "generation":
            r = bench_generation(spec, texts, device, pick(args.n_prompts, 32, 8), pick(args.new_tokens, 128, 32),
                                 pick(args.gen_batch, 32, 8))
        elif path == "decode_step":
            r = bench_decode_step(spec, texts, device, pick(args.n_prompts, 32, 8), pick(args.new_tokens, 128, 32),
                                  pick(args.gen_batch, 32, 8), step_mode)
        elif path == "t5_step":
            r = bench_t5_step(spec, texts, device, pick(args.t5_rows, 128, 16), pick(args.t5_steps, 64, 24), step_mode)
        else:
            r = bench_embeddings(spec, texts[:pick(args.n_embed, 256, 64)], device)
        r["ratio"] = r.get("paired_ratio") or r["project_per_s"] / r["baseline_per_s"]   # paired: the median pair's
        report["paths"].append(r)
        from stealth_eval import models
        models.load_causal_lm.cache_clear(); models.load_embedder.cache_clear()
        if cuda:
            import torch; torch.cuda.empty_cache()
    lines = [f"Machine: {report['machine']}; stand-ins at {scale} shape (random weights). {report['note']}.", "",
             "| path | model | work | project | plain baseline | ratio |", "|---|---|---|---|---|---|"]
    for r in report["paths"]:
        lines.append(f"| {r['path']} | {r['model']} | {r['items']} | {r['project_per_s']:,.1f} {r['unit']} | "
                     f"{r['baseline_per_s']:,.1f} {r['unit']} | **{r['ratio']:.2f}x** |")
    if args.rehearsal or args.rehearsal_dir:
        if args.rehearsal_dir: run_dir = Path(args.rehearsal_dir)
        else:
            sets = args.rehearsal_set if args.rehearsal_set is not None else ([] if cuda else [
                "data.n_per_class=3", "perturbation.n_perturbations=2", "n_bootstrap=20", "data.max_tokens=90",
                "paraphrase_chunk_tokens=64"])
            run_dir = run_rehearsal(base, sets, device)
        report["rehearsal"], table = rehearsal_table(run_dir)
        lines += ["", f"Rehearsal stage table ({run_dir}; random weights: costs only):", "", table]
    if args.pipeline:
        report["pipeline"] = pipeline_measurements(base / "pipeline", args.n, 8, 4)
        lines += ["", "Embedded profile, end to end:", "", "```", json.dumps(report["pipeline"], indent=1), "```"]
    (base / "bench.json").write_text(json.dumps(report, indent=2, default=str))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
