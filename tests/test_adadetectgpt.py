"""AdaDetectGPT (nbs/29_adadetectgpt) against the reference's definitions written out in float64.

The reference (Mamba413/AdaDetectGPT at ff83b52): the basis of scripts/helper.py (get_knots, _torch_splev), the fit of
scripts/nuisance_func.py (BSplineTwoSample.compute_beta_hat, constraint=False) and the criterion of
scripts/detect_gpt_ada.py (get_classification_stat with sampling model = scoring model). Checked here: the basis against
SciPy's own B-splines (what the reference's get_X_spline calls), the witness sums against Python loops over the
log-softmax on the same logits, the fit against the closed form restated with numpy, the training split end to end.
"""
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from stealth_eval.adadetectgpt import (ADADETECTGPT, ada_entries, ada_fit, ada_params, ada_rows, ada_statistic,
                                       adadetectgpt_reference, bspline_basis, bspline_knots, piece_tables)
from stealth_eval.core import Cache, StealthEvalError, read_json, sha256_text, write_jsonl
from stealth_eval.lastde import make_sharp_tiny_lm
from stealth_eval.models import load_causal_lm, pad_batch

WORDS = ("the police said the fire was under control and the minister said two people were at the news today "
         "a year after the government had been new to this").split()
PRM = ada_params({})


def texts_of(seed, n, lo=10, hi=30):
    g = np.random.default_rng(seed)
    return [" ".join(g.choice(WORDS, size=int(g.integers(lo, hi)))) for _ in range(n)]


@pytest.fixture(scope="module")
def sharp(tmp_path_factory):
    d = tmp_path_factory.mktemp("ada")
    path = str(make_sharp_tiny_lm(d / "lm"))
    return {"path": path, "lm": load_causal_lm(path, device="cpu")}


def own_rows(lm, texts):
    "Each text's sums from its own unpadded pass: the same logits `adadetectgpt_reference` reads."
    out = []
    for t in texts:
        ids = torch.tensor([lm.tokenizer(t).input_ids])
        with torch.no_grad(): out.append(ada_rows(lm.model(ids).logits, ids, [ids.shape[1]], PRM, block_logits=97)[0])
    return out


def beta_hat_restated(human_lps, ai_lps, start=-32.0):
    "compute_beta_hat (constraint=False), numpy float64: basis with intercept, sums of means, sum of cov/n, Sigma^-1/2 delta."
    knots = bspline_knots(-32, 0, 7, 2)
    F = lambda xs: np.array([[1.0] + bspline_basis(max(x, start), knots, 2) for x in xs])
    delta, Sigma = np.zeros(8), np.zeros((8, 8))
    for sgn, texts in ((-1, human_lps), (1, ai_lps)):
        for xs in texts:
            f = F(xs)
            delta += sgn * f.mean(0)
            Sigma += np.cov(f, rowvar=False, ddof=1) / len(xs)
    lam, Q = np.linalg.eigh(Sigma)
    b = Q @ np.diag(np.maximum(lam, 1e-12) ** -0.5) @ Q.T @ delta
    return b / np.linalg.norm(b)


def test_knots_and_basis_are_the_reference_splines():
    "get_knots' formula (float32 linspace) and the degree-2 basis against SciPy's B-splines on the same knots."
    from scipy.interpolate import BSpline
    knots = bspline_knots(-32, 0, 7, 2)
    r = 32 * 0.001; h = (32 + 2 * r) / 5
    assert knots == torch.linspace(-32 - r - 2 * h, r + 2 * h, 10).float().double().tolist()
    xs = np.concatenate([np.linspace(-32, 0, 257), [-32.0, -25.0, -1e-7, 0.0]])
    scipy_basis = BSpline.design_matrix(xs, np.array(knots), 2).toarray()
    ours = np.array([bspline_basis(float(x), knots, 2) for x in xs])
    assert ours.shape == (len(xs), 7) and np.abs(ours - scipy_basis).max() < 1e-12
    P = piece_tables(knots, 2)
    for x, row in zip(xs, ours):
        i = int(np.searchsorted(knots, x, side="right")) - 1
        assert np.abs(P[i] @ [(x - knots[i]) ** k for k in range(3)] - row).max() < 1e-12


def test_statistic_equals_float64_loops_on_the_same_logits(sharp):
    texts = texts_of(0, 4)
    beta = torch.randn(8, generator=torch.Generator().manual_seed(1)).tolist()
    for e, t in zip(own_rows(sharp["lm"], texts), texts):
        r = adadetectgpt_reference(sharp["lm"], t, beta, PRM)
        assert e["n_tokens"] == r["n_tokens"]
        assert abs(ada_statistic(e, beta) - r["adadetectgpt"]) <= 1e-6 * abs(r["adadetectgpt"])
    ids = torch.tensor([sharp["lm"].tokenizer(texts[0]).input_ids])
    with torch.no_grad(): lp = torch.log_softmax(sharp["lm"].model(ids).logits.double(), -1)
    assert lp.min() < -32 and lp.max() > -6.38      # the vocabulary spans the clamp and the last interval


def test_fit_equals_the_closed_form_and_drops_only_its_constant_part(sharp):
    texts = texts_of(2, 11)
    rows = own_rows(sharp["lm"], texts)
    lps = [adadetectgpt_reference(sharp["lm"], t, [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0], PRM)["log_probs"] for t in texts]
    fit = ada_fit(rows[:5], rows[5:10], PRM)                        # 5 and 5: no constant part
    ref = beta_hat_restated(lps[:5], lps[5:10])
    assert np.abs(np.array(fit["beta"]) - ref).max() < 1e-6 and np.abs(np.array(fit["beta_witness"]) - ref).max() < 1e-6
    fit = ada_fit(rows[:5], rows[5:], PRM)                          # 5 and 6: delta_0 = 1, the clamp's 1e6 dominates
    ref = beta_hat_restated(lps[:5], lps[5:])
    assert np.abs(np.array(fit["beta"]) - ref).max() < 1e-6 and abs(ref[0]) > 0.9
    const = np.zeros((8, 2)); const[0, 0] = 1.0; const[1:, 1] = 1 / math.sqrt(7)
    rest = ref - const @ (const.T @ ref)
    assert np.abs(np.array(fit["beta_witness"]) - rest / np.linalg.norm(rest)).max() < 1e-6
    # the constant part changes w by a constant: the statistic is the same, computed from the loops with the full beta
    for e, t in zip(rows[:3], texts[:3]):
        r = adadetectgpt_reference(sharp["lm"], t, (rest / np.linalg.norm(rest) + 0.7 * const[:, 0] + 0.3 * const[:, 1]).tolist(), PRM)
        assert abs(ada_statistic(e, fit["beta_witness"]) - r["adadetectgpt"]) <= 1e-6 * abs(r["adadetectgpt"])


def test_blocks_and_batch_mates_do_not_change_a_text(sharp, tmp_path):
    lm, texts = sharp["lm"], texts_of(3, 5)
    seqs = [lm.tokenizer(t).input_ids for t in texts]
    ids, mask = pad_batch(seqs, 5, 32, lm.tokenizer.pad_token_id)
    with torch.no_grad(): z = lm.model(input_ids=ids, attention_mask=mask).logits
    a = ada_rows(z, ids, [len(s) for s in seqs], PRM, lm.tokenizer.pad_token_id, block_logits=50)      # one position a call
    b = ada_rows(z, ids, [len(s) for s in seqs], PRM, lm.tokenizer.pad_token_id, block_logits=1 << 30)  # the whole batch
    for x, y in zip(a, b):
        assert x["n_tokens"] == y["n_tokens"] and np.abs(np.array(x["c"]) - np.array(y["c"])).max() < 1e-12
    cfg = {"scoring_model": sharp["path"], "device": "cpu", "trust_remote_code": False, "score_batch_tokens": 256,
           "score_bucket_tokens": 32}
    alone = ada_entries(texts[:1], cfg, Cache(tmp_path / "a"), 128)[sha256_text(texts[0])]
    mates = ada_entries(texts, cfg, Cache(tmp_path / "b"), 128)[sha256_text(texts[0])]
    assert alone == mates


def _split(out, texts, labels):
    write_jsonl(out / "data" / "toy.train.jsonl",
                [{"id": f"t{i}", "text": t, "label": l, "domain": "news", "generator": "g" if l == "ai" else "human"} for i, (t, l) in enumerate(zip(texts, labels))])


def test_trained_on_the_split_written_with_the_run_and_cached(sharp, tmp_path):
    out, store = tmp_path / "run", Cache(tmp_path / "store")
    cfg = {"out_dir": str(out), "datasets": [{"name": "toy"}], "scoring_model": sharp["path"], "device": "cpu",
           "trust_remote_code": False, "score_batch_tokens": 256, "score_bucket_tokens": 32, "score_windows": {}}
    assert "no training split" in ADADETECTGPT.unavailable(cfg)
    train, test = texts_of(4, 8, 12, 30), texts_of(5, 3, 12, 30)
    _split(out, train, ["human"] * 4 + ["ai"] * 4)
    assert ADADETECTGPT.unavailable(cfg) == ""
    got = ADADETECTGPT.compute(test, cfg, store)
    card = read_json(out / "models" / "adadetectgpt.card.json")
    assert card["training"]["n_human"] == 4 and card["training"]["n_ai"] == 4 and ADADETECTGPT.model(cfg) == card["identity"]
    from stealth_eval.supervised import training_set
    tr, y, _ = training_set(cfg)
    rows = own_rows(sharp["lm"], tr)
    fit = ada_fit([r for r, l in zip(rows, y) if l == 0], [r for r, l in zip(rows, y) if l == 1], PRM)
    assert np.abs(np.array(card["beta_witness"]) - fit["beta_witness"]).max() < 1e-5
    for t in test:
        assert math.isfinite(got[sha256_text(t)]["adadetectgpt"])
        r = adadetectgpt_reference(sharp["lm"], t, card["beta_witness"], PRM)["adadetectgpt"]
        assert abs(got[sha256_text(t)]["adadetectgpt"] - r) <= 1e-5 * max(1.0, abs(r))
    before = store.stats().get("adadetectgpt_fit", {})
    assert ADADETECTGPT.compute(test, cfg, store) == got
    assert store.stats()["adadetectgpt_fit"]["hits"] == before.get("hits", 0) + 1     # the fit is read back, by content
    _split(out, train[:7] + [texts_of(9, 1, 12, 30)[0]], ["human"] * 4 + ["ai"] * 4)   # another split: another fit
    assert ADADETECTGPT.compute(test, cfg, store) != got


def test_one_class_is_refused_and_settings_are_checked(sharp, tmp_path):
    from stealth_eval.config import resolve_config
    from stealth_eval.schema import SettingsError
    cfg = {"out_dir": str(tmp_path), "datasets": [{"name": "toy"}], "scoring_model": sharp["path"], "device": "cpu",
           "trust_remote_code": False, "score_windows": {}}
    _split(tmp_path, texts_of(6, 3, 12, 20), ["human"] * 3)
    assert "no training split with both classes" in ADADETECTGPT.unavailable(cfg)
    c = resolve_config("embedded", detectors=["adadetectgpt"], overrides={"adadetectgpt.n_bases": 9, "score_windows": {"adadetectgpt": 256}})
    assert ada_params(c)["n_bases"] == 9 and ADADETECTGPT.source(c) != ADADETECTGPT.source({**c, "adadetectgpt": {}})
    with pytest.raises(SettingsError, match="adadetectgpt.n_bases"):
        resolve_config("embedded", detectors=["adadetectgpt"], overrides={"adadetectgpt.n_bases": 2})


def test_cli_lists_them_with_references_models_and_training_data():
    from conftest import run_cli
    out = run_cli("--list", timeout=300).stdout
    rows = {l.split()[0]: l for l in out.splitlines() if l.strip().startswith(("adadetectgpt", "tocsin"))}
    assert set(rows) == {"adadetectgpt", "tocsin", "tocsin_likelihood", "tocsin_logrank", "tocsin_lrr", "tocsin_standalone"}
    a = rows["adadetectgpt"]
    assert "higher = AI" in a and " yes " in a and "detect_gpt_ada.py" in a and "scoring_model" in a and "training split" in a
    t = rows["tocsin"]
    assert "higher = AI" in t and "TOCSIN.py get_score --basemodel Fast" in t and "facebook/bart-base" in t and "no training data" in t
