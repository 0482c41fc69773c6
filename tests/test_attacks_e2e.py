"""The attacks every benchmark reports, end to end on the tiny profile (#38): one command-line run with RAID's attacks
on AI and on human texts, DIPPER's protocol through its offline stand-in, recursive paraphrasing of it to depth 2, and
the sanitize defense on RAID's outputs; then what each later stage made of the new conditions (scores, similarity to
the source and to the previous depth, the false-positive rate under attack, its table and figure, the acceptance
report). Each attack's own definition is tested in test_raid, test_dipper, test_recursive and test_human_attacks; this
run checks that they go through every stage. It reads the tiny run's store, so only the new work is computed."""
import json

import pandas as pd
import pytest

from conftest import run_cli
from stealth_eval.core import read_jsonl
from stealth_eval.schema import Raid

@pytest.fixture(scope="module")
def attacks_run(tiny_run, tmp_path_factory):
    import shutil
    d = tmp_path_factory.mktemp("attacks")
    store = shutil.copytree(tiny_run["store"], d / "store")
    out = d / "out"
    p = run_cli("--profile", "tiny", "--methods", "m0", "raid", "dipper_lm", "recursive",
                "--detectors", "log_likelihood", "fast_detectgpt", "--out_dir", out, "--offline", "--cache_dir", store,
                "--set", "data.n_per_class=3", "dipper.lex_order=[[60,60]]", 'recursive.methods=["dipper_lm"]',
                "recursive.depths=[1,2]", 'human_attacks=["raid"]')
    return {"out": out, "stderr": p.stderr}

def test_every_new_attack_runs_through_every_stage(attacks_run):
    out = attacks_run["out"]
    raw = pd.DataFrame(read_jsonl(out / "raw_outputs.jsonl"))
    conds = {(r["label"], r["condition"]) for r in raw.to_dict(orient="records")}
    for a in Raid().attacks:   # every default RAID attack, on AI texts and on human texts, each a condition
        assert ("ai", f"raid:{a}") in conds and ("human", f"raid:{a},human") in conds, a
    assert ("ai", "raid:zero_width_space+sanitize") in conds and ("human", "raid:zero_width_space,human+sanitize") in conds
    zw = raw[raw["condition"].str.startswith("raid:zero_width_space")]
    assert zw.loc[zw["defense"] == "none", "text_out"].str.contains("\u200b").all()
    assert not zw.loc[zw["defense"] == "sanitize", "text_out"].str.contains("\u200b").any()   # the defense undoes it

    dl = raw[(raw["method"] == "dipper_lm") & (raw["candidate_rank"] == 0)]
    assert set(dl["condition"]) == {"dipper_lm:L=60,O=60"} and len(dl) == 3
    assert all(f["splitter"] == "nltk-punkt" and f["n_windows"] >= 1 for f in dl["facts"])

    rec = raw[(raw["method"] == "recursive") & (raw["candidate_rank"] == 0)]
    depth = rec["condition"].str.extract(r"depth=(\d+)$")[0].astype(int)
    assert sorted(set(depth)) == [1, 2] and rec["condition"].str.startswith("recursive:base=dipper_lm").all()
    d1 = dict(zip(rec.loc[depth == 1, "sample_id"], rec.loc[depth == 1, "text_out"]))
    d1_stand = dict(zip(dl["sample_id"], dl["text_out"]))
    assert d1 == d1_stand                                      # depth 1 is the method's own output (from the store)
    for sid, f in zip(rec.loc[depth == 2, "sample_id"], rec.loc[depth == 2, "facts"]):
        assert f["depth"] == 2 and f["previous_text"] == d1[sid]

    q = pd.read_parquet(out / "quality.parquet")
    q2 = q[q["condition"].str.endswith("depth=2")]
    assert len(q2) and q2["sim_previous"].notna().all() and q2["sim"].notna().all()

    scores = pd.read_parquet(out / "scores.parquet")
    assert {"raid:homoglyph", "raid:homoglyph,human", "dipper_lm:L=60,O=60"} <= set(scores["condition"])

    m = pd.read_parquet(out / "metrics.parquet")
    h = m[m["family"] == "human_attack"]
    assert {"human_attack:fpr", "human_attack:tpr"} <= set(h["metric"]) and h["group"].str.startswith("raid:").all()
    assert set(h["detector"].dropna()) >= {"log_likelihood", "fast_detectgpt"}
    fpr = h[h["metric"] == "human_attack:fpr"]["value"].dropna()
    assert len(fpr) and fpr.between(0, 1).all()

    table = (out / "tables" / "table_human_attack.md").read_text()
    assert "raid:zero_width_space" in table
    assert (out / "figures" / "fig_fpr_attack_lee_news.png").stat().st_size > 10_000
    acc = (out / "acceptance.md").read_text()
    crit_2b = next(line for line in acc.splitlines() if line.startswith("| **2b**"))
    assert "`raid:" in crit_2b and "`dipper_lm:L=60,O=60`" in crit_2b   # criterion 2b reads the new methods' conditions
