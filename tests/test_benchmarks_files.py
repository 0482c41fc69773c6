"""The benchmark loaders against the real files in `../shared/data/`: counts and label conventions as each SOURCE.md states.

Skipped, with the reason shown, where the folder is absent (a user's fresh clone).
"""
import json
import re
import statistics
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from stealth_eval.benchmarks import (APT_DEGREES, APT_PERCENTS, DETECTRL_FILES, PADBEN_TASKS, load_apt_eval,
                                     load_detectrl, load_mgtbench, load_padben)
from stealth_eval.data import validate_records

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"

if not DATA.is_dir():
    pytest.skip(f"../shared/data not found: {DATA} (the real benchmark files are not part of a clone)", allow_module_level=True)


def folder(name):
    p = DATA / name
    if not p.is_dir(): pytest.skip(f"../shared/data not found: {p}")
    return p


def by(records, *keys):
    return Counter(tuple(r[k] for k in keys) if len(keys) > 1 else r[keys[0]] for r in records)


def auroc(y, s):
    "AUROC of scores `s` with `y` True as the positive class (Mann-Whitney, ties averaged)."
    from scipy.stats import rankdata
    y, r = np.asarray(y, bool), rankdata(s)
    n1, n0 = y.sum(), (~y).sum()
    return (r[y].sum() - n1 * (n1 + 1) / 2) / (n1 * n0)


# ---------------------------------------------------------------- PADBen
@pytest.fixture(scope="module")
def padben():
    return load_padben(folder("padben"))


def test_padben_counts_and_labels(padben):
    recs, drops = padben
    assert drops == []                                                  # no duplicates in tasks 2 and 5
    assert len(recs) == 2 * 16_233 and len({r["id"] for r in recs}) == len(recs)
    assert by(recs, "task", "label") == {("task2", "human"): 8_117, ("task2", "ai"): 8_116,
                                         ("task5", "human"): 8_117, ("task5", "ai"): 8_116}
    assert all(isinstance(r["text"], str) and r["text"].strip() for r in recs)      # no empty texts
    hum = {t: {r["text"] for r in recs if r["task"] == t and r["label"] == "human"} for t in PADBEN_TASKS}
    assert len(hum["task2"]) == 8_117 and hum["task2"] == hum["task5"]  # the same human originals in both tasks
    assert by([r for r in recs if r["label"] == "ai"], "task", "text_type", "edit") == {
        ("task2", "type2", ""): 8_116, ("task5", "type5-3rd", "paraphrase:llm_x3"): 8_116}
    validate_records(pd.DataFrame(recs), "padben")


def test_padben_records_what_it_read():
    "Each file a loader reads goes into the run's provenance with its size and SHA-256 (#16)."
    import hashlib
    from stealth_eval.core import recording_sources
    with recording_sources() as sources:
        load_padben(folder("padben"))
    files = [f for s in sources for f in s["files"]]
    assert [f["path"] for f in files] == [str(folder("padben") / t["file"]) for t in PADBEN_TASKS.values()]
    for f in files:
        data = Path(f["path"]).read_bytes()
        assert (f["bytes"], f["sha256"]) == (len(data), hashlib.sha256(data).hexdigest())


@pytest.mark.parametrize("task", ["task2", "task5"])
def test_padben_label_0_is_human(padben, task):
    "Upstream Fast-DetectGPT results: ground-truth labels in file order, and their AUROC is reproduced with 'ai' positive."
    recs = [r for r in padben[0] if r["task"] == task]
    raw = json.loads((folder("padben") / PADBEN_TASKS[task]["file"]).read_text())
    assert [r["idx"] for r in raw] == list(range(16_233))
    assert [r["label"] for r in raw] == [{"human": 0, "ai": 1}[r["label"]] for r in recs]
    assert [r["sentence"] for r in raw] == [r["text"] for r in recs]
    res = json.loads((folder("padben") / "evaluation/Zero_Shot_Detector/Fast_Detect_GPT/single-sentence/sampling_method/50-50"
                      / f"{task}_fast_detect_gpt_results.json").read_text())
    assert res["predictions"]["labels"] == [int(r["label"] == "ai") for r in recs]
    auc = auroc([r["label"] == "ai" for r in recs], res["predictions"]["criteria"])
    assert auc == pytest.approx(res["metrics"]["roc_auc"], abs=1e-9)
    assert round(auc, 4) == {"task2": 0.6716, "task5": 0.5768}[task]


# ---------------------------------------------------------------- APT-Eval
@pytest.fixture(scope="module")
def apt():
    return load_apt_eval(folder("apt_eval"))


def test_apt_originals(apt):
    recs, drops = apt
    assert drops == []
    orig = [r for r in recs if r["split"] == "test" and r["edit"] == ""]
    assert len(orig) == 300 and all(r["label"] == "human" and r["source_id"] == r["id"] for r in orig)
    assert by(orig, "domain") == {"blog": 52, "speech": 52, "game_review": 51, "news": 51, "paper_abstract": 51, "email_content": 43}
    assert statistics.median(len(r["text"].split()) for r in orig) == 127
    assert sum(bool(re.search(r"\bi\b", r["text"])) for r in orig) == 159          # the casing artifact
    assert len({r["id"] for r in recs}) == len(recs)


def test_apt_polished_stay_human(apt):
    recs, _ = apt
    pol = [r for r in recs if r["edit"]]
    assert len(pol) == 14_650 and all(r["label"] == "human" and r["generator"] == "human" for r in pol)
    kinds = Counter(r["edit"].split("=")[0] for r in pol)
    assert kinds == {"polish:degree": 5_227, "polish:percent": 9_423}
    assert {r["edit"] for r in pol} == {f"polish:degree={k}" for k in APT_DEGREES} | {f"polish:percent={k}" for k in APT_PERCENTS}
    assert by(pol, "polisher") == {"GPT-4o": 3_213, "DeepSeek-V3": 3_209, "Llama3.1-70B": 3_122, "Llama3-8B": 3_091, "Llama2-7B": 2_015}
    # SOURCE.md writes "email"; the files say email_content
    assert by(pol, "domain") == {"paper_abstract": 2_641, "blog": 2_556, "speech": 2_482, "news": 2_479, "game_review": 2_440,
                                 "email_content": 2_052}
    per_file = by(pol, "file")
    assert len(per_file) == 55 and min(per_file.values()) == 172 and max(per_file.values()) == 300
    orig = {r["id"]: r for r in recs if r["split"] == "test" and not r["edit"]}
    assert all(r["source_id"] in orig and r["domain"] == orig[r["source_id"]]["domain"] for r in pol)   # the join on id
    for f, n in per_file.items():                                        # no duplicate texts within a file
        assert len({r["text"] for r in pol if r["file"] == f}) == n


def test_apt_calibration_set(apt):
    recs, _ = apt
    cal = [r for r in recs if r["split"] == "calibration"]
    assert by(cal, "label") == {"ai": 300, "human": 300}
    ai = [r for r in cal if r["label"] == "ai"]
    assert {int(r["id"].rsplit("-", 1)[1]) for r in ai} == set(range(1, 301))      # ids 1-300 are machine
    assert by(ai, "generator") == {"Dolly": 72, "StableLM": 68, "ChatGLM": 59, "ChatGPT-turbo": 42, "GPT4": 32, "ChatGPT": 27}
    assert by(ai, "domain") == {"TruthfulQA_LLMs": 138, "NarrativeQA_LLMs": 99, "SQuAD1_LLMs": 63}
    # not in SOURCE.md: the 300 calibration human texts are the 300 originals (id + 300), linked through source_id
    hum = [r for r in cal if r["label"] == "human"]
    orig = {r["id"]: r["text"] for r in recs if r["split"] == "test" and not r["edit"]}
    assert all(r["source_id"] == f"apt-hwt-{int(r['id'].rsplit('-', 1)[1]) - 300}" and orig[r["source_id"]] == r["text"] for r in hum)
    validate_records(pd.DataFrame(recs), "apt_eval")


# ---------------------------------------------------------------- DetectRL
DETECTRL_COUNTS = {  # file: (rows, human, llm) from SOURCE.md
    "multi_domains_arxiv_test": (2008, 1000, 1008), "multi_domains_xsum_test": (2008, 1000, 1008),
    "multi_domains_writing_prompt_test": (2008, 1000, 1008), "multi_domains_yelp_review_test": (2008, 1000, 1008),
    "paraphrase_attacks_llm_test": (2016, 1008, 1008), "paraphrase_dipper_llm_test": (2016, 1008, 1008),
    "paraphrase_polish_llm_test": (2016, 1008, 1008), "paraphrase_back_translation_llm_test": (2016, 1008, 1008),
    "paraphrase_attacks_human_test": (2016, 1008, 1008),
}
# duplicate rows (rows - distinct texts) per file. SOURCE.md states arxiv 1, paraphrase_attacks_llm 3 and
# paraphrase_attacks_human 22 and omits the others, which the files do have (mostly copies of LLM refusals).
DETECTRL_DUPLICATES = {"multi_domains_arxiv_test": 1, "paraphrase_attacks_llm_test": 3, "paraphrase_attacks_human_test": 22,
                       "multi_domains_xsum_test": 27, "multi_domains_writing_prompt_test": 19, "multi_domains_yelp_review_test": 4,
                       "paraphrase_dipper_llm_test": 10, "paraphrase_back_translation_llm_test": 8, "paraphrase_polish_llm_test": 2}


@pytest.fixture(scope="module")
def detectrl_raw():
    return {k: json.loads((folder("detectrl") / rel).read_text()) for k, rel in DETECTRL_FILES.items()}


@pytest.fixture(scope="module")
def detectrl():
    return load_detectrl(folder("detectrl"), files=list(DETECTRL_FILES))


def test_detectrl_raw_files_match_source(detectrl_raw):
    for k, rows in detectrl_raw.items():
        lab = Counter(r["label"] for r in rows)
        assert (len(rows), lab["human"], lab["llm"]) == DETECTRL_COUNTS[k], k
        assert set(lab) == {"human", "llm"}                             # string labels
        assert len(rows) - len({r["text"] for r in rows}) == DETECTRL_DUPLICATES[k], k
        assert all(r["text"].strip() for r in rows)
    for k in DETECTRL_COUNTS:
        if k.startswith("multi_domains"):                               # llm: 9 settings x 112
            c = Counter(r["data_type"] for r in detectrl_raw[k] if r["label"] == "llm")
            assert len(c) == 9 and set(c.values()) == {112}
    c = Counter(r["data_type"] for r in detectrl_raw["paraphrase_attacks_llm_test"] if r["label"] == "llm")
    assert c == {"paraphrase_dipper_llm": 336, "paraphrase_polish_llm": 336, "paraphrase_back_translation_llm": 336}
    c = Counter(r["data_type"] for r in detectrl_raw["paraphrase_attacks_human_test"] if r["label"] == "human")
    assert c == {"paraphrase_back_translation_human": 336, "paraphrase_polish_human": 336, "paraphrase_dipper_llm": 336}


def test_detectrl_loader(detectrl, detectrl_raw):
    recs, drops = detectrl
    assert len({r["id"] for r in recs}) == len(recs)
    assert set(by(recs, "label")) == {"human", "ai"}
    got, dropped = by(recs, "file"), Counter(d["id"].rsplit("-", 1)[0].removeprefix("detectrl-") for d in drops)
    for k, rel in DETECTRL_FILES.items():
        assert got[rel] + dropped[k] == DETECTRL_COUNTS[k][0], k         # every upstream row returned or dropped
    assert {k: n for k, n in dropped.items() if k != "paraphrase_attacks_human_test"} == \
        {k: n for k, n in DETECTRL_DUPLICATES.items() if k != "paraphrase_attacks_human_test"}
    # paraphrase_attacks_human: a refusal is 8 times 'human' and 7 times 'llm' (all 15 dropped), plus 8 plain copies
    assert Counter(d["filter"] for d in drops if "attacks_human" in d["id"]) == {"label_conflict": 15, "dedup": 8}
    # labels: 'llm' -> ai, per file (for files without duplicates across labels the counts are exact minus drops)
    for k, rows in detectrl_raw.items():
        lab = {"human": "human", "llm": "ai"}
        kept = {r["id"]: r for r in recs if r["file"] == DETECTRL_FILES[k]}
        for i, row in enumerate(rows):
            r = kept.get(f"detectrl-{k}-{i}")
            if r: assert (r["label"], r["text"], r["generator"]) == (lab[row["label"]], row["text"],
                                                                    "human" if row["label"] == "human" else row["llm_type"])
        llm = Counter(r["llm_type"] for r in rows if r["label"] == "llm")   # four generators, 252 rows each
        assert llm == {"ChatGPT": 252, "Claude-instant": 252, "Google-PaLM": 252, "Llama-2-70b": 252}, k
    validate_records(pd.DataFrame(recs), "detectrl")


def test_detectrl_domains_edits_and_shared_texts(detectrl):
    recs, _ = detectrl
    para = [r for r in recs if "/Paraphrase_Attacks/" in r["file"]]
    assert all(r["edit"] == "" for r in recs if r["label"] == "human" and "Human" not in r["file"])
    for rel in {r["file"] for r in para}:
        hum = by([r for r in para if r["file"] == rel and r["label"] == "human"], "domain")
        assert hum == {"arxiv": 252, "xsum": 252, "writing_prompt": 252, "yelp_review": 252}
        ai = [r for r in para if r["file"] == rel and r["label"] == "ai"]
        assert all(r["domain_from"] == "block position" and r["edit"].startswith("paraphrase:") for r in ai)
        assert all(n <= 252 for n in by(ai, "domain").values())
    kinds = {"dipper", "polish", "back_translation"}
    for k in kinds:
        ai = [r for r in para if r["file"].endswith(f"paraphrase_{k}_llm_test.json") and r["label"] == "ai"]
        assert {r["edit"] for r in ai} == {f"paraphrase:{k}"}
    # the four Paraphrase_Attacks files share the same 1,008 human texts; 500 of them are in Multi_Domain (3,999 texts)
    hum = {rel: {r["text"] for r in para if r["file"] == rel and r["label"] == "human"} for rel in {r["file"] for r in para}}
    first = next(iter(hum.values()))
    assert len(first) == 1_008 and all(h == first for h in hum.values())
    md = {r["text"] for r in recs if "Multi_Domain" in r["file"] and r["label"] == "human"}
    assert len(md) == 3_999 and len(first & md) == 500
    assert all(r["source_id"] != r["id"] for r in para if r["label"] == "human" and r["text"] in md)
    # the human-paraphrase file: labels trusted over the data_type suffix (336 rows, a few dropped as duplicates)
    hp = [r for r in recs if "Paraphrase_Attacks_Human" in r["file"] and r["data_type"] == "paraphrase_dipper_llm"]
    assert by(hp, "label", "edit").keys() == {("human", "paraphrase:dipper")} and 330 <= len(hp) <= 336


# ---------------------------------------------------------------- MGTBench
@pytest.fixture(scope="module")
def mgtbench():
    return load_mgtbench(folder("mgtbench"))


def test_mgtbench_counts_and_labels(mgtbench):
    recs, drops = mgtbench
    d = folder("mgtbench") / "datasets"
    assert len(pd.read_csv(d / "SQuAD1_chatgpt.csv")) == 1_000 and len(pd.read_csv(d / "TruthfulQA_chatgpt.csv")) == 817
    for f in ("TruthfulQA_chatgpt_prompt1.csv", "TruthfulQA_chatgpt_prompt2.csv"):
        cols = pd.read_csv(d / f, nrows=1).columns
        assert "complete_question" in cols and "Question" not in cols
    assert by(recs, "subset", "label") == {("SQuAD1", "human"): 694, ("SQuAD1", "ai"): 694,
                                           ("TruthfulQA", "human"): 785, ("TruthfulQA", "ai"): 785}
    assert Counter(x["id"].split("-")[1] for x in drops) == {"squad1": 2 * 306, "truthfulqa": 2 * 32}
    assert {x["filter"] for x in drops} == {"upstream_filter"}
    assert len({r["id"] for r in recs}) == len(recs)
    pairs = Counter(r["source_id"] for r in recs)
    assert set(pairs.values()) == {2}
    assert all({x["label"] for x in recs if x["source_id"] == s} == {"human", "ai"} for s in list(pairs)[:50])
    assert all(len(r["text"].split()) > 1 for r in recs)
    assert by(recs, "subset", "split") == {("SQuAD1", "train"): 2 * 556, ("SQuAD1", "test"): 2 * 138,
                                           ("TruthfulQA", "train"): 2 * 628, ("TruthfulQA", "test"): 2 * 157}
    assert all(r["generator"] == "ChatGPT" for r in recs if r["label"] == "ai")
    assert len({r["domain"] for r in recs if r["subset"] == "TruthfulQA"}) == 38         # Category as domain
    # human = the first answer span (SQuAD1) / Best Answer (TruthfulQA): short against ChatGPT's sentences
    sq = pd.read_csv(d / "SQuAD1_chatgpt.csv")
    import ast
    spans = [ast.literal_eval(a)["text"][0] for a in sq["answers"]]
    assert statistics.median(len(s.split()) for s in spans) == 2
    assert statistics.median(len(s.split()) for s in sq["chatgpt_answer"]) == 16
    first = next(r for r in recs if r["id"] == "mgtbench-squad1-0-human")
    assert first["text"] == spans[0]
    validate_records(pd.DataFrame(recs), "mgtbench")
