"""Benchmark tables read through `datasets` (#16): a RAID-sized file sliced without loading it whole, the Arrow caches
where they are asked to be, and what was read (hub commit or file hashes) carried into the run's provenance.

The hub is never contacted (offline mode, `HF_DATASETS_CACHE` under tmp_path)."""
import hashlib
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest

from stealth_eval import benchmarks_hub as bh
from stealth_eval.core import StealthEvalError, read_json
from stealth_eval.core import recording_sources

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf_datasets_cache"))
    monkeypatch.delenv("STEALTH_EVAL_DATA", raising=False)


def write_big_raid(path: Path, n_rows: int, domains_kept=("news", "wiki"), generators_kept=("gpt4", "llama-chat")) -> Counter:
    """A RAID-format train file of `n_rows` rows, written in blocks with pyarrow: 8 domains, 4 generators x 2 decodings x
    2 penalties, 5 attacks besides `none`; ~345 bytes a row. Returns how many rows each filter of the default slice drops."""
    import pyarrow as pa
    from pyarrow import csv as pacsv
    domains = ["news", "wiki", "reddit", "books", "abstracts", "recipes", "poetry", "reviews"]
    attacks = ["none", "synonym", "paraphrase", "homoglyph", "whitespace", "misspelling"]
    variants = [("human", "", "")] + [(g, d, r) for g in ("gpt4", "llama-chat", "mistral", "cohere")
                                      for d in ("greedy", "sampling") for r in ("no", "yes")]
    filler = " lorem ipsum dolor sit amet" * 6
    schema = pa.schema([(c, pa.string()) for c in bh.RAID_COLUMNS])
    path.parent.mkdir(parents=True, exist_ok=True)
    expect, written, s = Counter(), 0, 0
    with pacsv.CSVWriter(str(path), schema) as w:
        while written < n_rows:
            cols = {c: [] for c in bh.RAID_COLUMNS}
            for _ in range(1000):
                d, h = domains[s % len(domains)], f"{domains[s % len(domains)]}-{s:07d}"
                for a in attacks:
                    for m, dec, rep in variants:
                        if written == n_rows: break
                        rid = h if (m == "human" and a == "none") else f"{h}-{m}-{dec}-{rep}-{a}"
                        for c, v in zip(bh.RAID_COLUMNS, [rid, h, h, m, dec, rep, a, d, f"title {h}", "", f"{m} {a} {h}{filler}"]):
                            cols[c].append(v)
                        written += 1
                        if a != "none": expect["attack"] += 1
                        elif d not in domains_kept: expect["domain"] += 1
                        elif m not in ("human", *generators_kept): expect["generator"] += 1
                        elif m != "human": expect["decoding" if dec != "sampling" else "repetition_penalty" if rep != "no" else "ai"] += 1
                        else: expect["human"] += 1
                s += 1
            w.write_table(pa.table(cols, schema=schema))
    return expect


CHILD = """
import gc, json, re, resource, sys, time
from collections import Counter
from stealth_eval import benchmarks_hub as bh
from stealth_eval.core import recording_sources
def peak_kb():   # the process's peak RSS (Linux: VmHWM, which clear_refs can restart), else ru_maxrss
    try: return int(re.search(r"VmHWM:\\s+(\\d+)", open("/proc/self/status").read())[1])
    except OSError: return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
bh.load_raid_slice(sys.argv[1], n_per_class=4)   # warm-up on a small file: every lazy import is done before measuring
gc.collect()
try: open("/proc/self/clear_refs", "w").write("5")   # restart the peak from the current RSS
except OSError: pass
base = peak_kb()
t = time.perf_counter()
with recording_sources() as sources:
    records, drops = bh.load_raid_slice(sys.argv[2])
seconds = time.perf_counter() - t
peak = peak_kb()
print(json.dumps({"base_kb": base, "peak_kb": peak, "seconds": seconds, "sources": sources,
                  "cells": Counter(f"{r['domain']}/{r['generator']}" for r in records if r["label"] == "ai"),
                  "labels": Counter(r["label"] for r in records),
                  "n_accounted": len(records) + sum(d.get("count", 1) for d in drops),
                  "summarised": {d["filter"]: d["count"] for d in drops if d["id"] == "*"},
                  "per_row": Counter(d["filter"] for d in drops if d["id"] != "*")}))
"""


def test_raid_million_rows_sliced_without_loading_it_whole(tmp_path):
    "1,000,000 RAID rows (~345 MB) are streamed: the slice is exact and the memory it adds stays far below the file in pandas."
    n = 1_000_000
    big, small = tmp_path / "train.csv", tmp_path / "small" / "train.csv"
    small.parent.mkdir()
    expect = write_big_raid(big, n)
    write_big_raid(small, 3_000)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", CHILD, str(small), str(big)], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    # the slice: every row accounted for, the default quota in each cell, the filters' counts as written
    assert r["n_accounted"] == n
    assert r["labels"] == {"human": 200, "ai": 200}
    assert r["cells"] == {f"{d}/{g}": 50 for d in bh.RAID_DEFAULT_DOMAINS for g in bh.RAID_DEFAULT_GENERATORS}
    assert r["summarised"] == {k: expect[k] for k in ("attack", "domain", "generator")}
    assert r["per_row"]["decoding"] == expect["decoding"] and r["per_row"]["repetition_penalty"] == expect["repetition_penalty"]
    assert r["per_row"]["sample"] == expect["human"] + expect["ai"] - 400
    # what was read: the file's own SHA-256, streamed (no Arrow cache, no fingerprint)
    [src] = r["sources"]
    assert src["kind"] == "local" and "streaming" in src["reader"] and "fingerprint" not in src
    h = hashlib.sha256()
    with open(big, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""): h.update(block)
    assert src["files"] == [{"path": str(big), "bytes": big.stat().st_size, "sha256": h.hexdigest()}]
    assert not list((tmp_path / "hf_datasets_cache").rglob("*.arrow"))
    # memory: what the slice added over the warmed-up process, against the file loaded whole in pandas (estimated from
    # 100,000 rows, as strings), and against the file's size
    added = (r["peak_kb"] - r["base_kb"]) * 1024
    in_pandas = pd.read_csv(big, dtype=str, keep_default_na=False, nrows=100_000).memory_usage(deep=True).sum() * n / 100_000
    size = big.stat().st_size
    print(f"\nRAID {n:,} rows, {size / 2**20:.0f} MiB on disk, ~{in_pandas / 2**20:.0f} MiB in pandas: slice in {r['seconds']:.1f} s, "
          f"peak RSS {r['peak_kb'] / 1024:.0f} MiB = {r['base_kb'] / 1024:.0f} MiB before + {added / 2**20:.0f} MiB")
    assert added < in_pandas / 2 and added < size / 2, (added, in_pandas, size)


def write_mage_texts(folder: Path, n: int = 40):
    folder.mkdir(parents=True, exist_ok=True)
    rows = [(f"human text {i} " + "word " * (100 + i % 9), 1, "xsum_human") for i in range(n)]
    rows += [(f"machine text {i} " + "token " * (100 + i % 7), 0, "xsum_machine_topical_gpt-3.5-trubo") for i in range(n)]
    pd.DataFrame(rows, columns=bh.MAGE_COLUMNS).to_csv(folder / "test.csv", index=False)


def test_small_tables_are_cached_where_asked_and_fingerprinted(tmp_path):
    write_mage_texts(tmp_path / "mage")
    with recording_sources() as sources:
        first, _ = bh.load_mage(tmp_path / "mage", n_per_class=5, min_tokens=1, max_tokens=1000)
        again, _ = bh.load_mage(tmp_path / "mage", n_per_class=5, min_tokens=1, max_tokens=1000)
    assert first == again
    arrow = list((tmp_path / "hf_datasets_cache").rglob("*.arrow"))
    assert len(arrow) == 1                                      # built once (in $HF_DATASETS_CACHE), memory-mapped the second time
    [src] = sources                                             # the same file read twice is one source
    assert src["files"][0]["sha256"] == hashlib.sha256((tmp_path / "mage" / "test.csv").read_bytes()).hexdigest()
    assert len(src["fingerprint"]) == 16 and src["reader"].startswith("datasets ")


def test_a_file_that_cannot_be_read_is_one_line_naming_it(tmp_path):
    (tmp_path / "mage").mkdir()
    (tmp_path / "mage" / "test.csv").write_bytes(b"text,label,src\nfine,1,xsum_human\n\xff\xfe broken,0,x\n")
    with pytest.raises(StealthEvalError, match=r"test\.csv: invalid UTF-8 \(invalid start byte\)$"):
        bh.load_mage(tmp_path / "mage")
    (tmp_path / "raid").mkdir()
    (tmp_path / "raid" / "train.csv").write_text(",".join(bh.RAID_COLUMNS) + '\n"unclosed,quote\n', encoding="utf-8")
    with pytest.raises(StealthEvalError, match=r"train\.csv: not readable \(") as e:
        bh.load_raid_slice(tmp_path / "raid")
    assert "\n" not in str(e.value)


def test_sources_reach_the_card_and_results_json(tmp_path, monkeypatch):
    "The data stage records what each benchmark read into its card; results.json collects the cards' sources."
    from stealth_eval.config import resolve_config
    from stealth_eval.data import run_data_stage
    from stealth_eval.metrics import results_info
    write_mage_texts(tmp_path / "data" / "mage")
    write_big_raid(tmp_path / "data" / "raid" / "train_none.csv", 3_000)
    user = tmp_path / "mine.csv"
    pd.DataFrame({"id": ["h", "a"], "label": ["human", "ai"], "domain": "d", "generator": ["human", "g"],
                  "text": ["a human text of more than ten words, written by a person", "an AI text of more than ten words, "
                           "written by a model here"]}).to_csv(user, index=False)
    monkeypatch.setenv("STEALTH_EVAL_DATA", str(tmp_path / "data"))
    cfg = resolve_config("tiny", ["mage", "raid_slice", str(user)], out_dir=str(tmp_path / "run"))
    run_data_stage(cfg)
    cards = {n: read_json(tmp_path / "run" / "data" / f"{f}.card.json") for n, f in
             (("mage", "mage_eval"), ("raid_slice", "raid"), ("mine", "mine"))}
    sha = lambda p: hashlib.sha256(Path(p).read_bytes()).hexdigest()
    assert [(s["kind"], [f["sha256"] for f in s["files"]]) for s in cards["mage"]["sources"]] == \
        [("local", [sha(tmp_path / "data" / "mage" / "test.csv")])]
    assert [f["path"] for s in cards["raid_slice"]["sources"] for f in s["files"]] == [str(tmp_path / "data" / "raid" / "train_none.csv")]
    assert cards["mine"]["sources"][0]["files"][0]["sha256"] == sha(user)
    cols = ["dataset", "label", "sample_id", "candidate_rank", "method", "setting", "defense"]
    info = results_info(cfg, pd.DataFrame(columns=["metric", "higher_is_better"]), pd.DataFrame(columns=cols))
    assert info["data_sources"] == {c["dataset"]: c["sources"] for c in cards.values()}
