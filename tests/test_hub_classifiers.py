"""Hub classifiers as configurations of the classifier detector (#27 item 4), the detector table of `--list`, and M4's
held-out vs in-reward row (#27 item 5).

The classifiers run on tiny random RoBERTa classifiers built here with different label layouts (offline: the hub
models are never downloaded); each score is checked against the softmax of the model's logits computed by hand.
"""
import json
import math

import numpy as np
import pandas as pd
import pytest
import torch

from stealth_eval import acceptance as A
from stealth_eval.components import DETECTORS
from stealth_eval.core import Cache, StealthEvalError, sha256_text
from stealth_eval.schema import Settings
from stealth_eval.supervised import (HUB_CLASSIFIERS, ROBERTA_OPENAI, load_sequence_classifier, make_tiny_classifier,
                                     resolve_ai_label)

LAYOUTS = {"plain": {0: "LABEL_0", 1: "LABEL_1"},          # RADAR's config names no labels
           "human_ai": {0: "Human", 1: "AI"},              # fakespot-ai/roberta-base-ai-text-detection-v1
           "fake_real": {0: "Fake", 1: "Real"},            # openai-community/roberta-*-openai-detector
           "three": {0: "human", 1: "machine", 2: "mixed"}}


@pytest.fixture(scope="module")
def clfs(tmp_path_factory):
    root = tmp_path_factory.mktemp("hub_clf")
    # 600 positions: a window of 598 tokens, wider than RADAR's 512-token cut
    return {k: str(make_tiny_classifier(root / k, lab, max_positions=600, seed=i)) for i, (k, lab) in enumerate(LAYOUTS.items())}


def cfg_with(**classifiers):
    return {"device": "cpu", "trust_remote_code": False, "classifiers": classifiers}


def by_hand(folder, text, max_length):
    "softmax(logits) of one text alone, no padding, cut at `max_length` tokens, in float64."
    model, tok, _ = load_sequence_classifier(folder, "cpu")
    with torch.no_grad():
        logits = model(**tok(text, truncation=True, max_length=max_length, return_tensors="pt")).logits.double()[0]
    z = logits.numpy()
    return np.exp(z - z.max()) / np.exp(z - z.max()).sum()


def test_registered_as_classifiers_with_their_reference_and_settings():
    for name in ("radar", "roberta_base_openai", "fakespot_roberta"):
        d = DETECTORS.get(name)
        assert d is HUB_CLASSIFIERS[name] and (d.family, d.direction, d.stat, d.supervised) == ("classifier", 1, "p_ai", True)
        assert d.reference and d.label
        assert Settings().classifiers[name]                          # each one's model is a setting
    assert Settings().classifiers["radar"] == "TrustSafeAI/RADAR-Vicuna-7B"
    r = HUB_CLASSIFIERS["radar"]
    assert (r.ai_label, r.max_tokens, r.safetensors_only) == (0, 512, False)   # IBM/RADAR: logits[:, 0], max_length=512
    assert (HUB_CLASSIFIERS["fakespot_roberta"].ai_label, HUB_CLASSIFIERS["roberta_base_openai"].ai_label) == ("AI", "Fake")
    assert ROBERTA_OPENAI.name == "roberta_openai" and ROBERTA_OPENAI.model_key() == "classifier_model"
    from stealth_eval.config import PROFILES
    assert "radar" in PROFILES["paper"].detectors


def test_ai_label_resolution_across_label_layouts(clfs):
    cfg = cfg_with(radar=clfs["plain"], fakespot_roberta=clfs["human_ai"], roberta_base_openai=clfs["fake_real"])
    assert {n: d.ai_index(cfg) for n, d in HUB_CLASSIFIERS.items()} == {"radar": 0, "fakespot_roberta": 1, "roberta_base_openai": 0}
    assert all(d.unavailable(cfg) == "" for d in HUB_CLASSIFIERS.values())
    radar, fake = HUB_CLASSIFIERS["radar"], HUB_CLASSIFIERS["fakespot_roberta"]
    # RADAR's index 0 on a model whose label 0 is human: refused by name, never read as AI
    why = radar.unavailable(cfg_with(radar=clfs["human_ai"]))
    assert why.startswith("classifier_ai_labels.radar 0 is the label 'Human', a human label")
    # a setting names another label: by name (any case) or index
    assert radar.ai_index({**cfg_with(radar=clfs["human_ai"]), "classifier_ai_labels": {"radar": "ai"}}) == 1
    assert fake.ai_index({**cfg_with(fakespot_roberta=clfs["three"]), "classifier_ai_labels": {"fakespot_roberta": "Machine"}}) == 1
    assert fake.ai_index({**cfg_with(fakespot_roberta=clfs["three"]), "classifier_ai_labels": {"fakespot_roberta": 2}}) == 2
    # the reference's label name is not a label of this model: skipped with the reason
    assert "classifier_ai_labels.fakespot_roberta 'AI' is not a label of this model" in fake.unavailable(cfg_with(fakespot_roberta=clfs["fake_real"]))
    assert "out of range" in fake.unavailable({**cfg_with(fakespot_roberta=clfs["human_ai"]), "classifier_ai_labels": {"fakespot_roberta": 5}})
    assert fake.unavailable({"device": "cpu", "trust_remote_code": False}) == "no classifiers.fakespot_roberta is configured"
    with pytest.raises(StealthEvalError, match="a human label"):
        resolve_ai_label(LAYOUTS["three"], "human", key="classifier_ai_labels.x")


@pytest.mark.parametrize("name,layout,ai", [("radar", "plain", 0), ("fakespot_roberta", "human_ai", 1),
                                            ("roberta_base_openai", "fake_real", 0), ("fakespot_roberta", "three", 1)])
def test_score_is_the_softmax_probability_of_the_ai_label_by_hand(clfs, name, layout, ai):
    det = HUB_CLASSIFIERS[name]
    cfg = cfg_with(**{name: clfs[layout]})
    if layout == "three": cfg["classifier_ai_labels"] = {name: "machine"}
    long = " ".join(["the police said"] * 180)                          # 540 words + 2 specials: past 512, within 598
    texts = ["the minister said today", "a fire in the news was", long, "  "]
    res = det.compute(texts, cfg, Cache(enabled=False))
    cut = det.max_tokens or 598                                         # RADAR: 512; the others: the model's window
    for t in texts[:3]:
        p = by_hand(clfs[layout], t, cut)
        assert res[sha256_text(t)]["p_ai"] == pytest.approx(p[ai], abs=1e-6)
        assert res[sha256_text(t)]["probs"] == pytest.approx(p.tolist(), abs=1e-6)
    assert res[sha256_text(long)]["n_tokens_input"] == 542
    assert res[sha256_text(long)]["truncated"] == (name == "radar")     # only RADAR's reference cuts below the window
    assert res[sha256_text("  ")] is None
    assert det.model(cfg).startswith(f"{layout}@local:")


def test_two_classifiers_on_one_model_do_not_share_their_ai_probability(clfs, tmp_path):
    "The detectors stage computes once per `source`: with one model and two AI labels, the sources differ."
    cfg = {**cfg_with(radar=clfs["human_ai"], fakespot_roberta=clfs["human_ai"]), "classifier_ai_labels": {"radar": 1}}
    radar, fake = HUB_CLASSIFIERS["radar"], HUB_CLASSIFIERS["fakespot_roberta"]
    assert radar.source(cfg) != fake.source(cfg)                        # RADAR cuts at 512 and reads label 1 by index
    same = {**cfg, "classifier_model": clfs["human_ai"], "classifier_ai_label": 0}
    assert ROBERTA_OPENAI.source(same) != fake.source(same)            # label 0 ('Human': refused) vs 'AI'
    t = "the minister said today"
    a = fake.compute([t], cfg, Cache(tmp_path / "c"))[sha256_text(t)]["p_ai"]
    b = ROBERTA_OPENAI.compute([t], {**cfg, "classifier_model": clfs["human_ai"], "classifier_ai_label": 1}, Cache(tmp_path / "c"))
    assert b[sha256_text(t)]["p_ai"] == pytest.approx(a, abs=1e-12)   # same model, same label: the same probability


def test_set_from_the_command_line_and_refused_for_other_detectors(clfs):
    from stealth_eval.config import parse_set, resolve_config
    from stealth_eval.schema import SettingsError
    cfg = resolve_config("tiny", detectors=["radar"], overrides=parse_set([f"classifiers.radar={clfs['plain']}",
                                                                            "classifier_ai_labels.radar=0"])).to_dict()
    assert cfg["classifiers"]["radar"] == clfs["plain"] and cfg["classifiers"]["fakespot_roberta"].startswith("fakespot-ai/")
    assert HUB_CLASSIFIERS["radar"].unavailable(cfg) == ""
    with pytest.raises(SettingsError, match="classifiers.log_rank: detector log_rank is not a hub classifier"):
        resolve_config("tiny", overrides={"classifiers": {"log_rank": clfs["plain"]}})
    with pytest.raises(SettingsError, match="classifier_ai_labels.roberta_openai: detector roberta_openai is not a hub classifier"):
        resolve_config("tiny", overrides={"classifier_ai_labels": {"roberta_openai": 1}})


def test_offline_and_absent_is_skipped_with_the_reason(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))           # an empty hub cache
    for name, det in HUB_CLASSIFIERS.items():
        why = det.unavailable({**cfg_with(**Settings().classifiers)})
        assert why == f"offline, and the classifier {Settings().classifiers[name]!r} is neither a local folder nor in the hub cache"


# ---------------------------------------------------------------- `stealth-eval --list`: the detector table

def test_list_prints_a_detector_table(capsys):
    from stealth_eval.run import main
    assert main(["--list"]) == 0
    out = capsys.readouterr().out
    assert any(l.startswith("detectors: ") for l in out.splitlines())       # the one-line list stays
    table = out.split("detector table", 1)[1].splitlines()[1:]
    head = table[0].split()
    assert head == ["name", "family", "direction", "supervised", "reference"]
    rows = {}
    for l in table[1:]:
        if not l.startswith("  "): break
        name = l.split()[0]
        rows[name] = l
    assert set(DETECTORS.names()) == set(rows)                               # every registered detector, one row each
    cells = lambda n: [c.strip() for c in rows[n].strip().split("  ") if c.strip()]
    assert cells("fast_detectgpt")[:4] == ["fast_detectgpt", "curvature", "higher = AI", "no"]
    assert cells("log_rank")[:4] == ["log_rank", "likelihood", "lower = AI", "no"]
    assert cells("radar")[:4] == ["radar", "classifier", "higher = AI", "yes"] and "RADAR" in cells("radar")[4]
    for n in ("gptzero", "originality_ai", "sapling", "pangram", "winston_ai"):
        assert cells(n)[1] == "commercial" and cells(n)[4] == DETECTORS.get(n).reference
    assert cells("winston_ai")[2] == "lower = AI"                            # its score is the human score
    assert cells("binoculars_single")[0] == "binoculars_single *" and cells("binoculars")[0] == "binoculars"
    assert cells("detectgpt_lminfill")[0].endswith(" *") and cells("detectgpt_lminfill")[4].endswith("[stands in for: detectgpt]")
    # the marker is the detector's own field, not its name: every stand-in and nothing else is marked
    assert {n for n in rows if cells(n)[0].endswith(" *")} == {n for n, d in DETECTORS.all().items() if d.stands_in_for}
    assert cells("classifier_offline")[0] == "classifier_offline" and cells("lastde")[0] == "lastde"


# ---------------------------------------------------------------- #27 item 5: M4's held-out vs in-reward row

def m4_scores(n_h=60, n_a=30, seed=0):
    "scores.parquet's columns: M4 lowers the in-reward originality_ai score by 2.5 and the held-out ones by 0.5."
    rng = np.random.default_rng(seed)
    rows = []
    def add(sid, label, cond, det, v):
        m, _, s = cond.partition(":")
        rows.append({"sample_id": sid, "source_id": sid, "dataset": "syn", "label": label, "domain": "news", "generator": "g",
                     "method": m, "setting": s, "defense": "none", "condition": cond, "candidate_rank": 0, "text_out": "t",
                     "detector_name": det, "detector_family": "f", "detector_direction": 1, "detector_score_raw": v,
                     "detector_score_ai": v, "valid": True, "fail_reason": "", "facts": "{}"})
    for det, drop in (("originality_ai", 2.5), ("fast_detectgpt", 0.5), ("log_rank", 0.5)):
        for i in range(n_h): add(f"h{i:03d}", "human", "m0", det, float(rng.normal()))
        a0 = rng.normal(3.0, 1.0, n_a)
        for i in range(n_a):
            add(f"a{i:03d}", "ai", "m0", det, float(a0[i]))
            add(f"a{i:03d}", "ai", "m4:N=1", det, float(a0[i] - drop + rng.normal(0, 0.3)))
    return pd.DataFrame(rows)


def test_m4_held_out_vs_in_reward_row_is_computed_with_originality_ai():
    from test_acceptance import direct_mean_tpr
    cfg = {**Settings().to_dict(), "methods": ["m0", "m4"], "n_bootstrap": 200, "seed": 3}
    assert cfg["reward_detectors"]["m4"] == ["originality_ai"] and "originality_ai" in DETECTORS   # a real detector now
    sc = m4_scores()
    rows = [r for r in A.transfer_rows(sc, cfg) if r["method"] == "m4"]
    assert len(rows) == 1
    r = rows[0]
    assert (r["in_reward"], r["held_out"], r["unmeasured"], r["note"]) == (["originality_ai"], ["fast_detectgpt", "log_rank"], [], "")
    ho, ho_d = direct_mean_tpr(sc, "m4:N=1", ["fast_detectgpt", "log_rank"], 0.01, 200, 3)
    ir, ir_d = direct_mean_tpr(sc, "m4:N=1", ["originality_ai"], 0.01, 200, 3)
    assert r["held_out_tpr"]["value"] == pytest.approx(ho, abs=1e-12) and r["in_reward_tpr"]["value"] == pytest.approx(ir, abs=1e-12)
    lo, hi = np.percentile(ho_d - ir_d, [2.5, 97.5])
    assert (r["difference"]["value"], r["difference"]["ci_low"], r["difference"]["ci_high"]) == pytest.approx((ho - ir, lo, hi), abs=1e-12)
    assert r["difference"]["value"] > 0.3                                   # by construction: the in-reward detector drops most
    acc = {"summary": {A.PASS: 0, A.FAIL: 0, A.NA: 0}, "criteria": [], "transfer": rows, "artifacts": [],
           "settings": {"acceptance": cfg["acceptance"], "reward_detectors": cfg["reward_detectors"], "n_bootstrap": 200,
                        "ci_level": 0.95, "seed": 3}}
    md = A.acceptance_markdown(acc)
    line = next(l for l in md.splitlines() if l.startswith("| syn | `m4:N=1` |"))
    assert "| originality_ai | fast_detectgpt, log_rank |" in line and "not run" not in line
    # without originality_ai in the panel the row says so (as before this detector existed)
    r0 = next(r for r in A.transfer_rows(sc[sc["detector_name"] != "originality_ai"], cfg) if r["method"] == "m4")
    assert r0["unmeasured"] == ["originality_ai"] and r0["difference"] is None and "originality_ai not run" in r0["note"]


def test_radar_reads_a_repository_with_pytorch_weights_only_and_the_others_refuse_it(clfs, tmp_path):
    "RADAR's hub repository lists PyTorch weights only: it alone may read them (torch.load(weights_only=True))."
    import shutil
    from transformers import AutoModelForSequenceClassification
    pt = tmp_path / "pt_only"
    shutil.copytree(clfs["plain"], pt)
    for f in pt.glob("*.safetensors"): f.unlink()
    torch.save(AutoModelForSequenceClassification.from_pretrained(clfs["plain"]).state_dict(), pt / "pytorch_model.bin")
    t = "the minister said today"
    got = HUB_CLASSIFIERS["radar"].compute([t], cfg_with(radar=str(pt)), Cache(enabled=False))[sha256_text(t)]["p_ai"]
    assert got == pytest.approx(by_hand(clfs["plain"], t, 512)[0], abs=1e-6)
    with pytest.raises(StealthEvalError, match="could not load classifier"):
        HUB_CLASSIFIERS["fakespot_roberta"].compute([t], {**cfg_with(fakespot_roberta=str(pt)), "classifier_ai_labels": {"fakespot_roberta": 1}},
                                                    Cache(enabled=False))
