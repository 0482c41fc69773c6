"""Benchmark loaders (`stealth_eval.benchmarks_hub`).

The Adversarial Paraphrasing loader runs on the real released outputs in `../shared/data/adversarial_paraphrasing`, with
counts checked against its SOURCE.md. MAGE, RAID and Beemo are distributed only through the Hugging Face hub, so their
loaders run on small files that the tests write in the public formats, read through `datasets.load_dataset`. The hub
itself is never contacted: its branch is tested with `datasets.load_dataset` and the revision lookup replaced.
"""
import json
import re
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import huggingface_hub
import pandas as pd
import pytest

from stealth_eval import benchmarks_hub as bh
from stealth_eval.core import StealthEvalError
from stealth_eval.core import recording_sources
from stealth_eval.data import validate_records

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
AP = SHARED_DATA / "adversarial_paraphrasing"
SETTINGS = ["noadv", "adv_mage", "adv_radar", "adv_robbase", "adv_roblarge"]
DETECTORS = ["fastdetectgpt", "gltr", "mage", "radar", "robbase", "roblarge"]


def n_rows(records, drops):
    return len(records) + sum(d.get("count", 1) for d in drops)


@pytest.fixture(autouse=True)
def no_hub(monkeypatch, tmp_path):
    "No test may reach the network (offline mode; hub calls fail loudly); `datasets` caches go under tmp_path."
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf_datasets_cache"))
    monkeypatch.delenv("STEALTH_EVAL_DATA", raising=False)
    def forbidden(*a, **kw): raise AssertionError(f"the hub was contacted: {a} {kw}")
    monkeypatch.setattr(huggingface_hub, "snapshot_download", forbidden)
    monkeypatch.setattr(huggingface_hub.HfApi, "dataset_info", forbidden)


# ---------------------------------------------------------------- Adversarial Paraphrasing, real files

@pytest.fixture(scope="module")
def ap():
    if not AP.is_dir():
        pytest.skip(f"../shared/data not found: {AP} (the released Adversarial Paraphrasing outputs)")
    return bh.load_adversarial_paraphrasing(AP)


def test_ap_counts_match_source_md(ap):
    records, drops = ap
    assert drops == []
    assert Counter(r.get("setting", "human") for r in records) == {"human": 2000, **{s: 2000 for s in SETTINGS}}
    assert len({r["id"] for r in records}) == len(records)
    # SOURCE.md: adv/radar has 4 empty outputs (3 duplicates); other folders none; 21 duplicate human texts
    empty = sorted(r["id"] for r in records if not r["text"].strip())
    assert empty == [f"apmage_adv_radar_{i:04d}" for i in (967, 1439, 1717, 1975)]
    for s in SETTINGS:
        texts = [r["text"] for r in records if r.get("setting") == s]
        assert len(texts) - len(set(texts)) == (3 if s == "adv_radar" else 0), s
    human = [r["text"] for r in records if r["label"] == "human"]
    assert len(human) - len(set(human)) == 21
    assert all(100 <= len(t.split(" ")) <= 200 for t in human)  # upstream's 100-200 word rule


def test_ap_outputs_are_method_outputs_aligned_by_index(ap):
    records, _ = ap
    ai = [r for r in records if r["label"] == "ai"]
    assert {r["method"] for r in ai} == {"m3_repo"}
    assert all(r["text_out"] == r["text"] for r in ai)
    assert {r["paraphraser"] for r in ai} == {"meta-llama/Meta-Llama-3-8B-Instruct"}
    assert {r["setting"]: r["guidance"] for r in ai}["adv_radar"] == "TrustSafeAI/RADAR-Vicuna-7B"
    for s in SETTINGS:
        rows = [r for r in ai if r["setting"] == s]
        assert [r["source_index"] for r in rows] == list(range(2000))
        assert [r["source_id"] for r in rows] == [f"apmage_ai_{i:04d}" for i in range(2000)]
    # no MAGE copy given: the source text, domain and generator are unknown, not guessed
    assert {(r["domain"], r["generator"]) for r in ai} == {("unknown", "unknown")}
    assert not any("source_text" in r for r in ai)


def test_ap_same_source_across_settings(ap):
    "SOURCE.md's check, reproduced: row i of noadv and of adv/* paraphrase the same text (content-word overlap)."
    records, _ = ap
    def words(t): return {w for w in t.lower().split() if len(w) > 4}
    def jac(a, b): return len(a & b) / max(len(a | b), 1)
    by = {s: [words(r["text"]) for r in records if r.get("setting") == s] for s in SETTINGS}
    aligned = sum(jac(a, b) for a, b in zip(by["noadv"], by["adv_mage"])) / 2000
    shifted = sum(jac(a, b) for a, b in zip(by["noadv"], by["adv_mage"][1:] + by["adv_mage"][:1])) / 2000
    assert aligned > 0.15 and shifted < 0.06, (aligned, shifted)


def test_ap_human_texts_and_scores_match_the_json(ap):
    records, _ = ap
    human = [r for r in records if r["label"] == "human"]
    assert {(r["domain"], r["generator"]) for r in human} == {("unknown", "human")}
    for det in DETECTORS:
        rows = json.loads((AP / "outputs" / "human_text_scores" / f"data-mage_model-{det}.json").read_text())
        assert [r["text"] for r in human] == [x["text"] for x in rows]
        assert [r["upstream_scores"][det] for r in human] == [x["score"] for x in rows]
    assert set(human[0]["upstream_scores"]) == set(DETECTORS)


def test_ap_records_fit_the_dataset_schema(ap):
    records, _ = ap
    for s in SETTINGS:
        df = validate_records(pd.DataFrame([r for r in records if r["label"] == "human" or r.get("setting") == s]), f"ap {s}")
        assert df["label"].value_counts().to_dict() == {"human": 2000, "ai": 2000}
        invalid = dict(zip(df.loc[~df["valid"], "id"], df.loc[~df["valid"], "fail_reason"]))
        # kept and marked invalid by the pipeline's validity rule: failed attack outputs count against the attack
        expected = {"adv_radar": {f"apmage_adv_radar_{i:04d}": "empty text" for i in (967, 1439, 1717, 1975)},
                    "adv_mage": {"apmage_adv_mage_0023": "too short: 9 words < 10"}}.get(s, {})
        assert invalid == expected, s


def test_ap_found_through_stealth_eval_data(monkeypatch):
    if not AP.is_dir():
        pytest.skip(f"../shared/data not found: {AP}")
    monkeypatch.setenv("STEALTH_EVAL_DATA", str(SHARED_DATA))
    records, _ = bh.load_adversarial_paraphrasing()
    assert len(records) == 12000


def test_ap_missing_says_where_to_put_it(monkeypatch, tmp_path):
    monkeypatch.setenv("STEALTH_EVAL_DATA", str(tmp_path))
    with pytest.raises(StealthEvalError, match=r"adversarial_paraphrasing: no local copy, and it is not distributed on the Hugging Face hub") as e:
        bh.load_adversarial_paraphrasing()
    assert "chengez/Adversarial-Paraphrasing" in str(e.value) and str(tmp_path) in str(e.value)


# ---------------------------------------------------------------- MAGE, in its public format

def write_mage(folder: Path, n=30, seed=0):
    "A MAGE-format test.csv: `text, label (1 = human, 0 = machine), src`, with lengths from 5 to 120 words."
    import numpy as np
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        rows.append((" ".join([f"human{i}"] + ["h"] * int(rng.integers(4, 120))), 1, ["xsum_human", "sci_gen_human", "cmv_human"][i % 3]))
        rows.append((" ".join([f"machine{i}"] + ["m"] * int(rng.integers(4, 120))), 0,
                     ["xsum_machine_topical_gpt-3.5-trubo", "sci_gen_machine_continuation_opt_1.3b", "cmv_machine_specified__65B"][i % 3]))
    folder.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows, columns=["text", "label", "src"]).to_csv(folder / "test.csv", index=False)
    return rows


def test_mage_balanced_window_labels_and_accounting(tmp_path):
    rows = write_mage(tmp_path / "mage")
    records, drops = bh.load_mage(tmp_path / "mage", n_per_class=8, min_tokens=20, max_tokens=100, seed=3)
    assert Counter(r["label"] for r in records) == {"human": 8, "ai": 8}
    assert all(r["text"].startswith("human") == (r["label"] == "human") for r in records)  # label 1 = human
    assert all(20 <= r["n_tokens"] == len(r["text"].split()) <= 100 for r in records)
    assert {r["generator"] for r in records if r["label"] == "human"} == {"human"}
    assert {(r["domain"], r["generator"]) for r in records if r["label"] == "ai"} <= {
        ("xsum", "gpt-3.5-trubo"), ("sci_gen", "opt_1.3b"), ("cmv", "llama_65B")}
    assert n_rows(records, drops) == len(rows)
    assert {d["filter"] for d in drops} <= {"length_window", "sample"}
    assert records == bh.load_mage(tmp_path / "mage", n_per_class=8, min_tokens=20, max_tokens=100, seed=3)[0]
    assert records != bh.load_mage(tmp_path / "mage", n_per_class=8, min_tokens=20, max_tokens=100, seed=4)[0]


def test_mage_found_through_stealth_eval_data_and_errors(monkeypatch, tmp_path):
    write_mage(tmp_path / "mage")
    monkeypatch.setenv("STEALTH_EVAL_DATA", str(tmp_path))
    assert len(bh.load_mage(n_per_class=5, min_tokens=1, max_tokens=1000)[0]) == 10
    pd.DataFrame({"text": ["a b"], "label": [2], "src": ["xsum_human"]}).to_csv(tmp_path / "mage" / "test.csv", index=False)
    with pytest.raises(StealthEvalError, match=r"test\.csv: column 'label' has unknown value\(s\) '2'"):
        bh.load_mage()
    pd.DataFrame({"content": ["a b"], "label": [1], "src": ["x"]}).to_csv(tmp_path / "mage" / "test.csv", index=False)
    with pytest.raises(StealthEvalError, match=r"missing column\(s\) 'text'.*found: content, label, src"):
        bh.load_mage()


def test_mage_offline_without_data_says_what_to_fetch(monkeypatch, tmp_path):
    monkeypatch.setenv("STEALTH_EVAL_DATA", str(tmp_path))
    with pytest.raises(StealthEvalError) as e:
        bh.load_mage()
    msg = str(e.value)
    assert "offline mode" in msg and "test.csv" in msg and "yaful/MAGE" in msg and f"{tmp_path}" in msg


def fake_hub(monkeypatch, snapshots: Path) -> list:
    "Serve `hf://datasets/<repo>@<rev>/<file>` from snapshots/<repo>/<file> through the real `datasets.load_dataset`; the calls."
    import datasets
    real, calls = datasets.load_dataset, []
    def load(path, data_files, **kw):
        calls.append({"path": path, "data_files": list(data_files), "streaming": kw["streaming"]})
        parts = [re.fullmatch(r"hf://datasets/([^@]+)@[0-9a-f]{40}/(.+)", url) for url in data_files]
        assert all(parts), f"not a pinned hub file: {data_files}"
        return real(path, data_files=[str(snapshots / m[1] / m[2]) for m in parts], **kw)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(datasets, "load_dataset", load)
    return calls


def test_hub_branch_when_online(monkeypatch, tmp_path):
    "Online and without a local copy, MAGE is read from its pinned commit with `datasets.load_dataset` (hub replaced here)."
    write_mage(tmp_path / "hub" / "yaful" / "MAGE")
    calls = fake_hub(monkeypatch, tmp_path / "hub")
    with recording_sources() as sources:
        records, _ = bh.load_mage(n_per_class=4, min_tokens=1, max_tokens=1000)
    assert len(records) == 8
    url = f"hf://datasets/yaful/MAGE@{bh.MAGE_REVISION}/test.csv"
    assert calls == [{"path": "csv", "data_files": [url], "streaming": False}]
    assert [(s["kind"], s["repo_id"], s["revision"], s["files"]) for s in sources] == [("hub", "yaful/MAGE", bh.MAGE_REVISION, ["test.csv"])]
    assert len(sources[0]["fingerprint"]) == 16 and "datasets" in sources[0]["reader"]


def test_hub_branch_resolves_a_branch_to_its_commit(monkeypatch, tmp_path):
    "`main` is looked up once and the commit it names is what is read (streamed, for RAID) and recorded."
    write_raid(tmp_path / "hub" / "liamdugan" / "raid" / "train.csv")
    calls = fake_hub(monkeypatch, tmp_path / "hub")
    looked_up = []
    def dataset_info(self, repo_id, revision=None, **kw):
        looked_up.append((repo_id, revision))
        return SimpleNamespace(sha="c0ffee" * 6 + "abcd")
    monkeypatch.setattr(huggingface_hub.HfApi, "dataset_info", dataset_info)
    with recording_sources() as sources:
        records, _ = bh.load_raid_slice(n_per_class=8)
    assert Counter(r["label"] for r in records) == {"human": 8, "ai": 8}
    assert looked_up == [("liamdugan/raid", "main")]
    assert calls == [{"path": "csv", "data_files": ["hf://datasets/liamdugan/raid@" + "c0ffee" * 6 + "abcd/train.csv"], "streaming": True}]
    assert [(s["repo_id"], s["revision"]) for s in sources] == [("liamdugan/raid", "c0ffee" * 6 + "abcd")]
    with pytest.raises(StealthEvalError, match=r"^hf://datasets/liamdugan/raid@c0ffeec0ffee/train.csv: no rows with domain 'books'"):
        bh.load_raid_slice(domains=["books"])


def test_hub_unreachable_says_what_to_fetch(monkeypatch, tmp_path):
    fake_hub(monkeypatch, tmp_path / "hub")
    def failing(self, *a, **kw): raise OSError("connection refused")
    monkeypatch.setattr(huggingface_hub.HfApi, "dataset_info", failing)
    with pytest.raises(StealthEvalError, match=r"^beemo: no local copy, and downloading it from the hub failed \(OSError: connection refused\)\. "
                                               r"Put data/\*\.parquet from https://huggingface.co/datasets/toloka/beemo into \$STEALTH_EVAL_DATA/beemo/"):
        bh.load_beemo()


@pytest.mark.parametrize("loader, name, files, repo", [(bh.load_mage, "mage", "test.csv", "yaful/MAGE"),
                                                       (bh.load_raid_slice, "raid", "train.csv", "liamdugan/raid"),
                                                       (bh.load_beemo, "beemo", "data/*.parquet", "toloka/beemo")])
def test_offline_without_data_says_which_files_to_put_where(monkeypatch, tmp_path, loader, name, files, repo):
    monkeypatch.setenv("STEALTH_EVAL_DATA", str(tmp_path))
    with pytest.raises(StealthEvalError) as e:
        loader()
    assert str(e.value) == (f"{name}: no local copy, and offline mode (HF_HUB_OFFLINE=1) forbids the hub. Put {files} from "
                            f"https://huggingface.co/datasets/{repo} into $STEALTH_EVAL_DATA/{name}/ (STEALTH_EVAL_DATA is set to "
                            f"{tmp_path}), or pass path=...")


# ---------------------------------------------------------------- RAID, in its public format

def write_raid(path: Path):
    rows = []
    def add(id, src, model, dom, text, attack="none", dec="", rep=""):
        rows.append(dict(zip(bh.RAID_COLUMNS, [id, id, src, model, dec, rep, attack, dom, f"t {src}", "", text])))
    for d in ("news", "wiki", "reddit"):
        for i in range(110):
            h = f"{d}-{i:03d}"
            add(h, h, "human", d, f"human {h}")
            add(f"{h}-syn", h, "human", d, f"synonyms {h}", attack="synonym")
            for g in ("gpt4", "llama-chat", "mistral"):
                for dec in ("greedy", "sampling"):
                    add(f"{h}-{g}-{dec}", h, g, d, f"{g} {dec} {h}", dec=dec, rep="no")
                    add(f"{h}-{g}-{dec}-rep", h, g, d, f"{g} {dec} rep {h}", dec=dec, rep="yes")
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows, columns=bh.RAID_COLUMNS).to_csv(path, index=False)
    return rows


def test_raid_default_slice_is_paired_balanced_and_accounted(tmp_path):
    rows = write_raid(tmp_path / "raid" / "train.csv")
    records, drops = bh.load_raid_slice(tmp_path / "raid")
    human = {r["id"]: r for r in records if r["label"] == "human"}
    ai = [r for r in records if r["label"] == "ai"]
    assert (len(human), len(ai)) == (200, 200)
    assert Counter((r["domain"], r["generator"]) for r in ai) == {(d, g): 50 for d in bh.RAID_DEFAULT_DOMAINS for g in bh.RAID_DEFAULT_GENERATORS}
    assert sorted(r["source_id"] for r in ai) == sorted(human)
    assert all(r["text"].endswith(r["source_id"]) and (r["decoding"], r["repetition_penalty"]) == ("sampling", "no") for r in ai)
    assert n_rows(records, drops) == len(rows)
    assert {d["filter"]: d["count"] for d in drops if d["id"] == "*"} == {"attack": 330, "domain": 110 * 13, "generator": 2 * 110 * 4}


def test_raid_small_slice_quota_per_cell(tmp_path):
    write_raid(tmp_path / "raid" / "train_none.csv")
    records, drops = bh.load_raid_slice(tmp_path / "raid", n_per_class=40, seed=1)
    ai = [r for r in records if r["label"] == "ai"]
    assert Counter((r["domain"], r["generator"]) for r in ai) == {(d, g): 10 for d in ("news", "wiki") for g in ("gpt4", "llama-chat")}
    assert Counter(r["label"] for r in records) == {"human": 40, "ai": 40}
    again, _ = bh.load_raid_slice(tmp_path / "raid", n_per_class=40, seed=1)
    other, _ = bh.load_raid_slice(tmp_path / "raid", n_per_class=40, seed=2)
    assert records == again and records != other
    short, _ = bh.load_raid_slice(tmp_path / "raid", n_per_class=400)  # 110 human texts per domain: fewer than asked
    assert Counter(r["label"] for r in short) == {"human": 220, "ai": 220}
    assert Counter(r["generator"] for r in short if r["label"] == "ai") == {"gpt4": 200, "llama-chat": 20}
    with pytest.raises(StealthEvalError, match=r"no rows with domain 'books'; values in column 'domain': 'news', 'reddit', 'wiki'"):
        bh.load_raid_slice(tmp_path / "raid", domains=["books"])


# ---------------------------------------------------------------- Beemo, in its public format

def test_beemo_versions_labels_and_accounting(tmp_path):
    rows = []
    for i in range(5):
        rows.append({"id": 100 + i, "category": ["Open QA", "Rewrite"][i % 2], "model": "meta-llama/Llama-2-7b-chat-hf",
                     "prompt_id": f"p{i}", "prompt": f"prompt {i}", "model_output": f"machine {i}", "human_output": f"human {i}",
                     "human_edits": f"expert {i}" if i != 4 else "",
                     "llama-3.1-70b_edits": str([{"P1": f"llama P1 {i}"}, {"P2": f"llama P2 {i}"}, {"P3": f"llama P3 {i}"}]),
                     "gpt-4o_edits": str([{"P1": f"gpt P1 {i}"}, {"P2": f"gpt P2 {i}"}, {"P3": f"gpt P3 {i}"}])})
    (tmp_path / "beemo" / "data").mkdir(parents=True)
    pd.DataFrame(rows).to_parquet(tmp_path / "beemo" / "data" / "train-00000-of-00001.parquet")
    records, drops = bh.load_beemo(tmp_path / "beemo")
    assert drops == [{"id": "beemo_104_expert", "filter": "empty", "reason": "empty human_edits"}]
    assert n_rows(records, drops) == 5 * (3 + 6)
    assert Counter((r["version"], r["label"], r["edit"]) for r in records) == {
        ("human", "human", ""): 5, ("machine", "ai", ""): 5, ("expert", "ai", "expert"): 4,
        ("llm", "ai", "llm:llama-3.1-70b"): 15, ("llm", "ai", "llm:gpt-4o"): 15}
    assert {r["generator"] for r in records if r["label"] == "human"} == {"human"}
    assert {r["domain"] for r in records} == {"open_qa", "rewrite"}
    by = {r["id"]: r for r in records}
    assert by["beemo_102_gpt-4o_P3"]["text"] == "gpt P3 2" and by["beemo_102_gpt-4o_P3"]["source_id"] == "102"
    assert Counter(r["label"] for r in bh.beemo_task(records, "human_vs_expert")) == {"human": 5, "ai": 4}
    assert validate_records(pd.DataFrame(records), "beemo", min_words=1)["valid"].all()
