"""Glimpse (nbs/29_glimpse) against the reference's own computation, restated, on the same top-k lists.

The reference (baoguangsheng/glimpse, scripts/probability_distributions.py and probability_distribution_estimation.py)
is written out below in NumPy as its classes compute, one position at a time: `GeometricDistribution` and
`ZipfianDistribution.estimate_distrib_token` on a position's dict of top log-probabilities, and `PdeFastDetectGPT`,
`PdeEntropy`, `PdeRank`, `PdeLogRank` on a text's log-probabilities and estimated distributions. The project's code reads
those lists from an OpenAI-compatible completions endpoint (a fake one on the loopback speaking the documented echo
response, as tests/test_api_detectors.py does for the commercial providers) and, offline, from a tiny causal LM's
pass (the reference's `probability_distribution_estimation_openllm.py`); both must give the reference's values (1e-6).
"""
import json
import math

import numpy as np
import pytest
from pytest_httpserver import HTTPServer
from werkzeug import Response

from stealth_eval import api_detectors as ad
from stealth_eval.core import Cache, sha256_text
from stealth_eval.detectors import DETECTORS
from stealth_eval.glimpse import (GLIMPSE_PROMPTS, GLIMPSE_STATS, glimpse_criteria, glimpse_local_use, glimpse_params,
                                  rank_distributions)

KEY = "sk-LOOPBACK-glimpse-7c1e"
API = ["glimpse", "glimpse_entropy", "glimpse_rank", "glimpse_logrank"]
LOCAL = ["glimpse_local", "glimpse_local_entropy", "glimpse_local_rank", "glimpse_local_logrank"]
STAT = dict(zip(API + LOCAL, list(GLIMPSE_STATS) * 2))


# ---- the reference, restated ------------------------------------------------------------------------------------
def ref_geometric(toplogprobs: dict, K: int, M: int):
    "GeometricDistribution.estimate_distrib_token."
    probs = np.exp(sorted(toplogprobs.values(), reverse=True)[:K])
    if probs.sum() > 1.0: probs = probs / (probs.sum() + 1e-6)
    p_K, p_rest = probs[-1], 1 - probs.sum()
    lam = p_rest / (p_K + p_rest)
    if lam ** (M - K + 1) > 1e-6:
        last = 1.0
        while True:
            lam0 = lam
            lam = 1 - (lam - lam ** (M - K + 1)) * p_K / p_rest
            diff = abs(lam - lam0)
            if lam < 0 or diff < 1e-6 or diff >= last:
                lam = lam0
                break
            last = diff
    rest = np.exp(np.log(p_K + 1e-8) + np.arange(1, M - K + 1) * np.log(lam + 1e-8))
    full = np.concatenate([probs, rest])
    return full / full.sum()


_TABLES = {}


def ref_zipfian(toplogprobs: dict, K: int, M: int):
    "ZipfianDistribution: its (alpha, beta) table built once per (K, M), then estimate_distrib_token."
    if (K, M) not in _TABLES:
        t = np.zeros((100, 100))
        for a in range(100):
            for b in range(100):
                t[a, b] = ((b / 5 / (np.arange(1, M - K) + b / 5)) ** (a / 10)).sum()
        _TABLES[K, M] = t
    probs = np.exp(sorted(toplogprobs.values(), reverse=True)[:K])
    if probs.sum() > 1.0: probs = probs / (probs.sum() + 1e-6)
    p_K, p_rest = probs[-1], 1 - probs.sum()
    dist = (np.square(_TABLES[K, M] - p_rest / p_K) + 1.0 * np.square(np.arange(100)[:, None] / 10 - 1)
            + 0.001 * np.square(np.arange(100)[None] / 5 - 2.7))
    a, b = np.unravel_index(dist.argmin(), dist.shape)
    alpha, beta = a / 10, b / 5
    rest = np.exp(np.log(p_K + 1e-8) + alpha * np.log(beta / (np.arange(1, M - K + 1) + beta) + 1e-8))
    full = np.concatenate([probs, rest])
    return full / full.sum()


def ref_criteria(logprobs: list, probs) -> dict:
    "PdeFastDetectGPT, PdeEntropy, PdeRank and PdeLogRank of one text."
    probs, ll = np.array(probs), np.array(logprobs)
    with np.errstate(divide="ignore", over="ignore"):
        lprobs = np.nan_to_num(np.log(probs))
        mean_ref = (probs * lprobs).sum(axis=-1)
        var_ref = (probs * np.nan_to_num(np.square(lprobs))).sum(axis=-1) - np.square(mean_ref)
    ranks = []
    for lp, prob in zip(logprobs, probs):
        rank = 0
        while rank < len(prob) and prob[rank] > np.exp(lp): rank += 1
        if rank < len(prob): ranks.append(rank + 1)
    return {"pde_fastdetect": ((ll.sum() - mean_ref.sum()) / np.sqrt(var_ref.sum())).item(),
            "pde_entropy": float(np.mean(-(probs * lprobs).sum(axis=-1))),
            "pde_rank": -float(np.mean(ranks)), "pde_logrank": -float(np.mean(np.log(ranks)))}


def ref_text(logprobs, toplogprobs, estimator, K, M):
    est = ref_geometric if estimator == "geometric" else ref_zipfian
    return ref_criteria(logprobs, [est(t, K, M) for t in toplogprobs])


def close(a, b, tol=1e-6):
    return abs(a - b) <= tol * max(1.0, abs(b))


def top_dicts(seed, n, shapes=(0.05, 0.3, 1.0, 8.0)):
    "n positions' top-10 dicts from Dirichlet distributions over 60 words, peaked to flat."
    g = np.random.default_rng(seed)
    out = []
    for i in range(n):
        lp = np.sort(np.log(np.clip(g.dirichlet(np.ones(60) * shapes[i % len(shapes)]), 1e-30, None)))[::-1][:10]
        out.append({f"w{k}": float(v) for k, v in enumerate(lp)})
    return out


# ---- the estimators and the criteria ------------------------------------------------------------------------------
@pytest.mark.parametrize("estimator,K,M", [("geometric", 5, 1000), ("geometric", 3, 100), ("geometric", 1, 50),
                                           ("geometric", 1, 3), ("geometric", 2, 6),   # the decay's iteration diverging: stopped
                                           ("zipfian", 5, 100), ("zipfian", 5, 1000), ("zipfian", 2, 30)])
def test_estimated_distributions_equal_the_reference_classes(estimator, K, M):
    """Peaked, flat (the geometric decay iterated), over-full (summing past 1) tops, and with a few ranks a top-heavy
    position whose iterated decay moves further each step (the reference keeps the value before): row by row, to 1e-9."""
    tops = top_dicts(K * M, 24)
    tops.append({"a": math.log(0.7), "b": math.log(0.3), "c": math.log(0.05), "d": math.log(0.01), "e": math.log(0.001)})
    tops.append({f"f{k}": math.log(0.002) for k in range(5)})                  # flat: lambda^(M-K+1) far above 1e-6
    got = rank_distributions([sorted(t.values(), reverse=True)[:K] for t in tops], estimator, K, M)
    ref = ref_geometric if estimator == "geometric" else ref_zipfian
    for row, t in zip(got, tops):
        assert np.allclose(row, ref(t, K, M), rtol=1e-9, atol=1e-15)
    flat = ref_geometric(tops[-1], 5, 1000) if estimator == "geometric" and (K, M) == (5, 1000) else None
    if flat is not None: assert flat[5] / flat[4] > 0.99                       # the iterated decay keeps the tail's mass


def test_criteria_equal_the_reference_pde_classes():
    "Including a token below every estimated rank (left out of the rank criteria) and tokens inside the top k."
    tops = top_dicts(3, 12)
    ll = [list(t.values())[i % 7] for i, t in enumerate(tops)]
    ll[3] = math.log(1e-16)                                                    # flat: below its last estimated rank
    for est, M in (("geometric", 1000), ("zipfian", 100)):
        probs = rank_distributions([sorted(t.values(), reverse=True)[:5] for t in tops], est, 5, M)
        got, ref = glimpse_criteria(ll, probs), ref_text(ll, tops, est, 5, M)
        assert all(close(got[k], ref[k], 1e-9) for k in ref), (got, ref)
        assert (got["n_tokens"], got["n_ranked"]) == (12, 11)


# ---- through a completions endpoint on the loopback --------------------------------------------------------------
class FakeCompletions:
    """An OpenAI-compatible /v1/completions that echoes the prompt's log-probabilities: the start token, the prompt in two
    tokens, the text's words; each position's top 10 (and the token itself) from a seeded Dirichlet over 60 words."""
    def __init__(self, server, prompt_split=None):
        self.calls, self.bodies, self.prompt_split = [], [], prompt_split
        server.expect_request("/v1/completions", method="POST").respond_with_handler(self.handle)

    def read(self, prompt, text):
        "(tokens, token_logprobs, top_logprobs) the server answers for `text` after `prompt`."
        cut = self.prompt_split or len(prompt) // 2
        toks = ["<|endoftext|>"] + [p for p in (prompt[:cut], prompt[cut:]) if p] + [(" " if i else "") + w for i, w in enumerate(text.split(" "))]
        g = np.random.default_rng(len(text) * 7 + len(toks))
        lps, tops = [None], [None]
        for i, t in enumerate(toks[1:]):
            lp = np.sort(np.log(np.clip(g.dirichlet(np.ones(60) * (0.05, 0.4, 2.0)[i % 3]), 1e-30, None)))[::-1]
            mine = float(lp[min(i % 13, 59)])                                  # often in the top 10, sometimes not
            top = {f"w{k}": float(v) for k, v in enumerate(lp[:10])}
            top[t] = mine
            lps.append(mine); tops.append(top)
        return toks, lps, tops

    def handle(self, req):
        b = json.loads(req.get_data())
        self.bodies.append((dict(req.headers), b))
        start, prompt = "<|endoftext|>", GLIMPSE_PROMPTS["prompt3"]
        text = b["prompt"][len(start + prompt):]
        self.calls.append(text)
        if req.headers.get("Authorization") != f"Bearer {KEY}": return Response('{"error": "bad key"}', 401)
        toks, lps, tops = self.read(prompt, text)
        body = {"object": "text_completion", "model": b["model"], "choices": [{"text": b["prompt"], "index": 0, "finish_reason": "length",
                "logprobs": {"tokens": toks, "token_logprobs": lps, "top_logprobs": tops, "text_offset": list(range(len(toks)))}}],
                "usage": {"prompt_tokens": len(toks), "completion_tokens": 0, "total_tokens": len(toks)}}
        return Response(json.dumps(body), 200, content_type="application/json")


@pytest.fixture
def server():
    s = HTTPServer(host="127.0.0.1", port=0, threaded=True)
    s.start()
    yield s
    s.clear(); s.stop()


def api_cfg(server, **glimpse):
    return {"api": {"base_url": {"glimpse": server.url_for("/v1").rstrip("/")}, "timeout_s": 2.0, "max_attempts": 2,
                    "backoff_s": 0.01}, "glimpse": glimpse}


TEXTS = ["the machine wrote this text with care today", "a human wrote that one by hand on a rainy day at home",
         "short"]


def test_api_detectors_read_once_and_equal_the_reference(server, tmp_path, monkeypatch):
    "The documented request; every criterion equals the reference on the server's lists; four detectors, one call a text."
    fake = FakeCompletions(server)
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    cfg, cache = api_cfg(server), Cache(tmp_path / "store")
    got = {n: DETECTORS.get(n).compute(TEXTS + [TEXTS[0]], cfg, cache) for n in API}
    assert sorted(fake.calls) == sorted(TEXTS)                                 # one call per distinct text, for all four
    headers, body = fake.bodies[0]
    assert headers["Authorization"] == f"Bearer {KEY}"
    assert body == {"model": "davinci-002", "prompt": "<|endoftext|>" + GLIMPSE_PROMPTS["prompt3"] + body["prompt"][len("<|endoftext|>" + GLIMPSE_PROMPTS["prompt3"]):],
                    "max_tokens": 0, "echo": True, "logprobs": 5}
    for t in TEXTS:
        toks, lps, tops = fake.read(GLIMPSE_PROMPTS["prompt3"], t)
        ref = ref_text(lps[3:], tops[3:], "geometric", 5, 1000)               # the start token and the prompt's two: not read
        for n in API:
            assert close(DETECTORS.get(n).raw(got[n][sha256_text(t)]), ref[STAT[n]]), (n, t)
        assert got["glimpse"][sha256_text(t)]["n_tokens_input"] == len(toks) - 3
    assert ad.API_LEDGER["glimpse"]["spent"] == 0                             # the last detector's compute: all cached
    # the Zipfian estimator reads the same cached answers: no call, the reference's values at main.sh's rank size 100
    fake.calls.clear()
    zipf = DETECTORS.get("glimpse").compute(TEXTS, api_cfg(server, estimator="zipfian"), cache)
    assert fake.calls == []
    for t in TEXTS:
        _, lps, tops = fake.read(GLIMPSE_PROMPTS["prompt3"], t)
        assert close(zipf[sha256_text(t)]["pde_fastdetect"], ref_text(lps[3:], tops[3:], "zipfian", 5, 100)["pde_fastdetect"])
    assert not any(KEY in p.read_text() for p in (tmp_path / "store").rglob("*") if p.is_file())


def test_api_spend_and_a_prompt_that_runs_into_the_text(server, tmp_path, monkeypatch):
    "usage.total_tokens is what the ledger adds; a response whose prompt tokens do not end at the text marks it, with why."
    fake = FakeCompletions(server, prompt_split=len(GLIMPSE_PROMPTS["prompt3"]) + 1)   # the second prompt token is empty ...
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    real_read = fake.read
    def merged(prompt, text):                                                  # ... and the first swallows the text's first letter
        toks, lps, tops = real_read(prompt, text)
        if text.startswith("a "): toks = [toks[0], prompt + "a", " " + toks[2][1:]] + toks[3:]
        return toks, lps, tops
    fake.read = merged
    det = DETECTORS.get("glimpse")
    got = det.compute(TEXTS[:2], api_cfg(server), Cache(tmp_path / "s"))
    assert got[sha256_text(TEXTS[1])] is None and "the prompt's tokens run into the text" in det.why_none(sha256_text(TEXTS[1]))
    assert got[sha256_text(TEXTS[0])] is not None
    assert ad.API_LEDGER["glimpse"]["spent"] == sum(len(fake.read(GLIMPSE_PROMPTS["prompt3"], t)[0]) for t in TEXTS[:2])
    monkeypatch.delenv("OPENAI_API_KEY")
    assert det.unavailable({}) == "no API key: set the environment variable OPENAI_API_KEY"


def test_settings_are_checked_and_the_endpoint_is_the_glimpse_read(server):
    from stealth_eval.config import check_names
    check_names({"api": {"base_url": {"glimpse": "http://127.0.0.1:8000/v1"}, "spend_limit": {"glimpse": 10}}})
    assert DETECTORS.get("glimpse_rank").endpoint(api_cfg(server)) == server.url_for("/v1/completions")
    assert DETECTORS.get("glimpse_rank").limit({"api": {"spend_limit": {"glimpse": 7}}}) == 7.0
    with pytest.raises(Exception, match="glimpse.prompt"):
        glimpse_params({"glimpse": {"prompt": "prompt9"}}, local=False)
    with pytest.raises(Exception, match="glimpse.rank_size=5: must exceed glimpse.top_k=5"):
        glimpse_params({"glimpse": {"rank_size": 5}}, local=True)
    with pytest.raises(Exception, match="glimpse.top_k=120: must be below the rank size 100"):   # main.sh's Zipfian M
        glimpse_params({"glimpse": {"estimator": "zipfian", "top_k": 120, "api_top_logprobs": 120}}, local=False)


# ---- the offline stand-in ----------------------------------------------------------------------------------------
WORDS = ("the police said the fire was under control and the minister said two people were at the news today "
         "a year after the government had been new to this").split() * 3


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    torch = pytest.importorskip("torch")
    from stealth_eval.lastde import make_sharp_tiny_lm
    from stealth_eval.models import load_causal_lm
    path = str(make_sharp_tiny_lm(tmp_path_factory.mktemp("glimpse") / "lm", scale=8.0))
    return path, load_causal_lm(path, device="cpu"), torch


def openllm_read(lm_, torch, text, K):
    "OpenLLM.eval: the tokens after the first, their log-probabilities and each position's top-K dict, float64."
    ids = lm_.tokenizer(text, truncation=False).input_ids
    with torch.no_grad(): lprobs = torch.log_softmax(lm_.model(torch.tensor([ids])).logits[0, :-1].double(), -1)
    logprobs = [lprobs[i, t].item() for i, t in enumerate(ids[1:])]
    v, k = lprobs.topk(K)
    return logprobs, [dict(zip(map(str, kk), vv)) for kk, vv in zip(k.tolist(), v.tolist())]


@pytest.mark.parametrize("estimator,M", [("geometric", 1000), ("zipfian", 100)])
def test_local_stand_in_equals_the_reference_openllm_path(lm, tmp_path, estimator, M):
    "Texts of 0, 1, 13, 44 and 74 scored tokens in padded batches; the four local detectors read one pass per text."
    from stealth_eval.stream import PASSES, fetch_lm_uses
    path, lm_, torch = lm
    texts = [WORDS[0], " ".join(WORDS[:2]), " ".join(WORDS[:14]), " ".join(WORDS[:45]), " ".join(WORDS[:75])]
    cfg = {"scoring_model": path, "device": "cpu", "trust_remote_code": False, "score_batch_tokens": 256,
           "score_bucket_tokens": 16, "glimpse": {"estimator": estimator, "rank_size": M}}
    cache = Cache(tmp_path / "c")
    before = sum(PASSES.values())
    fetch_lm_uses(path, cfg, cache, [glimpse_local_use(texts, cfg, cache, 128) for _ in LOCAL])   # as the stage declares them
    assert sum(PASSES.values()) - before == len(texts) - 1                    # a text of one token needs no pass
    for n in LOCAL:
        got = DETECTORS.get(n).compute(texts, cfg, cache)
        for t in texts:
            logprobs, tops = openllm_read(lm_, torch, t, 5)
            if not logprobs:
                assert got[sha256_text(t)] is None
                continue
            ref = ref_text(logprobs, tops, estimator, 5, M)
            assert close(DETECTORS.get(n).raw(got[sha256_text(t)]), ref[STAT[n]]), (n, t)
    assert sum(PASSES.values()) - before == len(texts) - 1                    # the detectors read the cached entries
    assert "no token read" in DETECTORS.get("glimpse_local").why_none(sha256_text(texts[0]))


def test_list_shows_each_glimpse_detector_with_its_reference_and_model(capsys):
    from stealth_eval.run import main
    assert main(["--list"]) == 0
    rows = {l.split()[0]: l for l in capsys.readouterr().out.splitlines() if l.startswith("  glimpse")}
    assert set(rows) == set(API + LOCAL)
    for n in API:
        assert "baoguangsheng/glimpse" in rows[n] and "probability_distribution_estimation.py" in rows[n] and "davinci-002" in rows[n]
        assert rows[n].split()[1] == "commercial"
    for n in LOCAL:
        assert rows[n].split()[1] == "*" and "probability_distribution_estimation_openllm.py" in rows[n]
        assert rows[n].endswith(f"[stands in for: {n.replace('_local', '')}]") and "scoring_model" in rows[n]
