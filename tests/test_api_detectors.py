"""The API detectors against a real HTTP server on the loopback that speaks each provider's documented shapes.

Every case ends with each text scored or marked with a reason, an exact spend counter, and the cache: a rerun pays
nothing, a killed run resumes with the texts it had not scored. Waits are recorded, not slept (`api_detectors._sleep`);
timeouts are real (a handler slower than `api.timeout_s`).
"""
import json
import logging
import math
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


class FakeProvider:
    """One provider on the loopback: checks its documented auth, records every request, and answers each text by a
    per-text script of behaviours ('429', '503', '500', 'timeout', 'malformed', 'nofield'), then with 'ok'."""
    def __init__(self, name, server, slow_s=0.5):
        self.name, self.calls, self.plan, self.billed, self.slow_s = name, [], {}, [], slow_s
        self.fail_after = None
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
        if not self.authorized(req, body):
            return Response(json.dumps({"error": "Invalid API key"}), 401, content_type="application/json")
        if self.fail_after is not None and len(self.calls) > self.fail_after:
            return Response("upstream down", 502)
        steps = self.plan.get(t) or []
        act = steps.pop(0) if steps else "ok"
        if act == "429": return Response("slow down", 429, headers={"Retry-After": "2"})
        if act in ("500", "503"): return Response("oops", int(act))
        if act == "timeout":   # answers after the client gave up: not billed (the client never saw it)
            time.sleep(self.slow_s)
            return Response(json.dumps(documented(self.name, t)[0]), 200, content_type="application/json")
        if act == "malformed":
            self.billed.append(DETS[self.name].cost(t))
            return Response('{"score": 0.5, ', 200, content_type="application/json")
        resp, units = documented(self.name, t)
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


@pytest.fixture
def waits(monkeypatch):
    got = []
    monkeypatch.setattr(ad, "_sleep", got.append)
    return got


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
