"""SpecDetect and SpecDetect++ (nbs/29_specdetect) against the reference's own computation, restated.

The reference (luohaitong/SpecDetect, py_scripts/baselines/specdetect_doubleplus.py) builds the scoring model's
log-likelihoods as a (1, N, S) array (S = 1 for the text, n_samples for its samples), and `get_freq_features` swaps
and squeezes it to (S, N), centres each row, takes `scipy.fftpack.fft`, keeps (|X|/N)^2 over `[:, :int(N/2)]` and
returns minus the sum; `get_sampling_discrepancy_frequency` standardises the text's value by the samples' mean and
NumPy (population) std. Those steps are written out below in NumPy on the same float64 log-likelihoods and the same
sampled tokens as the batched device code reads, through a tiny causal LM, in padded batches.
"""
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
fftpack = pytest.importorskip("scipy.fftpack")

from stealth_eval.core import Cache, sha256_text
from stealth_eval.detectors import DETECTORS
from stealth_eval.lastde import lastde_params, lastde_use, make_sharp_tiny_lm, text_uniforms
from stealth_eval.models import load_causal_lm
from stealth_eval.specdetect import (SPEC_MIN_TOKENS, specdetect_params, specdetect_scores, specdetect_use,
                                     spectral_energy, spectral_energy_batch)
from stealth_eval.stream import PASSES, fetch_lm_uses

WORDS = ("the police said the fire was under control and the minister said two people were at the news today "
         "a year after the government had been new to this").split() * 3


def freq_features(log_likelihood):
    "The reference's get_freq_features on its (1, N, S) log-likelihood array: -(sum over k < int(N/2) of (|X_k|/N)^2) per row."
    x = np.squeeze(np.swapaxes(log_likelihood, 0, 2), axis=-1)
    x = x - np.mean(x, axis=1, keepdims=True)
    N = x.shape[1]
    return -np.sum(((np.abs(fftpack.fft(x)) / N) ** 2)[:, :int(N / 2)], axis=1)


def reference_values(lm, text, n_samples, seed):
    "SpecDetect and SpecDetect++ of one text as the reference computes them, on float64 log-probabilities of one pass."
    ids = lm.tokenizer(text, truncation=False).input_ids
    with torch.no_grad(): z = lm.model(torch.tensor([ids])).logits[0, :-1].double()
    lp = torch.log_softmax(z, -1).numpy()                                      # (N, V)
    N = lp.shape[0]
    x = lp[np.arange(N), ids[1:]]
    U = text_uniforms(sha256_text(text), seed, N, n_samples).numpy()          # the project's draws (Lastde++'s)
    cum = np.cumsum(np.exp(lp), axis=1)
    tok = np.stack([np.minimum(np.searchsorted(cum[t], U[t] * cum[t, -1], side="right"), lp.shape[1] - 1) for t in range(N)])
    xs = lp[np.arange(N)[:, None], tok]                                        # (N, S): sample k's token at each position
    spec = freq_features(x[None, :, None])[0]
    sampled = freq_features(xs[None])
    return {"n_tokens": N, "specdetect": spec, "specdetect_pp": float((spec - sampled.mean(axis=0)) / sampled.std(axis=0))}


def rel_close(a, b, tol=1e-6):
    return abs(a - b) <= tol * max(1.0, abs(b))


# ---- the statistic on sequences --------------------------------------------------------------------------------
def test_hand_example_and_parseval():
    "(1, 2, 3, 4): X_1 = -2 + 2i, E = 8/16; for even N, E = (mean c^2 - X_{N/2}^2 / N^2) / 2."
    assert math.isclose(spectral_energy([1, 2, 3, 4]), 0.5, rel_tol=1e-12)
    g = np.random.default_rng(1)
    for n in (6, 10, 32):
        x = g.normal(size=n); c = x - x.mean()
        nyq = float(np.sum(c * (-1.0) ** np.arange(n)))
        assert math.isclose(spectral_energy(x.tolist()), 0.5 * (np.mean(c ** 2) - nyq ** 2 / n ** 2), rel_tol=1e-9)
    assert [spectral_energy(q) for q in ([-2.0], [-2.0, -1.0], [-2.0, -1.0, -3.0])] == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("n", [4, 5, 9, 16, 41])
def test_batch_equals_the_reference_pipeline(n):
    "Odd and even lengths: the batched FFT of padded rows, the O(N^2) definition and the reference's NumPy steps agree."
    g = np.random.default_rng(n)
    seqs = [-(g.random(k) * 4) ** 2 for k in (n, n + 3, n + 12)]
    X = torch.full((3, n + 20), 9.0, dtype=torch.float64)                      # padding: garbage past each length
    for i, q in enumerate(seqs): X[i, :len(q)] = torch.tensor(q)
    got = spectral_energy_batch(X, torch.tensor([len(q) for q in seqs]))
    for i, q in enumerate(seqs):
        ref = -freq_features(q[None, :, None])[0]
        assert rel_close(float(got[i]), ref, 1e-9) and rel_close(spectral_energy(q.tolist()), ref, 1e-9)
    many = spectral_energy_batch(torch.tensor(np.stack([seqs[0]] * 4)), n)     # a text and its samples: (S, N) at once
    assert np.allclose(-many.numpy(), freq_features(np.stack([seqs[0]] * 4).T[None]), rtol=1e-12)


# ---- through a tiny LM -------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sharp(tmp_path_factory):
    d = tmp_path_factory.mktemp("spec")
    path = make_sharp_tiny_lm(d / "lm")
    return str(path), load_causal_lm(str(path), device="cpu")


def cfg_of(path, **kw):
    return {"scoring_model": path, "device": "cpu", "trust_remote_code": False, "seed": 5, "specdetect": {"n_samples": 16},
            "score_batch_tokens": 256, "score_bucket_tokens": 16, **kw}


def test_batched_values_equal_the_reference_on_the_same_logits(sharp, tmp_path):
    "Texts of 2, 13, 44 and 74 scored tokens, in padded batches, against the reference's steps one text at a time (1e-6)."
    path, lm = sharp
    texts = [" ".join(WORDS[:3]), " ".join(WORDS[:14]), " ".join(WORDS[:45]), " ".join(WORDS[:75])]
    cfg, cache = cfg_of(path), Cache(tmp_path / "c")
    got = {s: specdetect_scores(texts, cfg, cache, 128, s) for s in (False, True)}
    for t in texts:
        ref = reference_values(lm, t, 16, 5)
        for s, k in ((False, "specdetect"), (True, "specdetect_pp")):
            e = got[s][sha256_text(t)]
            assert e["n_tokens"] == ref["n_tokens"]
            if ref["n_tokens"] < SPEC_MIN_TOKENS:
                assert e[k] is None and "fewer than 4" in e["why"]
            else:
                assert rel_close(e[k], ref[k]), (k, e[k], ref[k])
    assert got[False][sha256_text(texts[2])]["specdetect"] < 0                 # minus an energy


def test_a_texts_values_do_not_depend_on_its_batch_mates(sharp, tmp_path):
    path, _ = sharp
    t = " ".join(WORDS[:30])
    alone = specdetect_scores([t], cfg_of(path), Cache(tmp_path / "a"), 128, True)[sha256_text(t)]
    mates = specdetect_scores([" ".join(WORDS[:12]), t, " ".join(WORDS[:60])], cfg_of(path), Cache(tmp_path / "b"), 128, True)
    assert mates[sha256_text(t)]["specdetect_pp"] == alone["specdetect_pp"]


def test_specdetect_its_plus_plus_and_lastde_read_one_pass(sharp, tmp_path):
    "The three readers of the scoring model's stream over the same window: one forward pass per text, then none (cached)."
    path, _ = sharp
    texts = [" ".join(WORDS[:20]), " ".join(WORDS[:50])]
    cfg, cache = {**cfg_of(path), "lastde": {**lastde_params({}), "n_samples": 4}}, Cache(tmp_path / "c")
    uses = lambda: [specdetect_use(texts, cfg, cache, 128, False), specdetect_use(texts, cfg, cache, 128, True),
                    lastde_use(texts, cfg, cache, 128)]
    before = sum(PASSES.values())
    got = fetch_lm_uses(path, cfg, cache, uses())
    assert sum(PASSES.values()) - before == len(texts)
    assert fetch_lm_uses(path, cfg, cache, uses()) == got and sum(PASSES.values()) - before == len(texts)


def test_detectors_mark_short_texts_and_list_their_reference(sharp, tmp_path, capsys):
    path, _ = sharp
    short, ok = " ".join(WORDS[:3]), " ".join(WORDS[:20])
    for name in ("specdetect", "specdetect_pp"):
        det = DETECTORS.get(name)
        got = det.compute([short, ok], cfg_of(path), Cache(tmp_path / name))
        assert got[sha256_text(short)] is None and "2 scored tokens: fewer than 4" in det.why_none(sha256_text(short))
        assert math.isfinite(det.raw(got[sha256_text(ok)])) and det.direction == 1
    assert specdetect_params({"specdetect": {"n_samples": 7}}) == {"n_samples": 7}
    from stealth_eval.run import main
    assert main(["--list"]) == 0
    rows = {l.split()[0]: l for l in capsys.readouterr().out.splitlines() if l.startswith("  specdetect")}
    assert set(rows) == {"specdetect", "specdetect_pp"}
    assert all("luohaitong/SpecDetect" in r and "get_freq_features" in r and "model: the run's scoring_model" in r for r in rows.values())
    assert "get_sampling_discrepancy_frequency" in rows["specdetect_pp"]
