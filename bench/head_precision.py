"""Head precision study (issue 51, item 4; not a test, not run in CI): what the `head_dtype` device setting (the token
stream's output head in float32, bfloat16 or tf32, products accumulated in float32) changes in every stream-reading
detector's scores, against float32, on real texts.

    python bench/head_precision.py [--quick] [--n 32] [--n_train 16] [--data DIR] [--out DIR] [--window TOKENS]
                                   [--detectors NAME ...] [--conditions NAME ...] [--fresh]

Texts: DetectRL's multi-domain test files (`$STEALTH_EVAL_DATA/detectrl`, default ../shared/data/detectrl): human texts
and the plain generations (`direct_prompt`: ChatGPT, Claude-instant, PaLM, Llama-2-70b) of 100-300 words, `--n` a class
spread evenly over the four domains (arXiv, XSum, WritingPrompts, Yelp), a seeded draw; `--n_train` a class more,
disjoint, as the training split of the trained detectors (Ghostbuster; AdaDetectGPT when named).

Each condition is a run of the project's own stages on the embedded profile (`config.resolve_config` with
`--set head_dtype=...`, then `data.run_data_stage`, `methods.run_methods_stage` with m0, `detectors.run_detectors_stage`,
the CPU device profile), into its own run folder and content cache, so the scores are what a run writes to
`scores.parquet`:
- f32:      weights float32, head float32 (the CPU profile: the reference);
- head_bf16 / head_tf32: weights float32, head_dtype bfloat16 / tf32 (the head and hidden states rounded, float32 sums);
- body_bf16: weights bfloat16 (the GPU profile's `dtype`), head float32 (the GPU profile as it is);
- body_bf16_head_bf16: weights bfloat16, head_dtype bfloat16 (the GPU profile with a bf16 head), compared with body_bf16;
- redraw: f32 with the run's seed 1, for the detectors that draw (Lastde++'s and SpecDetect++'s samples, Ghostbuster's
  seeded feature-selection folds): the noise these detectors have of their own, as the perturbation-precision study's
  redrawn perturbations.
On bf16 weights the head's weights and the hidden states are bf16 values already, so a bf16 or TF32 head multiplies the
same values as the float32 head: on a CPU (a float32 product of the rounded values) the scores are bit-identical, on CUDA
(one bf16 -> float32 kernel, or TF32 tensor cores) they differ only in the order and rounding of the float32 sums.
Measured 2026-11-28 (2 shared CPU cores, 55 min): the README's Method notes, "Head precision".

Per detector and condition, against its reference: AUROC change (AI positive, on `detector_score_ai`), Spearman rank
correlation, median |score change| / IQR of the reference scores, max |change| / IQR, max relative change
(|change| / |reference score|); beside the reference AUROC's bootstrap standard deviation (1000 resamples, classes
resampled separately), the sampling noise of these texts. Output: a markdown table on stdout, OUT/head_precision.md and
OUT/head_precision.json. `--quick` (2 + 2 arXiv texts of 90-120 words, their first 48 tokens, no training split, the
f32 / head_bf16 / head_tf32 conditions, four detectors) checks that the script runs, in well under a minute.
"""
import argparse
import datetime as _dt
import json
import os
import platform
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# every detector that reads the token stream and runs offline on the embedded scoring model (stealth-eval --list);
# left out: the perturbation detectors (*_lminfill: span fills decoded by a causal LM, minutes a text on a CPU; their
# perturbed texts are scored by the same stream), TOCSIN (BART, not embedded), the pair detectors (binoculars,
# dna_detectllm, fast_detectgpt_pair: no offline pair; their single-model stand-ins are in), imbd_local /
# detectanyllm_local (LoRA-tuned copies of the scoring model, trained per run), and adadetectgpt by default (its
# witness reads every position's whole 262k-word distribution: ~15 s a text here, ~25 min a condition; name it with
# --detectors adadetectgpt on fewer texts)
DETECTORS = ["log_likelihood", "rank", "log_rank", "entropy", "lrr", "fast_detectgpt", "binoculars_single",
             "dna_detectllm_single", "lastde", "lastde_pp", "specdetect", "specdetect_pp", "glimpse_local",
             "glimpse_local_entropy", "glimpse_local_rank", "glimpse_local_logrank", "ghostbuster_local"]
QUICK_DETECTORS = ["log_likelihood", "log_rank", "fast_detectgpt", "lastde"]
SAMPLED = ["lastde_pp", "specdetect_pp", "ghostbuster_local"]   # draws of their own (seeded by the run's seed)
# name -> (weights dtype, head_dtype, the condition it is compared with, the run's seed, its detectors (None: all))
CONDITIONS = {"f32": ("float32", "float32", None, 0, None),
              "head_bf16": ("float32", "bfloat16", "f32", 0, None),
              "head_tf32": ("float32", "tf32", "f32", 0, None),
              "body_bf16": ("bfloat16", "float32", "f32", 0, None),
              "body_bf16_head_bf16": ("bfloat16", "bfloat16", "body_bf16", 0, None),
              "redraw": ("float32", "float32", "f32", 1, SAMPLED)}   # the detectors' own noise: their draws redrawn
QUICK_CONDITIONS = ["f32", "head_bf16", "head_tf32"]
DOMAINS = ("arxiv", "xsum", "writing_prompt", "yelp_review")
DATASET = "detectrl_mixed"


# ---------------------------------------------------------------- texts
def pick_texts(data, n, n_train, seed=0, words=(100, 300), domains=DOMAINS):
    "(evaluation records, training records): `n` (and `n_train`) a class, even over DetectRL's `domains`, disjoint."
    import numpy as np
    from stealth_eval.benchmarks import load_detectrl
    recs, _ = load_detectrl(data, files=[f"multi_domains_{d}_test" for d in domains])
    ok = lambda r: (r["label"] == "human" or r["data_type"] == "direct_prompt") and words[0] <= len(r["text"].split()) <= words[1]
    ev, tr = [], []
    for lab in ("human", "ai"):
        for j, dom in enumerate(domains):
            pool = sorted((r for r in recs if r["label"] == lab and r["domain"] == dom and ok(r)), key=lambda r: r["id"])
            order = np.random.default_rng([seed, j, lab == "ai"]).permutation(len(pool))
            D = len(domains)
            k, kt = n // D + (j < n % D), n_train // D + (j < n_train % D)
            if k + kt > len(pool): raise SystemExit(f"DetectRL {dom}: {len(pool)} {lab} texts of {words[0]}-{words[1]} words, {k + kt} wanted")
            rows = [{"id": pool[i]["id"], "label": lab, "domain": dom, "generator": pool[i]["generator"],
                     "text": pool[i]["text"], "source_id": pool[i]["id"]} for i in order[:k + kt]]
            ev += rows[:k]; tr += rows[k:]
    return ev, tr


def write_jsonl(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")


# ---------------------------------------------------------------- one condition: the project's stages
def run_condition(name, eval_file, train_rows, detectors, out, window=None):
    """Run data, methods (m0) and detectors stages of the embedded profile with this condition's weights dtype and
    head_dtype into OUT/runs/<name> (its own cache OUT/cache/<name>); return (scores table, seconds of the detectors
    stage, the run's detector model identity, skipped detectors)."""
    from stealth_eval.config import resolve_config
    from stealth_eval.data import run_data_stage, train_split_path
    from stealth_eval.detectors import run_detectors_stage
    from stealth_eval.methods import run_methods_stage
    dtype, head, _, seed, only = CONDITIONS[name]
    detectors = [d for d in detectors if only is None or d in only]
    if not detectors: return None, 0.0, [], {}
    run = out / "runs" / name
    win = {} if window is None else {"score_max_tokens": window, "score_windows": {d: window for d in detectors}}
    cfg = resolve_config("embedded", datasets=[str(eval_file)], methods=["m0"], detectors=detectors, out_dir=str(run),
                         seed=seed, overrides={"device": "cpu", "dtype": dtype, "head_dtype": head, "n_bootstrap": 50,
                                    "cache_dir": str(out / "cache" / name), "data.n_train_per_class": max(1, len(train_rows) // 2), **win})
    run.mkdir(parents=True, exist_ok=True)
    run_data_stage(cfg)
    if train_rows: write_jsonl(train_split_path(run, DATASET), train_rows)   # the training split a benchmark's builder would write
    run_methods_stage(cfg)
    t0 = time.perf_counter()
    scores = run_detectors_stage(cfg)
    secs = time.perf_counter() - t0
    skipped = json.loads((run / "skipped.json").read_text()) if (run / "skipped.json").exists() else {}
    scores = scores[(scores["defense"] == "none") & scores["valid"]]
    ident = sorted(set(scores["detector_model"]))
    return scores[["detector_name", "sample_id", "label", "detector_score_ai"]], secs, ident, skipped


# ---------------------------------------------------------------- comparison
def auroc(y, s):
    from sklearn.metrics import roc_auc_score
    return float(roc_auc_score(y, s))


def boot_sd(y, s, n=1000, seed=0):
    "Standard deviation of the AUROC over bootstrap resamples of each class separately."
    import numpy as np
    rng = np.random.default_rng(seed)
    y, s = np.asarray(y), np.asarray(s)
    h, a = s[y == 0], s[y == 1]
    vals = []
    for _ in range(n):
        hh, aa = rng.choice(h, len(h)), rng.choice(a, len(a))
        vals.append(auroc(np.r_[np.zeros(len(hh)), np.ones(len(aa))], np.r_[hh, aa]))
    return float(np.std(vals))


def compare(ref, new):
    "Statistics of `new`'s scores against `ref`'s (two tables of one detector, joined on the sample id)."
    import numpy as np
    from scipy.stats import spearmanr
    m = ref.merge(new, on=["sample_id", "label"], suffixes=("_ref", "_new"))
    a, b = m["detector_score_ai_ref"].to_numpy(np.float64), m["detector_score_ai_new"].to_numpy(np.float64)
    y = (m["label"] == "ai").to_numpy(int)
    d = np.abs(b - a)
    iqr = float(np.subtract(*np.percentile(a, [75, 25])))
    rel = d / np.where(np.abs(a) > 0, np.abs(a), np.nan)
    return {"n": int(len(m)), "auroc_ref": auroc(y, a), "auroc_new": auroc(y, b), "auroc_change": auroc(y, b) - auroc(y, a),
            "spearman": float(spearmanr(a, b).statistic) if d.any() else 1.0,
            "median_change_over_iqr": float(np.median(d) / iqr) if iqr > 0 else None,
            "max_change_over_iqr": float(d.max() / iqr) if iqr > 0 else None,
            "max_relative_change": float(np.nanmax(rel)) if np.isfinite(rel).any() else 0.0,
            "identical": int((d == 0).sum())}


# (hidden, vocabulary, non-embedding parameters) of the models whose heads the stream applies (shapes: the models'
# config.json, `rehearsal.REAL_CONFIGS`, parameters counted on the meta device; Gemma-3-270m: the embedded scoring LM)
HEAD_SHAPES = {"falcon-7b": (4544, 65024, 6.626e9), "llama-3-8b": (4096, 128256, 6.980e9),
               "qwen3-4b": (2560, 151936, 3.634e9), "gemma-3-270m": (640, 262144, 0.100e9)}
# dense peaks of an H200 (data sheet; the preflight measured 776 bf16 and 51 float32 TFLOP/s there)
H200_PEAKS = {"float32": 67e12, "tf32": 494.7e12, "bfloat16": 989.4e12}


def gpu_prediction(peaks=H200_PEAKS):
    """Per model: seconds a token of the pass at the peaks (body in bf16, the weights' products only, 2 FLOPs a
    parameter), the head's share in float32, and the pass's speed-up with a bf16 or TF32 head: a prediction."""
    out = {}
    for m, (H, V, body) in HEAD_SHAPES.items():
        tb, th = 2 * body / peaks["bfloat16"], {k: 2 * H * V / v for k, v in peaks.items()}
        out[m] = {"head_params": H * V, "head_gflop_token": 2 * H * V / 1e9, "body_gflop_token": 2 * body / 1e9,
                  "head_share_f32": th["float32"] / (tb + th["float32"]),
                  "speedup_bf16": (tb + th["float32"]) / (tb + th["bfloat16"]),
                  "speedup_tf32": (tb + th["float32"]) / (tb + th["tf32"]),
                  "head_f32_copy_gb": 4 * H * V / 1e9}
    return out


def machine():
    import torch
    import transformers
    return (f"CPU {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__} "
            f"({torch.get_num_threads()} threads), transformers {transformers.__version__}")


def fmt(v, spec):
    return "–" if v is None else format(v, spec)


def markdown(report):
    "One row a detector and compared condition."
    lines = ["| detector | AUROC f32 (bootstrap sd) | condition (vs) | AUROC change | rank corr. | median change / IQR | "
             "max change / IQR | max rel. change |", "|---|---|---|---|---|---|---|---|"]
    for det, row in report["detectors"].items():
        first = f"{row['auroc_f32']:.3f} ({row['auroc_f32_sd']:.3f})"
        for c, st in row["vs"].items():
            lines.append(f"| {det} | {first} | {c} (vs {CONDITIONS[c][2]}) | {st['auroc_change']:+.4f} | {st['spearman']:.6f} | "
                         f"{fmt(st['median_change_over_iqr'], '.1e')} | {fmt(st['max_change_over_iqr'], '.1e')} | "
                         f"{st['max_relative_change']:.1e} |")
            det, first = "", ""
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="2 + 2 arXiv texts of 90-120 words (48 tokens), no training "
                    "split, 3 conditions, 4 detectors: checks that the script runs")
    ap.add_argument("--n", type=int, default=None, help="evaluation texts a class (default 32; quick 2)")
    ap.add_argument("--n_train", type=int, default=None, help="training texts a class (default 16; quick 0)")
    ap.add_argument("--data", default=os.environ.get("STEALTH_EVAL_DATA") or str(ROOT.parent / "shared" / "data"),
                    help="folder holding detectrl/ (default $STEALTH_EVAL_DATA, else ../shared/data)")
    ap.add_argument("--out", default=str(ROOT / "bench_out" / "head_precision"))
    ap.add_argument("--detectors", nargs="+", default=None)
    ap.add_argument("--window", type=int, default=None, help="tokens every detector scores (default: the embedded profile's "
                    "windows, 512 or the whole text; quick 48)")
    ap.add_argument("--conditions", nargs="+", default=None, choices=list(CONDITIONS))
    ap.add_argument("--fresh", action="store_true", help="remove OUT's runs and caches first (else a rerun reads its cache)")
    args = ap.parse_args()
    n = args.n or (2 if args.quick else 32)
    n_train = args.n_train if args.n_train is not None else (0 if args.quick else 16)
    dets = args.detectors or (QUICK_DETECTORS if args.quick else DETECTORS)
    conds = args.conditions or (QUICK_CONDITIONS if args.quick else list(CONDITIONS))
    window = args.window or (48 if args.quick else None)
    conds = ["f32"] + [c for c in conds if c != "f32"]
    for c in conds:
        if CONDITIONS[c][2] not in (None, *conds): conds.insert(conds.index(c), CONDITIONS[c][2])
    out = Path(args.out)
    if args.fresh: shutil.rmtree(out, ignore_errors=True)
    (out / "runs").mkdir(parents=True, exist_ok=True)
    for c in conds: shutil.rmtree(out / "runs" / c, ignore_errors=True)   # a run folder afresh; the cache stays
    t_all = time.perf_counter()
    words, domains = ((90, 120), ("arxiv",)) if args.quick else ((100, 300), DOMAINS)
    ev, tr = pick_texts(Path(args.data) / "detectrl", n, n_train, words=words, domains=domains)
    eval_file = out / f"{DATASET}.jsonl"
    write_jsonl(eval_file, ev)
    got, report = {}, {"study": "head_dtype against float32 (issue 51 item 4)", "machine": machine(),
                       "date": _dt.date.today().isoformat(), "profile": "embedded", "device": "cpu",
                       "texts": {"eval": {"human": sum(r["label"] == "human" for r in ev), "ai": sum(r["label"] == "ai" for r in ev)},
                                 "train": {"human": sum(r["label"] == "human" for r in tr), "ai": sum(r["label"] == "ai" for r in tr)},
                                 "source": f"DetectRL multi_domains_*_test (human; direct_prompt AI), {words[0]}-{words[1]} words, even over {', '.join(domains)}",
                                 "words_median": sorted(len(r["text"].split()) for r in ev)[len(ev) // 2]},
                       "window": window or "the profile's", "conditions": conds, "condition_settings": {c: {"dtype": CONDITIONS[c][0], "head_dtype": CONDITIONS[c][1],
                                                                       "compared_with": CONDITIONS[c][2], "seed": CONDITIONS[c][3],
                                                                       "detectors": CONDITIONS[c][4]} for c in conds},
                       "seconds": {}, "models": {}, "skipped": {}, "detectors": {}}
    for c in conds:
        print(f"[head_precision] {c} (dtype {CONDITIONS[c][0]}, head_dtype {CONDITIONS[c][1]}) ...", file=sys.stderr)
        got[c], report["seconds"][c], report["models"][c], sk = run_condition(c, eval_file, tr, dets, out, window)
        report["skipped"].update({f"{c}: {k}": v for k, v in sk.items() if k not in ("methods", "detectors") and v})
    ref = got["f32"]
    scored = ref.drop_duplicates("sample_id")["label"].value_counts()
    report["texts"]["scored"] = {lab: int(scored.get(lab, 0)) for lab in ("human", "ai")}
    for det in dets:
        r0 = ref[ref["detector_name"] == det]
        if r0.empty: continue
        y = (r0["label"] == "ai").to_numpy(int)
        row = {"auroc_f32": auroc(y, r0["detector_score_ai"]), "auroc_f32_sd": boot_sd(y, r0["detector_score_ai"].to_numpy()), "vs": {}}
        for c in conds:
            base = CONDITIONS[c][2]
            if base is None: continue
            a, b = got[base], got[c]
            if b is None: continue
            a, b = a[a["detector_name"] == det], b[b["detector_name"] == det]
            if not a.empty and not b.empty: row["vs"][c] = compare(a, b)
        report["detectors"][det] = row
    report["seconds"]["total"] = time.perf_counter() - t_all
    report["gpu_prediction"] = gpu_prediction()
    md = markdown(report) + "\n\nPredicted on an H200 at its dense peaks (not measured): model: head H x V, the float32 head's share " \
        "of a pass, the pass's speed-up with a bf16 / TF32 head\n" + "\n".join(
            f"- {m}: {HEAD_SHAPES[m][0]} x {HEAD_SHAPES[m][1]}, {g['head_share_f32']:.0%}, {g['speedup_bf16']:.2f}x / {g['speedup_tf32']:.2f}x"
            for m, g in report["gpu_prediction"].items())
    (out / "head_precision.json").write_text(json.dumps(report, indent=1), encoding="utf-8")
    head = (f"{report['machine']}; {report['date']}; embedded profile ({', '.join(report['models']['f32'][:1])}); "
            f"{report['texts']['scored']['human']} human + {report['texts']['scored']['ai']} AI texts scored "
            f"(median {report['texts']['words_median']} words), training split {report['texts']['train']['human']} + "
            f"{report['texts']['train']['ai']}; detectors stage seconds: "
            + ", ".join(f"{c} {report['seconds'][c]:.0f}" for c in conds) + f"; total {report['seconds']['total']:.0f} s")
    (out / "head_precision.md").write_text(head + "\n\n" + md + "\n", encoding="utf-8")
    print(head + "\n\n" + md)
    if report["skipped"]: print("skipped: " + json.dumps(report["skipped"], indent=1), file=sys.stderr)


if __name__ == "__main__":
    main()
