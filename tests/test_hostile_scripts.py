"""Homoglyphs and sanitize on non-Latin text (#25, item 7): `sanitize()` leaves Russian, Greek and CJK text as written
and restores look-alikes only inside words of another script; the homoglyph attack substitutes in Cyrillic and Greek
text, marks a text with nothing to substitute (CJK) instead of counting it as attacked, and the acceptance criterion on
the homoglyph sweep (4c) reads the rates the attack achieved.
"""
import json

import pandas as pd
import pytest

from stealth_eval import acceptance as A
from stealth_eval.core import Cache, read_jsonl
from stealth_eval.data import dataset_path
from stealth_eval.methods import homoglyph_attack, run_methods_stage, sanitize

from test_acceptance import make_run, synthetic_scores, verdicts

RU = "Москва — столица России, крупнейший по численности населения город страны. Сорок пять лет назад он жил у реки."
EL = "Η Αθήνα είναι η πρωτεύουσα της Ελλάδας και μία από τις αρχαιότερες πόλεις του κόσμου, με ιστορία τριών χιλιάδων ετών."
ZH = "北京是中华人民共和国的首都，也是全国的政治、文化和国际交往中心。二〇二三年，常住人口约２１８６万人。"
JA = "東京は日本の首都であり、ｶﾀｶﾅも使われる。人口は約１４００万人です。"
KO = "서울은 대한민국의 수도이며 인구는 약 천만 명이다 ㅋㅋ."


@pytest.mark.parametrize("text", [RU, EL, ZH, JA, KO], ids=["russian", "greek", "chinese", "japanese", "korean"])
def test_sanitize_leaves_text_in_its_own_script_untouched(text):
    # before: 45 of the Russian text's characters became Latin (с -> c, о -> o, г -> r, у -> y, ...), Greek ο, ν, ι, α
    # became o, v, i, a, and the CJK full-width comma and 〇 became ',' and 'O'
    assert sanitize(text) == text


def test_sanitize_restores_the_minority_script_inside_a_word():
    assert sanitize("The pаper sаid the Prіme Mіnister") == "The paper said the Prime Minister"   # Cyrillic а, і in Latin words
    assert sanitize("Сорoк пять лeт назад") == "Сорок пять лет назад"           # Latin o, e in Russian words -> Cyrillic
    assert sanitize("Η Αθήvα είvαι") == "Η Αθήνα είναι"                          # Latin v in Greek words -> Greek ν
    assert sanitize("北京是中国的首都，Pythоn很好。") == "北京是中国的首都，Python很好。"   # Cyrillic о in a Latin word among CJK
    assert sanitize("Купил iPhone в Москве") == "Купил iPhone в Москве"          # a Latin word in Russian text stays Latin
    assert sanitize("the plaϲe") == "the place"          # Greek lunate sigma, which NFKC turns into final sigma ς


@pytest.mark.parametrize("text", [RU, EL], ids=["russian", "greek"])
def test_the_attack_substitutes_in_cyrillic_and_greek_text_and_sanitize_undoes_it(text):
    out, f = homoglyph_attack(text, 0.05, seed=3)     # before: rate_actual 0.0, the text unchanged
    assert f["n_substituted"] == round(0.05 * len(text)) > 0 and f["rate_actual"] == f["n_substituted"] / len(text)
    assert sum(a != b for a, b in zip(out, text)) == f["n_substituted"] and "invalid_reason" not in f
    assert sanitize(out) == text


def test_a_text_with_nothing_to_substitute_is_marked_invalid_by_the_methods_stage(tmp_path):
    _, f = homoglyph_attack(ZH, 0.02, seed=0)
    assert (f["n_substituted"], f["n_substitutable"], f["rate_actual"]) == (0, 0, 0.0) and f["invalid_reason"]
    words = " ".join(["word"] * 12)
    recs = [{"id": "h0", "label": "human", "text": "A human text " + words, "domain": "news", "generator": "human"},
            {"id": "en", "label": "ai", "text": "An English text " + words, "domain": "news", "generator": "toy"},
            {"id": "zh", "label": "ai", "text": " ".join([ZH] * 12), "domain": "news", "generator": "toy"}]
    p = dataset_path(tmp_path, "toy"); p.parent.mkdir(parents=True)
    pd.DataFrame(recs).to_json(p, orient="records", lines=True, force_ascii=False)
    cfg = {"out_dir": str(tmp_path), "datasets": [{"name": "toy", "path": None}], "methods": ["m0", "m5"], "sanitize": [],
           "validity": {"min_words": 10, "max_len_ratio": 3.0}, "seed": 0, "homoglyph_rates": [0.02]}
    run_methods_stage(cfg, Cache(enabled=False))
    rows = {(r["sample_id"], r["method"]): r for r in read_jsonl(tmp_path / "raw_outputs.jsonl")}
    zh, en = rows[("zh", "m5")], rows[("en", "m5")]
    assert zh["valid"] is False and zh["fail_reason"] == f["invalid_reason"] and zh["facts"]["rate_actual"] == 0.0
    assert en["valid"] is True and en["facts"]["rate_actual"] > 0
    assert rows[("zh", "m0")]["valid"] is True                    # the text itself stays in the run (as M0)


def _with_facts(scores, rate_of):
    "The M5 rows' facts as the attack records them: the achieved rate `rate_of(nominal p)` on 400-character texts."
    def facts(m, s, f):
        if m != "m5": return f
        p = float(s.partition("=")[2]); r = rate_of(p)
        return json.dumps({"n_substituted": round(r * 400), "n_substitutable": 0 if r == 0 else 60, "n_chars": 400,
                           "rate_actual": r, "rate_target": p})
    return scores.assign(facts=[facts(*x) for x in zip(scores["method"], scores["setting"], scores["facts"])])


def test_the_homoglyph_criterion_reads_achieved_rates(tmp_path):
    sc = synthetic_scores()                                        # p = 0.5% and 1%
    got = verdicts(make_run(tmp_path / "none", scores=_with_facts(sc, lambda p: 0.0)))[("4c", None)]
    assert got["verdict"] == "fail"                                # before: pass, on the settings' nominal rates
    assert got["evidence"] == "syn: not applicable (no text has a character with a look-alike in another script)"
    done = verdicts(make_run(tmp_path / "done", scores=_with_facts(sc, lambda p: p)))[("4c", None)]
    assert done["verdict"] == "pass" and done["numbers"]["achieved"] == {"syn": {"0.005": 0.005, "0.01": 0.01}}
    # half the asked rate at p = 1% falls short of it: the sweep never reaches 1%
    half = verdicts(make_run(tmp_path / "half", scores=_with_facts(sc, lambda p: p / 2)))[("4c", None)]
    assert half["verdict"] == "fail"
    # within the rounding of round(p x 400 characters) (0.5 / 400 = 0.125%) it does
    near = verdicts(make_run(tmp_path / "near", scores=_with_facts(sc, lambda p: p - 0.001)))[("4c", None)]
    assert near["verdict"] == "pass"


def test_the_criterion_needs_the_sweep_on_every_dataset_it_applies_to(tmp_path):
    sc = _with_facts(synthetic_scores(), lambda p: p)
    run = A.load_run(make_run(tmp_path / "run", scores=sc))
    zh = _with_facts(synthetic_scores().assign(dataset="zh"), lambda p: 0.0)     # a CJK dataset: nothing substituted
    check = lambda scores: A.check_comparisons(run["table"], run["cfg"], run["skipped"], scores=scores)[2]
    assert check(sc)["verdict"] == "pass"
    got = check(pd.concat([sc, zh[zh["method"] == "m5"]], ignore_index=True))   # zh: not applicable, syn's sweep holds
    assert got["verdict"] == "pass" and got["evidence"] == ("syn: p = 0.5% (achieved 0.5%), 1% (achieved 1%); zh: not "
                                                            "applicable (no text has a character with a look-alike in another script)")
    half = _with_facts(synthetic_scores().assign(dataset="half"), lambda p: p / 2)   # substituted, but short of 1%
    got = check(pd.concat([sc, half[half["method"] == "m5"]], ignore_index=True))
    assert got["verdict"] == "fail" and "half: p = 0.5% (achieved 0.25%), 1% (achieved 0.5%)" in got["evidence"]
