"""On-demand benchmark (not run in CI): where the time of a run goes, as ratios measured in one session.

    python bench/bench.py [--profile embedded] [--out bench_out] [--n N] [--skip_runs]

Reports, on the profile's models:
- warm rerun / cold run (same command, same content cache; goal <= 0.05),
- tokens/s of the likelihood-family panel (log-likelihood, rank, log-rank, entropy, LRR, Fast-DetectGPT and the
  single-model Binoculars, all from one forward pass per text) and the ratio panel time / one batched forward pass of
  the scoring model over the same texts (goal <= 1.2),
- texts/s of the perturbation detectors (DetectGPT/NPR/ProxiHuman with causal-LM infill), cold: perturbations
  generated and scored into an empty cache,
- budget-sweep generation / eight candidates' generation (goal <= 1.05; needs a candidate-generating method),
- texts per second for each stage, and which stage dominates the end-to-end time.
"""
import argparse
import json
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run(profile, out, store, extra=()):
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "stealth_eval.run", "--profile", profile, "--out_dir", str(out),
                    "--cache_dir", str(store), *extra], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**__import__("os").environ, "STEALTH_EVAL_PROGRESS": "0"})
    return time.perf_counter() - t


def run_texts(out, n):
    "The first `n` texts of a run's embedded dataset."
    return [json.loads(l)["text"] for l in (Path(out) / "data" / "lee_news.jsonl").read_text().splitlines()][:n]


def lee_texts(n, words=150):
    "Without a run: the first `n` Lee corpus documents (human news), cut to `words` words."
    from stealth_eval.data import lee_documents
    docs = [d["text"] for d in lee_documents() if len(d["text"].split()) >= 40]
    return [" ".join(t.split()[:words]) for t in docs[:n]]


def panel_vs_forward(texts, cfg, batch_size=8):
    import torch
    from stealth_eval.detectors import panel_stats
    from stealth_eval.models import load_causal_lm
    lm = load_causal_lm(cfg["scoring_model"], device=cfg["device"])
    tok, T = lm.tokenizer, cfg["score_max_tokens"]
    n_tokens = sum(min(len(tok(t).input_ids), T) for t in texts)
    panel_stats(lm, texts[0], T)                                   # warm-up
    t0 = time.perf_counter()
    for t in texts: panel_stats(lm, t, T)
    t_panel = time.perf_counter() - t0
    tok.padding_side = "right"
    t0 = time.perf_counter()
    with torch.no_grad():
        for i in range(0, len(texts), batch_size):
            enc = tok(texts[i:i + batch_size], return_tensors="pt", padding=True, truncation=True, max_length=T).to(lm.device)
            lm.model(**enc).logits
    t_fwd = time.perf_counter() - t0
    return {"texts": len(texts), "tokens": n_tokens, "panel_s": t_panel, "batched_forward_s": t_fwd,
            "ratio": t_panel / t_fwd, "panel_tokens_per_s": n_tokens / t_panel}


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
        note = ("cold: fills, then one scoring forward pass per perturbed text" if not done else
                "same source as an earlier detector: nothing recomputed" if det.source(cfg) in done else
                "reuses the cached perturbations; embeds them")
        out[n] = {"seconds": round(dt, 2), "texts_per_s": round(len(texts) / dt, 3), "note": note}
        done.add(det.source(cfg))
    total = sum(v["seconds"] for v in out.values())
    return {"texts": len(texts), "n_perturbations": p["n_perturbations"], "infill_model": p["infill_model"],
            "detectors": out, "all_texts_per_s": round(len(texts) / total, 3),
            "perturbed_texts_per_s": round(len(texts) * p["n_perturbations"] / total, 3)}


def budget_sweep_ratio(texts, cfg, base):
    """M1 generation for the budget sweep N in {1, 2, 4, 8} over generating eight candidates, each into an empty cache.

    The sweep's pools are nested prefixes of one pool of 8 per text, so both runs should sample 8 candidates per text;
    the ratio measures that (time), and the generation log counts it (candidates per text)."""
    from stealth_eval.core import Cache
    from stealth_eval.paraphrase import method_m1
    from stealth_eval.models import load_causal_lm
    from stealth_eval.models import load_embedder
    load_causal_lm(cfg.get("paraphraser") or cfg["generator"], device=cfg["device"])   # load once, outside the timing
    load_embedder(cfg["embedder"], device=cfg["device"])                               # (M1 selects by similarity)
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
    out["n_texts"] = len(items)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", default="embedded")
    ap.add_argument("--out", default=str(ROOT / "bench_out"))
    ap.add_argument("--n", type=int, default=None, help="texts per class for the runs (data.n_per_class) and texts for the panel measurement")
    ap.add_argument("--perturb_n", type=int, default=8, help="texts for the perturbation-detector throughput")
    ap.add_argument("--n_perturbations", type=int, default=None, help="perturbations per text (default: the profile's)")
    ap.add_argument("--skip_runs", action="store_true", help="only the panel and perturbation measurements (no end-to-end runs)")
    ap.add_argument("--sweep_n", type=int, default=4, help="texts for the budget-sweep generation measurement")
    args = ap.parse_args()
    base = Path(args.out)
    shutil.rmtree(base, ignore_errors=True)
    store = base / "store"
    if args.skip_runs:
        from stealth_eval.config import resolve_config
        cfg = resolve_config(args.profile, out_dir=str(base / "cfg"))
        if args.n_perturbations: cfg["perturbation"] = {**(cfg.get("perturbation") or {}), "n_perturbations": args.n_perturbations}
        pv = panel_vs_forward(lee_texts(args.n or 48), cfg)
        pt = perturbation_throughput(lee_texts(args.perturb_n), cfg, base / "perturb_store")
        bs = budget_sweep_ratio(lee_texts(args.sweep_n, words=100), cfg, base / "budget")
        report = {"profile": args.profile, "panel": {k: round(v, 3) if isinstance(v, float) else v for k, v in pv.items()},
                  "perturbation": pt, "budget_sweep_over_8_candidates": bs}
        base.mkdir(parents=True, exist_ok=True)
        (base / "bench.json").write_text(json.dumps(report, indent=2))
        print(json.dumps(report, indent=2))
        print(f"\npanel: {pv['panel_tokens_per_s']:.0f} tokens/s; panel/forward = {pv['ratio']:.2f} (goal <= 1.2); "
              f"perturbation detectors: {pt['all_texts_per_s']} texts/s ({pt['n_perturbations']} perturbations each); "
              f"budget sweep / 8 candidates = {bs['ratio']} (goal <= 1.05)")
        return
    extra = ["--set", f"data.n_per_class={args.n}"] if args.n else []
    cold = run(args.profile, base / "cold", store, extra)
    warm = run(args.profile, base / "warm", store, extra)
    info = json.loads((base / "cold" / "run_info.json").read_text())
    cfg = json.loads((base / "cold" / "config.json").read_text())
    if args.n_perturbations: cfg["perturbation"] = {**(cfg.get("perturbation") or {}), "n_perturbations": args.n_perturbations}
    raw = [json.loads(l) for l in (base / "cold" / "raw_outputs.jsonl").read_text().splitlines()]
    n_rows = {"00_data": sum(1 for r in raw if r["method"] == "m0" and r["defense"] == "none"),
              "10_methods": len(raw), "20_detectors": len(raw), "30_calibration_metrics": len(raw), "40_figures": len(raw)}
    stages = {k: v["seconds"] for k, v in info["stages"].items()}
    pv = panel_vs_forward(run_texts(base / "cold", args.n or 48), cfg)
    pt = perturbation_throughput(run_texts(base / "cold", args.perturb_n), cfg, base / "perturb_store")
    sweep = budget_sweep_ratio(run_texts(base / "cold", args.sweep_n), cfg, base / "budget")
    report = {
        "machine": f"{platform.processor() or platform.machine()}, {__import__('os').cpu_count()} cores, {platform.system()} "
                   f"{platform.release()}, python {platform.python_version()}",
        "profile": args.profile, "cold_run_s": round(cold, 1), "warm_rerun_s": round(warm, 1),
        "warm_over_cold": round(warm / cold, 4), "panel": {k: round(v, 3) if isinstance(v, float) else v for k, v in pv.items()},
        "perturbation": pt,
        "budget_sweep_over_8_candidates": sweep,
        "stage_seconds_cold": stages,
        "stage_texts_per_s_cold": {k: round(n_rows[k] / max(v, 1e-9), 2) for k, v in stages.items()},
        "dominant_stage": max(stages, key=stages.get),
    }
    (base / "bench.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    dom = report["dominant_stage"]
    print(f"\nwarm/cold = {report['warm_over_cold']:.3f} (goal <= 0.05); panel/forward = {pv['ratio']:.2f} (goal <= 1.2); "
          f"budget sweep / 8 candidates = {sweep['ratio']} (goal <= 1.05)")
    print(f"panel: {pv['panel_tokens_per_s']:.0f} tokens/s; perturbation detectors: {pt['all_texts_per_s']} texts/s "
          f"({pt['n_perturbations']} perturbations each)")
    print(f"end-to-end: {dom} dominates ({stages[dom]:.0f} s of {sum(stages.values()):.0f} s in stages)")


if __name__ == "__main__":
    main()
