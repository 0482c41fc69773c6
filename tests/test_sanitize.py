"""The sanitize defense against both homoglyph attacks (#50, item 3) and its full-width rule (#50, item 6).

`sanitize(attacked) == sanitize(original)` for ASCII originals: every substitute of RAID's table and of M5's, in every
position a letter takes in a word (start, inside, a capitalised, an all-caps and a digit-holding word, a one-letter
word), and real texts attacked by both at several seeds; RAID's `raid:homoglyph+sanitize` condition scores the restored
text. Before: RAID's capital `I` look-alikes (Greek `Ι`, Cyrillic `І`) became a lower-case `l`, and a short text with no
anchor letter was read as Cyrillic by the majority of its letters (RAID swaps ~40% of English letters for Cyrillic
ones), so its Cyrillic `е` stayed and its Latin `r` became `г`. Genuine Greek, Cyrillic and CJK text stays as written.
"""
import json
import random

import pandas as pd
import pytest

from stealth_eval.methods import homoglyph_attack, homoglyph_table, sanitize
from stealth_eval.raid import RAID_HOMOGLYPHS, raid_homoglyph

from conftest import SHARED
from test_hostile_scripts import EL, JA, KO, RU, ZH

CARRIERS = ("The market took {} to the team at midnight.",       # Latin anchors (t, k, m) around the word
            "Yes, {} is so, or so we hope.")                        # none: its letters RAID swaps too (below)


def contexts(c: str) -> dict:
    "Words holding the ASCII letter or digit `c` in each position a letter takes."
    low, up = c.lower() == c, c.upper() == c
    return {"start": c + "rbit", "inside": ("st" if low else "ST") + c + ("ng" if low else "NG"),
            "capitalised": (c + "rbit") if up and c.isalpha() else "W" + c + "nd", "all_caps": "NA" + c + "O",
            "digits": "1" + c + "9", "digits_end": "20" + c, "digits_start": c + "42", "alone": c}


def pairs(table: dict):
    return [(c, h) for c, subs in table.items() if c.isascii() for h in subs]


@pytest.mark.parametrize("table", ["raid", "m5"])
def test_every_substitute_is_undone_in_every_position(table):
    got = pairs(RAID_HOMOGLYPHS if table == "raid" else homoglyph_table())
    assert len(got) == 33 if table == "raid" else len(got) > 100 and homoglyph_table()["I"] == ["Ι", "І", "Ӏ"]
    bad = []
    for c, h in got:
        for where, word in contexts(c).items():
            for carrier in CARRIERS:
                text = carrier.format(word)
                # the word alone swapped, then with every other letter of RAID's table around it swapped too
                for around in (carrier, raid_homoglyph(carrier, random.Random(len(bad)))["generation"]):
                    got_ = sanitize(around.format(word.replace(c, h)))
                    if got_ != sanitize(text): bad.append((c, h, where, got_))
    # before: RAID's I -> Ι, І became l in every position; in the carrier without anchors, RAID's attack made a text
    # that the majority of its letters read as Cyrillic, and Latin letters became Cyrillic (Уеѕ, 1а9 іѕ ѕо, ог ѕо ѡе һоре.)
    assert bad == []


def test_raids_examples_from_the_issue():
    assert sanitize("Ιn соnсlusіоn, thе rеsult wаs 1е9.") == "In conclusion, the result was 1e9."   # before: ln conclusion
    assert sanitize("ΙΒМ аnd ΝΙΚΕ") == "IBM and NIKE"           # before: ΙΒΜ and ΝΙΚΕ (Cyrillic М made Greek)
    assert sanitize("рrісе 1е9") == "price 1e9"                 # no anchor, scripts mixed; before: ргісе 1е9


def _real_ascii_texts(n_per_file=40):
    texts = []
    for f in sorted((SHARED / "data/detectrl/Benchmark/Benchmark_Data/Multi_Domain").glob("*.json")):
        texts += [r["text"] for r in json.loads(f.read_text())[:n_per_file]]
    f = SHARED / "data/mgtbench/datasets/TruthfulQA_chatgpt.csv"
    if f.exists():
        df = pd.read_csv(f)
        texts += [t for col in df.columns if df[col].dtype == object for t in df[col].dropna().astype(str)[:n_per_file]]
    return [t for t in texts if t.isascii() and t.strip()]


def test_real_texts_attacked_by_both_are_restored():
    texts = _real_ascii_texts()
    if not texts: pytest.skip(f"no real texts under {SHARED / 'data'} (absent on a fresh clone)")
    assert len(texts) >= 140
    bad = {"raid": 0, "m5": 0}
    for t in texts:
        clean = sanitize(t)
        assert clean == t                                        # an ASCII text is left as it is
        for seed in (0, 1, 2):
            out = raid_homoglyph(t, random.Random(seed))["generation"]
            assert out != t or not any(ch in RAID_HOMOGLYPHS for ch in t)
            bad["raid"] += sanitize(out) != clean
        for rate, seed in ((0.01, 0), (0.2, 1), (1.0, 2)):
            bad["m5"] += sanitize(homoglyph_attack(t, rate, seed)[0]) != clean
    assert bad == {"raid": 0, "m5": 0}   # before: 375 of RAID's 438 outputs (a capital I in each), none of M5's


def test_real_texts_with_non_ascii_letters_too():
    "RAID's attack on real texts holding a non-ASCII letter (441, 50 a DetectRL file: Greek symbols in arXiv abstracts, accents)."
    texts = []
    for f in sorted((SHARED / "data/detectrl/Benchmark/Benchmark_Data").glob("*/*.json")):
        texts += [r["text"] for r in json.loads(f.read_text()) if any(not c.isascii() and c.isalpha() for c in r["text"])][:50]
    if not texts: pytest.skip(f"no real texts under {SHARED / 'data'} (absent on a fresh clone)")
    bad = [i for i, t in enumerate(texts) if sanitize(raid_homoglyph(t, random.Random(i))["generation"]) != sanitize(t)]
    assert len(texts) > 400 and bad == []    # before: 375 of them


def test_words_among_other_scripts():
    # English among Chinese: an anchorless word is Latin when the text has Latin anchors or the word mixes scripts
    # (before: a word's majority, so І stayed and саn, sее stayed or became Cyrillic: ѕее)
    text = "他跪下，告诉我继续跑步。I can see his shirt. I may not fight, but I am the king of this ship."
    for seed in range(4):
        assert sanitize(raid_homoglyph(text, random.Random(seed))["generation"]) == text
    # a foreign letter in a word of another script with no look-alike there: its ASCII letter (before: kept)
    assert sanitize("consistent with ΛСDΜ simulations") == sanitize("consistent with ΛCDΜ simulations") == "consistent with ΛCDΜ simulations"


def test_the_methods_stage_scores_the_restored_text(tmp_path):
    "raid:homoglyph+sanitize is RAID's output after the defense: the original text (before: `ln conclusion`)."
    from stealth_eval.core import Cache, read_jsonl
    from stealth_eval.data import dataset_path
    from stealth_eval.methods import run_methods_stage
    texts = {"a0": "In conclusion, the experiment confirmed the expected effect at 1e9 particles per second in every run.",
             "a1": "It is OK: IBM, NIKE and the EXPO committee agreed on a price of 300 euros for each pass in Paris."}
    recs = [{"id": "h0", "label": "human", "text": texts["a0"], "domain": "news", "generator": "human"}]
    recs += [{"id": k, "label": "ai", "text": t, "domain": "news", "generator": "toy"} for k, t in texts.items()]
    p = dataset_path(tmp_path, "toy"); p.parent.mkdir(parents=True)
    pd.DataFrame(recs).to_json(p, orient="records", lines=True, force_ascii=False)
    cfg = {"out_dir": str(tmp_path), "datasets": [{"name": "toy", "path": None}], "methods": ["m0", "raid"],
           "sanitize": ["raid"], "validity": {"min_words": 10, "max_len_ratio": 3.0}, "seed": 0,
           "raid": {"attacks": ["homoglyph"]}}
    run_methods_stage(cfg, Cache(enabled=False))
    rows = {(r["sample_id"], r["condition"]): r for r in read_jsonl(tmp_path / "raw_outputs.jsonl") if r["method"] == "raid"}
    assert sorted(rows) == [(k, c) for k in texts for c in ("raid:homoglyph", "raid:homoglyph+sanitize")]
    for k, t in texts.items():
        assert rows[(k, "raid:homoglyph")]["text_out"] != t and rows[(k, "raid:homoglyph")]["valid"]
        assert rows[(k, "raid:homoglyph+sanitize")]["text_out"] == t and rows[(k, "raid:homoglyph+sanitize")]["valid"]


GENUINE = [RU, EL, ZH, JA, KO,
           "Київ — столиця України.", "София е столицата на България.", "Београд је главни град Србије.",
           "Όχι, ευχαριστώ.", "Купил iPhone в Москве", "В 2023 году", "10 кг", "1е9 рублей", "Ελλάδα 2024", "ΙΧΘΥΣ",
           # no anchor letter, one script: nothing shows a swap (before as now)
           "Ура!", "ОК", "СССР", "5г сахара", "ΟΧΙ", "Ναι", "а"]


@pytest.mark.parametrize("text", GENUINE)
def test_genuine_non_latin_text_is_left_alone(text):
    assert sanitize(text) == text


def test_the_limit_a_text_of_one_scripts_look_alikes_stays():
    "RAID's attack on `ace` is `асе`, a valid Cyrillic string: nothing in it shows a swap (the notebook's stated limit)."
    assert raid_homoglyph("ace", random.Random(0))["generation"] == "асе" and sanitize("асе") == "асе"


def test_full_width_forms_fold_by_run():
    assert sanitize("ＡＢＣ１２３") == "ABC123"                         # outside CJK text NFKC folds everything
    assert sanitize("ＩＢＭ") == "IBM"                                   # before: lBM (Ｉ read as the l it resembles)
    # in CJK text full-width numbers and punctuation are native; a word of another script folds whole
    assert sanitize("北京２０２３年ＡＢＣ１２３") == "北京２０２３年ABC123"   # before: ABC１23
    assert sanitize("東京は１４００万人、ＩＢＭ３６０、ｉＰｈｏｎｅ１５。") == "東京は１４００万人、IBM360、iPhone15。"
