"""The API detectors against a real HTTP server on the loopback that speaks each provider's documented shapes.

Every case ends with each text scored or marked with a reason, an exact spend counter, and the cache: a rerun pays
nothing, a killed run resumes with the texts it had not scored. Waits are recorded, not slept (`api_detectors._sleep`),
and advance the client's clock (`api_detectors._clock`); timeouts are real (a handler slower than `api.timeout_s`).
The bounded policy (#37): a score outside the provider's documented range marks its text; a server that never answers,
trickles its answer or asks for an hour's wait costs a text its budget at most; the circuit breaker stops a provider
after N consecutive failed texts (counted on the server); the deadline ends a slow provider; every `api` setting and a
base URL from the environment are refused before the run, in one line.
"""
import json
import logging
import math
import threading
import time

import numpy as np
import pytest
from pytest_httpserver import HTTPServer
from werkzeug import Response

from stealth_eval import api_detectors as ad
from stealth_eval.core import Cache, ComponentUnavailable, StealthEvalError, get_logger, sha256_text, write_jsonl

KEY = "sk-LOOPBACK-7f3a9c-secret"
PROVIDERS = ["gptzero", "originality_ai", "sapling", "pangram", "winston_ai"]
DETS = {d.name: d for d in [ad.GPTZero(), ad.OriginalityAI(), ad.Sapling(), ad.Pangram(), ad.WinstonAI()]}
TEXT_FIELD = {"gptzero": "document", "originality_ai": "content", "sapling": "text", "pangram": "text", "winston_ai": "text"}


def text(i, tag=""):
    "A text over Winston's 300-character minimum, distinct per i."
    return f"Text {i}{tag}: " + " ".join(f"w{i}x{j}" for j in range(60 + 7 * i))


def prob(t):
    "The fake provider's score for a text: a fixed function of its length."
    return round((len(t) % 89) / 100 + 0.05, 4)


def documented(name, t):
    "The provider's documented 200 response for text `t` (and the units it reports billing, None when it reports none)."
    p, words = prob(t), len(t.split())
    if name == "gptzero":
        return {"version": "2024-01-09", "documents": [{"completely_generated_prob": p, "average_generated_prob": p,
                "class_probabilities": {"ai": p, "human": 1 - p, "mixed": 0.0}, "predicted_class": "ai"}]}, None
    if name == "originality_ai":
        credits = math.ceil(words / 100) + 3     # differs from the estimate: the counter must use the reported figure
        return {"success": True, "score": {"original": 1 - p, "ai": p}, "credits_used": credits}, credits
    if name == "sapling":
        return {"score": p, "sentence_scores": [{"sentence": t[:20], "score": p}]}, None
    if name == "pangram":
        return {"text": t, "version": "3.0", "headline": "AI Detected", "prediction_short": "AI", "fraction_ai": p,
                "fraction_ai_assisted": 0.0, "fraction_human": 1 - p, "num_ai_segments": 1, "windows": []}, None
    if name == "winston_ai":
        return {"status": 200, "score": round(100 * (1 - p), 2), "sentences": [], "credits_used": words + 1,
                "credits_remaining": 10_000}, words + 1


def expected_raw(name, t):
    return 100 * (1 - prob(t)) if name == "winston_ai" else prob(t)


def with_score(name, resp, v):
    "The documented response `resp` with its score field set to `v`."
    d = {"gptzero": lambda r: r["documents"][0], "originality_ai": lambda r: r["score"]}.get(name, lambda r: r)(resp)
    d[{"gptzero": "completely_generated_prob", "originality_ai": "ai", "pangram": "fraction_ai"}.get(name, "score")] = v
    return resp


class FakeProvider:
    """One provider on the loopback: checks its documented auth, records every request, and answers each text by a
    per-text script of behaviours ('429', '503', '500', 'timeout', 'stall', 'trickle', 'malformed', 'nofield',
    ('score', value)), then with 'ok'. `clock` and `took`: each request advances the client's test clock by `took` s."""
    def __init__(self, name, server, slow_s=0.5):
        self.name, self.calls, self.plan, self.billed, self.slow_s = name, [], {}, [], slow_s
        self.fail_after, self.retry_after, self.clock, self.took = None, "2", None, 0.0
        self.release = threading.Event()     # ends the 'stall' and 'trickle' answers (set when the test ends)
        server.expect_request(DETS[name].path, method="POST").respond_with_handler(self.handle)

    def authorized(self, req, body):
        h = req.headers
        return {"gptzero": h.get("x-api-key") == KEY, "originality_ai": h.get("X-OAI-API-KEY") == KEY,
                "sapling": body.get("key") == KEY, "pangram": h.get("x-api-key") == KEY,
                "winston_ai": h.get("Authorization") == f"Bearer {KEY}"}[self.name]

    def handle(self, req):
        body = json.loads(req.get_data())
        t = body[TEXT_FIELD[self.name]]
        self.calls.append(t)
        if self.clock is not None: self.clock.skew += self.took
        if not self.authorized(req, body):
            return Response(json.dumps({"error": "Invalid API key"}), 401, content_type="application/json")
        if self.fail_after is not None and len(self.calls) > self.fail_after:
            return Response("upstream down", 502)
        steps = self.plan.get(t) or []
        act = steps.pop(0) if steps else "ok"
        if act == "429": return Response("slow down", 429, headers={"Retry-After": self.retry_after})
        if act in ("500", "503"): return Response("oops", int(act))
        if act == "timeout":   # answers after the client gave up: not billed (the client never saw it)
            time.sleep(self.slow_s)
            return Response(json.dumps(documented(self.name, t)[0]), 200, content_type="application/json")
        if act == "stall":     # never answers (until the test ends)
            self.release.wait(10)
            return Response("late", 503)
        if act == "trickle":   # a 200 whose body never ends: a byte every 50 ms
            def drip():
                while not self.release.wait(0.05): yield b" "
            return Response(drip(), 200, content_type="application/json")
        if act == "malformed":
            self.billed.append(DETS[self.name].cost(t))
            return Response('{"score": 0.5, ', 200, content_type="application/json")
        resp, units = documented(self.name, t)
        if isinstance(act, tuple): resp = with_score(self.name, resp, act[1])
        if act == "nofield":
            resp = {"status": 200, "unexpected": True}; units = None
        self.billed.append(units if units is not None else DETS[self.name].cost(t))
        return Response(json.dumps(resp), 200, content_type="application/json")


@pytest.fixture
def server():
    s = HTTPServer(host="127.0.0.1", port=0, threaded=True)   # threaded: a slow (timed-out) answer blocks no other
    s.start()
    yield s
    s.clear(); s.stop()


class Clock:
    "The client's clock in a test: real time, plus the waits it recorded instead of sleeping and what servers said they took."
    def __init__(self): self.waits, self.skew = [], 0.0
    def sleep(self, w): self.waits.append(w); self.skew += w
    def __call__(self): return time.monotonic() + self.skew


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(ad, "_sleep", c.sleep)
    monkeypatch.setattr(ad, "_clock", c)
    return c


@pytest.fixture
def waits(clock): return clock.waits


def cfg_for(server, name, **api):
    return {"api": {"base_url": {name: server.url_for("/").rstrip("/")}, "timeout_s": 0.25, "max_attempts": 3,
                    "backoff_s": 0.01, "backoff_max_s": 5.0, **api}}


@pytest.mark.parametrize("name", PROVIDERS)
def test_every_text_scored_or_marked_spend_exact_and_rerun_pays_nothing(name, server, waits, tmp_path, monkeypatch):
    det, fake = DETS[name], FakeProvider(name, server)
    monkeypatch.setenv(det.key_env, KEY)
    texts = [text(i) for i in range(7)]
    fake.plan = {texts[1]: ["429"], texts[2]: ["503", "500"], texts[3]: ["timeout"], texts[4]: ["malformed"],
                 texts[5]: ["500", "500", "500"], texts[6]: ["nofield"]}
    cfg, cache = cfg_for(server, name), Cache(tmp_path / "store")
    got = det.compute(texts + [texts[0]], cfg, cache)          # a repeated text is sent once
    assert set(got) == {sha256_text(t) for t in texts}
    for t in texts[:4]:
        assert got[sha256_text(t)][det.stat] == pytest.approx(expected_raw(name, t))
        assert got[sha256_text(t)]["n_tokens_input"] == len(t.split()) and got[sha256_text(t)]["truncated"] is False
    for t, why in [(texts[4], "malformed JSON"), (texts[5], "HTTP 500 after 3 attempts"), (texts[6], "lacks a documented field")]:
        assert got[sha256_text(t)] is None and why in det.why_none(sha256_text(t))
    led = ad.API_LEDGER[name]
    assert len(fake.calls) == led["calls"] == 1 + 2 + 3 + 2 + 1 + 3 + 1
    assert led["spent"] == pytest.approx(sum(fake.billed)) and (led["scored"], led["failed"]) == (4, 3)
    assert 2.0 in waits and waits.count(2.0) == 1                # the server's Retry-After, honoured once
    assert [0.01, 0.02] == waits[1:3]                            # exponential backoff for the 503 then the 500
    # a rerun asks only for the texts that had no score (their scripts are spent: they succeed now)
    fake.calls.clear()
    again = det.compute(texts, cfg, cache)
    assert sorted(fake.calls) == sorted(texts[4:]) and all(again[sha256_text(t)] is not None for t in texts)
    fake.calls.clear()
    det.compute(texts, cfg, cache)
    assert fake.calls == [] and ad.API_LEDGER[name]["calls"] == 0 and ad.API_LEDGER[name]["spent"] == 0
    entry = json.loads(next((tmp_path / "store" / f"api_{name}").rglob("*.json")).read_text())
    assert set(entry["value"]) == {"stats", "raw", "cost", "unit"} and entry["value"]["unit"] == det.unit
    assert not any(KEY in p.read_text() for p in (tmp_path / "store").rglob("*") if p.is_file())


@pytest.mark.parametrize("name", PROVIDERS)
def test_wrong_key_fails_the_detector_in_one_line_without_retrying(name, server, waits, tmp_path, monkeypatch):
    det, fake = DETS[name], FakeProvider(name, server)
    monkeypatch.setenv(det.key_env, "sk-WRONG-key")
    with pytest.raises(ComponentUnavailable) as e:
        det.compute([text(1)], cfg_for(server, name), Cache(tmp_path / "store"))
    msg = str(e.value)
    assert "HTTP 401" in msg and det.key_env in msg and "sk-WRONG" not in msg and "\n" not in msg
    assert len(fake.calls) == 1 and waits == []


def test_missing_key_is_a_skip_reason(monkeypatch):
    for det in DETS.values():
        monkeypatch.delenv(det.key_env, raising=False)
        assert det.unavailable({}) == f"no API key: set the environment variable {det.key_env}"
        monkeypatch.setenv(det.key_env, KEY)
        assert det.unavailable({}) == ""


def test_estimate_logged_then_refused_over_the_limit(server, waits, tmp_path, monkeypatch):
    det, fake = DETS["winston_ai"], FakeProvider("winston_ai", server)
    monkeypatch.setenv(det.key_env, KEY)
    texts = [text(1), text(2)]
    words = sum(len(t.split()) for t in texts)                    # Winston: 1 credit per word
    logs = []
    h = logging.Handler(); h.emit = lambda r: logs.append(r.getMessage())
    get_logger().addHandler(h)
    try:
        with pytest.raises(StealthEvalError, match=f"estimated cost {words} credits .* exceeds the spend limit "
                                                   f"api.spend_limit.winston_ai = {words - 1}"):
            det.compute(texts, cfg_for(server, "winston_ai", spend_limit={"winston_ai": words - 1}), Cache(tmp_path / "s"))
        assert fake.calls == [] and any(f"estimated cost {words} credits" in m for m in logs)
        det.compute(texts, cfg_for(server, "winston_ai", spend_limit={"winston_ai": words + 2}), Cache(tmp_path / "s"))
        assert len(fake.calls) == 2 and ad.API_LEDGER["winston_ai"]["spent"] == words + 2   # it reports 1 more per text
    finally:
        get_logger().removeHandler(h)


def test_provider_billing_more_than_estimated_stops_before_the_limit(server, waits, tmp_path, monkeypatch):
    det, fake = DETS["originality_ai"], FakeProvider("originality_ai", server)   # reports 3 credits more than estimated
    monkeypatch.setenv(det.key_env, KEY)
    texts = [text(i) for i in range(4)]                           # 1 credit each estimated, 4 billed
    got = det.compute(texts, cfg_for(server, "originality_ai", spend_limit={"originality_ai": 8}), Cache(tmp_path / "s"))
    assert len(fake.calls) == 2 and ad.API_LEDGER["originality_ai"]["spent"] == 8
    marked = [t for t in texts if got[sha256_text(t)] is None]
    assert len(marked) == 2 and all("spend limit" in det.why_none(sha256_text(t)) for t in marked)


def test_timeouts_are_bounded_then_marked(server, waits, tmp_path, monkeypatch):
    det, fake = DETS["sapling"], FakeProvider("sapling", server, slow_s=0.4)
    monkeypatch.setenv(det.key_env, KEY)
    t = text(3)
    fake.plan = {t: ["timeout"] * 5}
    got = det.compute([t], cfg_for(server, "sapling", timeout_s=0.15, max_attempts=2), Cache(tmp_path / "s"))
    assert got[sha256_text(t)] is None and "timed out after 2 attempts" in det.why_none(sha256_text(t))
    assert len(fake.calls) == 2 and ad.API_LEDGER["sapling"]["spent"] == 0


def test_winston_minimum_length_is_marked_without_a_call(server, waits, tmp_path, monkeypatch):
    det, fake = DETS["winston_ai"], FakeProvider("winston_ai", server)
    monkeypatch.setenv(det.key_env, KEY)
    got = det.compute(["too short"], cfg_for(server, "winston_ai"), Cache(tmp_path / "s"))
    assert got[sha256_text("too short")] is None and "minimum of 300 characters" in det.why_none(sha256_text("too short"))
    assert fake.calls == []


@pytest.mark.parametrize("name", ["gptzero", "pangram"])
def test_killed_run_resumes_without_repeating_a_call(name, server, waits, tmp_path, monkeypatch):
    det, fake = DETS[name], FakeProvider(name, server)
    monkeypatch.setenv(det.key_env, KEY)
    texts, k = [text(i) for i in range(6)], 3
    send, n = ad._send, []
    def killed_after_k(*a):
        if len(n) == k: raise KeyboardInterrupt   # the process is killed after k answers
        n.append(1); return send(*a)
    monkeypatch.setattr(ad, "_send", killed_after_k)
    cfg, cache = cfg_for(server, name), Cache(tmp_path / "store")
    with pytest.raises(KeyboardInterrupt):
        det.compute(texts, cfg, cache)
    first = list(fake.calls)
    assert len(first) == k
    monkeypatch.setattr(ad, "_send", send)
    fake.calls.clear()
    got = det.compute(texts, cfg, cache)
    assert sorted(fake.calls) == sorted(set(texts) - set(first)) and all(v is not None for v in got.values())


def test_a_server_failing_after_k_answers_leaves_the_rest_marked_then_resumes(server, waits, tmp_path, monkeypatch):
    det, fake = DETS["sapling"], FakeProvider("sapling", server)
    monkeypatch.setenv(det.key_env, KEY)
    texts = [text(i) for i in range(5)]
    fake.fail_after = 2                                           # answers twice, then 502 for ever
    cfg, cache = cfg_for(server, "sapling", max_attempts=2), Cache(tmp_path / "store")
    got = det.compute(texts, cfg, cache)
    assert [got[sha256_text(t)] is not None for t in texts] == [True, True, False, False, False]
    assert all("HTTP 502 after 2 attempts" in det.why_none(sha256_text(t)) for t in texts[2:])
    assert ad.API_LEDGER["sapling"]["spent"] == sum(len(t) for t in texts[:2])
    fake.fail_after, n_before = None, len(fake.calls)
    det.compute(texts, cfg, cache)
    assert fake.calls[n_before:] == texts[2:]


def test_detectors_stage_with_two_api_detectors_writes_scores_and_no_key(server, waits, tmp_path, monkeypatch):
    from stealth_eval.detectors import run_detectors_stage
    fakes = {n: FakeProvider(n, server) for n in ["sapling", "winston_ai"]}
    for n in fakes: monkeypatch.setenv(DETS[n].key_env, KEY)
    out = tmp_path / "run"
    rows = [{"sample_id": f"s{i}", "dataset": "toy", "label": lab, "domain": "news", "generator": "g", "method": "m0",
             "setting": "", "defense": "none", "condition": "m0", "candidate_rank": 0, "text_out": text(i), "valid": True,
             "fail_reason": ""} for i, lab in enumerate(["human", "ai", "ai"])]
    write_jsonl(out / "raw_outputs.jsonl", rows)
    fakes["sapling"].plan = {text(2): ["500", "500", "500"]}
    base = server.url_for("/").rstrip("/")
    cfg = {**cfg_for(server, "sapling"), "out_dir": str(out), "detectors": ["sapling", "winston_ai"]}
    cfg["api"]["base_url"] = {"sapling": base, "winston_ai": base}
    scores = run_detectors_stage(cfg, Cache(tmp_path / "store"))
    assert len(scores) == 6 and set(scores["detector_family"]) == {"commercial"}
    w = scores[scores["detector_name"] == "winston_ai"].set_index("sample_id").loc[["s0", "s1", "s2"]]
    assert w["valid"].all() and np.allclose(w["detector_score_ai"], [-expected_raw("winston_ai", text(i)) for i in range(3)])
    bad = scores[(scores["detector_name"] == "sapling") & (scores["sample_id"] == "s2")].iloc[0]
    assert not bad["valid"] and np.isnan(bad["detector_score_raw"]) and bad["fail_reason"]   # kept and marked
    assert "HTTP 500 after 3 attempts" in bad["fail_reason"], bad["fail_reason"]             # with its own reason
    assert not any(KEY in p.read_bytes().decode("utf-8", "replace") for p in tmp_path.rglob("*") if p.is_file())


def test_listing_the_api_detectors_imports_no_http_library():
    "Registering the five costs no import of httpx or tenacity: a client is made only when a detector runs."
    import subprocess, sys
    code = "import sys, stealth_eval.api_detectors; print('httpx' in sys.modules or 'tenacity' in sys.modules)"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.stdout.strip() == "False", p.stderr[-2000:]


def test_a_cli_run_with_two_api_detectors_tables_and_plots_them_like_a_local_one_and_stores_no_key(server, tmp_path, monkeypatch):
    """#27 "Done means": the whole pipeline through the command line (tiny profile, M0, 6 texts a class) with one local
    detector and two API detectors answered by the loopback server: each API detector is in metrics, tables and figures
    where the local one is, and no file of the run folder or of the cache holds the key."""
    import pandas as pd
    from conftest import run_cli
    from stealth_eval.figures import heatmap_data, results_frame
    fakes = {n: FakeProvider(n, server) for n in ("sapling", "pangram")}
    for n in fakes: monkeypatch.setenv(DETS[n].key_env, KEY)
    base = server.url_for("/").rstrip("/")
    monkeypatch.setenv("PANGRAM_BASE_URL", base)                       # one endpoint from the environment, one from a setting
    out, store = tmp_path / "run", tmp_path / "store"
    data = tmp_path / "news.jsonl"          # texts given, none generated: the run's cost is the detectors'
    words = "the a of to and in is was for on that with as by at from it he said has be are were its new police".split()
    data.write_text("".join(json.dumps({"id": f"{lab[0]}{i}", "label": lab, "domain": "news", "generator": "human" if lab == "human" else "g",
                                        "text": " ".join(words[(i * 7 + j * (3 if lab == "ai" else 5)) % len(words)] for j in range(40 + 9 * i))}) + "\n"
                                for lab in ("human", "ai") for i in range(6)), encoding="utf-8")
    dets = ["log_likelihood", "sapling", "pangram"]
    p = run_cli("--profile", "tiny", "--datasets", data, "--methods", "m0", "--detectors", *dets,
                "--set", "n_bootstrap=50", "sanitize=[]", "scoring_model=smollm2-135m-instruct", "quality_lm=smollm2-135m-instruct",
                f"api.base_url.sapling={base}", "--offline", "--out_dir", out, "--cache_dir", store, timeout=600)
    assert KEY not in p.stdout + p.stderr
    n_texts = len({t for f in fakes.values() for t in f.calls})
    assert n_texts > 0 and all(len(f.calls) == len(set(f.calls)) for f in fakes.values())   # one call per text
    s = pd.read_parquet(out / "scores.parquet")
    assert set(s["detector_name"]) == set(dets) and s.groupby("detector_name").size().nunique() == 1
    api = s[s["detector_name"] != "log_likelihood"]
    assert api["valid"].all() and set(api["detector_family"]) == {"commercial"}
    for n in fakes:
        got = s[s["detector_name"] == n].set_index("text_out")["detector_score_raw"]
        assert got.to_dict() == pytest.approx({t: expected_raw(n, t) for t in got.index})
    m = json.loads((out / "metrics.json").read_text())["news"]
    assert set(dets) <= set(m) and all(set(m[d]) == set(m["log_likelihood"]) for d in dets)
    assert all(set(m[d]["m0"]) == set(m["log_likelihood"]["m0"]) for d in dets)
    mp = pd.read_parquet(out / "metrics.parquet")
    mp = mp[mp["metric"] != "probability:folds"]   # a fitted calibrator's folds: a provider's own probability has none
    kinds = {d: set(map(tuple, mp.loc[mp["detector"] == d, ["family", "metric", "condition"]].astype(str).to_numpy())) for d in dets}
    assert kinds["sapling"] == kinds["pangram"] == kinds["log_likelihood"] and len(kinds["sapling"]) > 5   # the same results
    for table in sorted((out / "tables").glob("*.md")):
        md = table.read_text(encoding="utf-8")
        if "log_likelihood" in md: assert "sapling" in md and "pangram" in md, table.name
    assert "sapling" in (out / "tables" / "table_main_news.md").read_text(encoding="utf-8")
    figs = sorted(p.name for p in (out / "figures").glob("*.png"))
    assert "fig_heatmap_t1f.png" in figs
    assert set(dets) <= set(heatmap_data(results_frame(mp), "news")[0])   # the heatmap's rows: every detector
    leaks = [str(f) for root in (out, store) for f in root.rglob("*") if f.is_file() and KEY.encode() in f.read_bytes()]
    assert leaks == []
    assert any(f.is_file() for f in store.rglob("*"))                     # the cache was written (and searched)


# ---- #37: scores outside the documented range, the bounded policy, the checks before the run ----------------------

def out_of_range(name):
    "Values that are not a score of provider `name` (its documented range: [0, 1], Winston's human score [0, 100])."
    hi = DETS[name].score_range[1]
    return [7.0 * hi, -1, 1e308, hi + 1e-9, float("nan"), float("inf"), float("-inf"), "0.5", True]


@pytest.mark.parametrize("name", PROVIDERS)
def test_a_score_outside_the_documented_range_marks_its_text(name, server, waits, tmp_path, monkeypatch):
    det, fake = DETS[name], FakeProvider(name, server)
    monkeypatch.setenv(det.key_env, KEY)
    lo, hi = det.score_range
    assert (lo, hi) == ((0.0, 100.0) if name == "winston_ai" else (0.0, 1.0))
    bad = out_of_range(name)
    texts = [text(i) for i in range(len(bad) + 2)]
    fake.plan = {t: [("score", v)] for t, v in zip(texts, bad + [lo, hi])}
    got = det.compute(texts, cfg_for(server, name, breaker_failures=100), Cache(tmp_path / "s"))
    assert [got[sha256_text(t)][det.stat] for t in texts[-2:]] == [lo, hi]          # the bounds are scores
    for t, v in zip(texts, bad):
        why = det.why_none(sha256_text(t))
        assert got[sha256_text(t)] is None, (v, got[sha256_text(t)])
        if isinstance(v, float) and math.isfinite(v) or type(v) is int:
            assert why == f"score {det.stat}={float(v)!r} outside the provider's documented range [{lo:g}, {hi:g}]"
        else:
            assert "lacks a documented field or value (ValueError: not a number" in why, why
    assert len(fake.calls) == len(texts) and ad.API_LEDGER[name]["scored"] == 2
    assert ad.API_LEDGER[name]["spent"] == pytest.approx(sum(fake.billed))             # an answered text is billed


def test_an_out_of_range_score_is_an_invalid_row_with_its_reason(server, waits, tmp_path, monkeypatch):
    from stealth_eval.detectors import run_detectors_stage
    fake = FakeProvider("winston_ai", server)
    monkeypatch.setenv(DETS["winston_ai"].key_env, KEY)
    out = tmp_path / "run"
    rows = [{"sample_id": f"s{i}", "dataset": "toy", "label": lab, "domain": "news", "generator": "g", "method": "m0",
             "setting": "", "defense": "none", "condition": "m0", "candidate_rank": 0, "text_out": text(i), "valid": True,
             "fail_reason": ""} for i, lab in enumerate(["human", "human", "ai"])]
    write_jsonl(out / "raw_outputs.jsonl", rows)
    fake.plan = {text(0): [("score", 150.0)], text(2): [("score", float("nan"))]}
    cfg = {**cfg_for(server, "winston_ai"), "out_dir": str(out), "detectors": ["winston_ai"]}
    s = run_detectors_stage(cfg, Cache(tmp_path / "store")).set_index("sample_id")
    assert s["valid"].to_dict() == {"s0": False, "s1": True, "s2": False}
    assert np.isnan(s.loc[["s0", "s2"], "detector_score_raw"]).all()
    assert s.loc["s0", "fail_reason"] == "score human_score=150.0 outside the provider's documented range [0, 100]"
    assert "not a number: nan" in s.loc["s2", "fail_reason"]


@pytest.mark.parametrize("attempts", [1, 2])
def test_the_circuit_breaker_sends_n_failing_texts_then_no_request(attempts, server, waits, tmp_path, monkeypatch):
    det, fake = DETS["sapling"], FakeProvider("sapling", server)
    monkeypatch.setenv(det.key_env, KEY)
    texts, n = [text(i) for i in range(10)], 4
    fake.fail_after = 0                                                  # 502 for ever
    t0 = time.monotonic()
    got = det.compute(texts, cfg_for(server, "sapling", max_attempts=attempts, breaker_failures=n), Cache(tmp_path / "s"))
    assert len(fake.calls) == n * attempts == ad.API_LEDGER["sapling"]["calls"]    # counted on the server
    assert fake.calls == [t for t in texts[:n] for _ in range(attempts)] and all(v is None for v in got.values())
    last = f"HTTP 502 after {attempts} attempts"
    assert [det.why_none(sha256_text(t)) for t in texts[:n]] == [last] * n
    stopped = f"{n} consecutive texts without a score, api.breaker_failures = {n}; the last: {last}"
    assert ad.API_LEDGER["sapling"]["stopped"] == stopped
    assert all(det.why_none(sha256_text(t)) == f"not sent: sapling was given up ({stopped})" for t in texts[n:])
    assert time.monotonic() - t0 < 3


def test_a_scored_text_resets_the_breaker_and_a_rerun_sends_the_rest(server, waits, tmp_path, monkeypatch):
    det, fake = DETS["pangram"], FakeProvider("pangram", server)
    monkeypatch.setenv(det.key_env, KEY)
    texts = [text(i) for i in range(9)]
    fake.plan = {t: ["500", "500"] for t in texts[:2] + texts[3:6]}     # fail, fail, ok, fail x3: open
    cfg, cache = cfg_for(server, "pangram", max_attempts=2, breaker_failures=3), Cache(tmp_path / "s")
    got = det.compute(texts, cfg, cache)
    assert fake.calls == [texts[0]] * 2 + [texts[1]] * 2 + [texts[2]] + [t for t in texts[3:6] for _ in range(2)]
    assert [got[sha256_text(t)] is not None for t in texts] == [False, False, True] + [False] * 6
    assert all(det.why_none(sha256_text(t)).startswith("not sent: pangram was given up (3 consecutive") for t in texts[6:])
    fake.calls.clear()
    again = det.compute(texts, cfg, cache)                               # the provider is back: the rest is sent once
    assert sorted(fake.calls) == sorted(texts[:2] + texts[3:]) and all(v is not None for v in again.values())


def test_a_retry_after_of_an_hour_gives_the_provider_up_after_one_request(server, waits, tmp_path, monkeypatch):
    det, fake = DETS["gptzero"], FakeProvider("gptzero", server)
    monkeypatch.setenv(det.key_env, KEY)
    texts, fake.retry_after = [text(i) for i in range(6)], "3600"
    fake.plan = {t: ["429"] * 9 for t in texts}
    t0 = time.monotonic()
    got = det.compute(texts, cfg_for(server, "gptzero", max_attempts=5), Cache(tmp_path / "s"))
    why = "HTTP 429 asked to retry after 3600 s, over api.retry_after_max_s = 60 s"
    assert len(fake.calls) == 1 and waits == [] and time.monotonic() - t0 < 2 and all(v is None for v in got.values())
    assert det.why_none(sha256_text(texts[0])) == why
    assert all(det.why_none(sha256_text(t)) == f"not sent: gptzero was given up ({why})" for t in texts[1:])


def test_a_retry_after_holds_the_next_text_too(server, waits, tmp_path, monkeypatch):
    det, fake = DETS["gptzero"], FakeProvider("gptzero", server)
    monkeypatch.setenv(det.key_env, KEY)
    texts = [text(i) for i in range(3)]
    fake.plan = {texts[0]: ["429"]}                                      # Retry-After: 2 on its only try
    got = det.compute(texts, cfg_for(server, "gptzero", max_attempts=1), Cache(tmp_path / "s"))
    assert det.why_none(sha256_text(texts[0])) == "HTTP 429 after 1 attempts" and waits == [pytest.approx(2.0, abs=0.05)]
    assert fake.calls == texts and all(got[sha256_text(t)] is not None for t in texts[1:])


def test_a_server_that_never_answers_costs_a_text_its_budget_then_trips_the_breaker(server, waits, tmp_path, monkeypatch):
    det, fake = DETS["sapling"], FakeProvider("sapling", server)
    monkeypatch.setenv(det.key_env, KEY)
    texts = [text(i) for i in range(8)]
    fake.plan = {t: ["stall"] * 9 for t in texts}
    cfg = cfg_for(server, "sapling", timeout_s=0.2, max_attempts=5, backoff_s=0.05, text_budget_s=0.5, breaker_failures=2)
    t0 = time.monotonic()
    try: got = det.compute(texts, cfg, Cache(tmp_path / "s"))
    finally: fake.release.set()
    took = time.monotonic() - t0
    assert took < 2.0, took                                  # two texts of at most 0.5 s (before: 5 tries of 30 s per text)
    assert set(fake.calls) == set(texts[:2]) and len(fake.calls) <= 2 * 3 and all(v is None for v in got.values())
    for t in texts[:2]: assert det.why_none(sha256_text(t)).startswith("no answer within api.text_budget_s = 0.5 s (")
    assert all(det.why_none(sha256_text(t)).startswith("not sent: sapling was given up (2 consecutive") for t in texts[2:])


def test_a_server_that_trickles_its_answer_is_cut_at_the_text_budget(server, waits, tmp_path, monkeypatch):
    det, fake = DETS["pangram"], FakeProvider("pangram", server)
    monkeypatch.setenv(det.key_env, KEY)
    t = text(1)
    fake.plan = {t: ["trickle"] * 3}
    t0 = time.monotonic()
    try: got = det.compute([t], cfg_for(server, "pangram", timeout_s=0.3, text_budget_s=0.6), Cache(tmp_path / "s"))
    finally: fake.release.set()
    assert time.monotonic() - t0 < 1.5 and got[sha256_text(t)] is None and len(fake.calls) == 1
    assert det.why_none(sha256_text(t)) == ("no answer within api.text_budget_s = 0.6 s (1 attempts, the last: the "
                                            "response was still arriving when the text's time ran out)")


def test_the_deadline_ends_a_slow_provider_and_marks_the_rest(server, clock, tmp_path, monkeypatch):
    det, fake = DETS["originality_ai"], FakeProvider("originality_ai", server)
    monkeypatch.setenv(det.key_env, KEY)
    texts = [text(i) for i in range(8)]
    fake.clock, fake.took = clock, 100.0                                 # each answer takes 100 s (of the client's clock)
    fake.plan = {texts[2]: ["500", "500"]}
    got = det.compute(texts, cfg_for(server, "originality_ai", deadline_s=250), Cache(tmp_path / "s"))
    assert fake.calls == texts[:3] and [got[sha256_text(t)] is not None for t in texts[:3]] == [True, True, False]
    deadline = "the deadline api.deadline_s = 250 s passed"
    assert det.why_none(sha256_text(texts[2])) == f"{deadline} (1 attempts, the last: HTTP 500)"
    assert all(det.why_none(sha256_text(t)) == f"not sent: originality_ai was given up ({deadline})" for t in texts[3:])
    assert ad.API_LEDGER["originality_ai"]["stopped"] == deadline


def test_a_negative_or_huge_charge_never_lifts_the_spend_limit(server, waits, tmp_path, monkeypatch):
    det, fake = DETS["winston_ai"], FakeProvider("winston_ai", server)
    monkeypatch.setenv(det.key_env, KEY)
    texts = [text(i) for i in range(3)]
    charges = iter([-10**9, float("inf"), 5])                            # as the provider reports them
    monkeypatch.setattr(ad.WinstonAI, "charged", lambda self, t, r: next(charges))
    det.compute(texts, cfg_for(server, "winston_ai"), Cache(tmp_path / "s"))
    words = [len(t.split()) for t in texts]                             # the estimate, where the report is unusable
    assert ad.API_LEDGER["winston_ai"]["spent"] == words[0] + words[1] + 5


@pytest.mark.parametrize("item,says", [
    ("api.spend_limit.sapling=0", "api.spend_limit.sapling=0: must be > 0, got 0"),
    ("api.spend_limit.sapling=-5", "api.spend_limit.sapling=-5: must be > 0"),
    ("api.spend_limit=0", "api.spend_limit=0: expects a section"),
    ("api.base_url.sapling=ftp://x", "api.base_url.sapling=ftp://x: not an http(s) URL (scheme 'ftp')"),
    ("api.base_url.sapling=localhost:8080", "not an http(s) URL (scheme 'localhost')"),
    ("api.base_url.sapling=api.sapling.ai", "not an http(s) URL (no scheme)"),
    ("api.base_url.sapling=http://", "api.base_url.sapling=http://: names no host"),
    ("api.base_url.sapling=https://me:pw@h", "holds credentials"),
    ("api.base_url.sapling=http://h:99999", "not a URL"),
    ("api.timeout_s=0", "api.timeout_s=0: must be > 0"),
    ("api.text_budget_s=0", "api.text_budget_s=0: must be > 0"),
    ("api.deadline_s=-1", "api.deadline_s=-1: must be > 0"),
    ("api.breaker_failures=0", "api.breaker_failures=0: must be a positive count"),
    ("api.retry_after_max_s=-1", "api.retry_after_max_s=-1: must not be negative"),
    ("api.max_attempts=0", "api.max_attempts=0: must be a positive count"),
    ("api.retry_forever=1", "api.retry_forever: unknown key"),
])
def test_every_api_setting_is_refused_in_one_line_before_the_run(item, says):
    from stealth_eval.config import parse_set, resolve_config
    with pytest.raises(StealthEvalError) as e:
        resolve_config("tiny", detectors=["log_rank", "sapling"], overrides=parse_set([item]))
    assert says in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_the_defaults_bound_a_dead_provider(monkeypatch):
    "What the defaults cost at most: a text its budget, a provider N of them (then none), a stage the deadline."
    s = ad.api_settings({})
    assert (s["timeout_s"], s["max_attempts"], s["text_budget_s"], s["retry_after_max_s"]) == (30.0, 5, 120.0, 60.0)
    assert s["breaker_failures"] * s["text_budget_s"] <= 600 and s["deadline_s"] == 12 * 3600
    from stealth_eval.config import resolve_config
    assert resolve_config("tiny").api.to_dict() == s                  # one set of defaults: the schema's


def test_check_api_refuses_a_base_url_from_the_environment_and_a_panel_without_keys(monkeypatch):
    from stealth_eval.config import resolve_config
    for d in DETS.values():
        monkeypatch.delenv(d.key_env, raising=False); monkeypatch.delenv(d.key_env.replace("_API_KEY", "_BASE_URL"), raising=False)
    ad.check_api(resolve_config("tiny", detectors=["log_rank", "sapling"]))        # sapling is skipped, log_rank scores
    for dets in (["sapling"], ["sapling", "pangram"]):
        with pytest.raises(StealthEvalError, match="^no detector of the run can score: sapling: no API key: set the "
                                                   "environment variable SAPLING_API_KEY"):
            ad.check_api(resolve_config("tiny", detectors=dets))
    monkeypatch.setenv("PANGRAM_API_KEY", KEY)
    ad.check_api(resolve_config("tiny", detectors=["sapling", "pangram"]))
    for bad in ("text.api.pangram.com", "ftp://h", "http://", "https://u:p@h"):
        monkeypatch.setenv("PANGRAM_BASE_URL", bad)
        with pytest.raises(StealthEvalError, match=f"^pangram: PANGRAM_BASE_URL={bad}: "):
            ad.check_api(resolve_config("tiny", detectors=["log_rank", "pangram"]))
    ad.check_api(resolve_config("tiny", detectors=["log_rank", "pangram"],            # the setting comes first
                                overrides={"api.base_url.pangram": "http://127.0.0.1:9"}))


@pytest.mark.parametrize("case", ["no key", "env url", "spend 0"])
def test_the_command_line_refuses_api_problems_before_any_stage_with_exit_2(case, tmp_path, monkeypatch):
    from conftest import run_cli
    for d in DETS.values():
        monkeypatch.delenv(d.key_env, raising=False); monkeypatch.delenv(d.key_env.replace("_API_KEY", "_BASE_URL"), raising=False)
    args, says = {"no key": (["--detectors", "gptzero"], "no detector of the run can score: gptzero: no API key"),
                  "env url": (["--detectors", "log_rank", "sapling"], "sapling: SAPLING_BASE_URL=127.0.0.1:8080: not an http(s) URL"),
                  "spend 0": (["--detectors", "log_rank", "sapling", "--set", "api.spend_limit.sapling=0"],
                              "api.spend_limit.sapling=0: must be > 0")}[case]
    if case == "env url": monkeypatch.setenv("SAPLING_BASE_URL", "127.0.0.1:8080")
    p = run_cli("--profile", "tiny", *args, "--out_dir", tmp_path / "run", check=False, timeout=120)
    err = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(err) == 1 and err[0].startswith("stealth-eval: error: ") and says in err[0], p.stderr
    assert not (tmp_path / "run" / "notebooks").exists()               # no stage ran
