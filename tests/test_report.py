"""The report site of a real tiny run, opened in headless Chromium; the figure functions on synthetic metrics."""
import io
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import numpy as np
import pandas as pd
import pytest

from conftest import ROOT, read_json

from stealth_eval import figures as F
from stealth_eval import metrics as M
from stealth_eval.report import build_site, explorer_data, find_chromium, screenshot


# ---------------------------------------------------------------- the site of a real run, in Chromium

class _Targets(HTMLParser):
    "Every src/href of a page (the test's own parser, independent of report.missing_resources)."
    def __init__(self):
        super().__init__()
        self.found = []

    def handle_starttag(self, tag, attrs):
        self.found += [(tag, v) for k, v in attrs if k in ("src", "href") and v]


def _local_missing(page: Path) -> list:
    p = _Targets()
    p.feed(page.read_text(encoding="utf-8"))
    local = [v for _, v in p.found if not re.match(r"^([a-z][a-z0-9+.-]*:|#|//)", v, re.I)]
    return [v for v in local if not (page.parent / unquote(urlsplit(v).path)).is_file()]


@pytest.fixture(scope="module")
def site(tiny_run):
    out = Path(tiny_run["out"])
    p = subprocess.run([sys.executable, "-m", "stealth_eval.run", "report", "--out_dir", str(out)], cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "wrote" in p.stdout
    return out, out / "site"


def test_site_pages_and_resources(site):
    out, s = site
    pages = sorted(x.name for x in s.glob("*.html"))
    executed = sorted(x.stem + ".html" for x in (out / "notebooks").glob("*.ipynb"))
    assert len(executed) == 5 and set(executed) <= set(pages)
    assert {"index.html", "examples.html"} <= set(pages)
    for pg in s.glob("*.html"):
        text = pg.read_text(encoding="utf-8")
        assert _local_missing(pg) == [], pg.name
        assert "cdnjs.cloudflare.com" not in text, f"{pg.name} loads a script from the network"
        for other in pages:                                   # the navigation bar links every page
            assert f'href="{other}"' in text, f"{pg.name} does not link {other}"
    index = (s / "index.html").read_text(encoding="utf-8")
    figs = sorted(p.name for p in (out / "figures").glob("fig_*.png") if p.name != "fig_heatmap_t1f_lee_news.png")
    assert "fig_heatmap_t1f.png" in figs and "fig_roc_lee_news.png" in figs
    for f in figs:
        assert f'src="figures/{f}"' in index, f
        assert (s / "figures" / f).read_bytes() == (out / "figures" / f).read_bytes()
    for t in (out / "tables").glob("*.md"):
        assert f"<h3>{t.name}" in index
    assert "<table>" in index and '<th style="text-align:left">Method</th>' in index   # Markdown tables rendered as HTML
    notes = read_json(out / "figures_notes.json")["not_written"]
    assert "figures/fig_budget_sweep.png" in notes                    # the tiny profile has one budget
    assert notes["figures/fig_budget_sweep.png"] in index             # ... and the report says why
    m = read_json(out / "metrics.json")["lee_news"]["mean"]["m0"]
    assert f"TPR {m['tpr1']:.3f}" in index                            # the headline, from metrics.json


def test_site_screenshot(site):
    out, s = site
    chromium = find_chromium()
    if not chromium:
        pytest.skip("no Chromium found: install Debian's `chromium` (`make test` does when apt-get is available) "
                    "or set $STEALTH_EVAL_CHROMIUM")
    png = screenshot(s / "index.html", out / "site_screenshot_tmp.png", chromium=chromium, size=(1280, 2400))
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    w, h = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (w, h) == (1280, 2400)
    assert len(data) > 100_000, "the screenshot is nearly empty"      # text, tables and figures, not a blank page
    from PIL import Image
    px = np.asarray(Image.open(png).convert("RGB"), dtype=np.int16)
    assert px.reshape(-1, 3).std(0).mean() > 20                       # not one flat colour
    assert (np.abs(np.diff(px[:, :, 1], axis=1)) > 30).mean() > 0.003  # edges: text and plots were drawn
    shutil.copy2(png, s / "screenshot.png")
    png.unlink()
    assert (s / "screenshot.png").stat().st_size == len(data)
    for pg in ("40_figures.html", "examples.html"):                   # the other pages render too
        shot = screenshot(s / pg, out / f"shot_{pg}.png", chromium=chromium, size=(1280, 900))
        assert shot.stat().st_size > 20_000
        shot.unlink()


def test_explorer_matches_metrics(tiny_run):
    out = Path(tiny_run["out"])
    met = read_json(out / "metrics.json")["lee_news"]
    for det, cond in [("fast_detectgpt", "m0"), ("log_rank", "m5:homoglyph_p=0.02"), ("binoculars_single", "m0+sanitize")]:
        d = explorer_data(out, "lee_news", det, cond)
        assert d["tpr_at_threshold"] == pytest.approx(met[det][cond]["tpr1"])
        assert d["fpr_at_threshold"] == pytest.approx(met[det][cond]["fpr1_human"])
        assert np.trapezoid(d["tpr"], d["fpr"]) == pytest.approx(met[det][cond]["auc"], abs=1e-12)
        assert 1 <= len(d["examples"]) <= 4
        assert all(e["flagged"] == (e["score"] >= d["threshold"]) for e in d["examples"])


# ---------------------------------------------------------------- figure functions on synthetic metrics

def _metrics(tprs: dict, dets=("fast_detectgpt", "roberta_openai", "log_rank"), ds="mage") -> dict:
    "metrics.json-shaped: condition -> per-detector TPR list; the mean entry is their mean."
    m = {ds: {d: {} for d in dets}}
    m[ds]["mean"] = {}
    for c, vals in tprs.items():
        defense = F.split_condition(c)[2] or "none"
        for d, v in zip(dets, vals):
            m[ds][d][c] = {"label": "ai", "defense": defense, "auc": 0.5 + v / 2, "auc_mean": 0.5 + v / 2, "auc_ci_low": 0.4,
                           "auc_ci_high": 0.9, "tpr1": v, "tpr1_mean": v, "tpr1_ci_low": max(v - 0.1, 0), "tpr1_ci_high": min(v + 0.1, 1),
                           "asr": 1 - v, "n_ai": 100, "n_ai_invalid": 0}
        t = float(np.mean(vals))
        m[ds]["mean"][c] = {"label": "ai", "defense": defense, "auc": 0.5 + t / 2, "tpr1": t, "tpr1_mean": t, "tpr1_ci_low": t - 0.05,
                            "tpr1_ci_high": t + 0.05, "asr": 1 - t}
    return m


def _results(m: dict, thresholds: dict | None = None):
    """`m` as the figures read it: written by the metrics stage's writer (`metrics_long`, with each condition's parts and
    a threshold per detector), through Parquet, loaded by `results_frame`."""
    facts = pd.DataFrame([{"dataset": ds, "condition": c, "method": me, "setting": s, "defense": d or "none"}
                          for ds, dd in m.items() for cc in dd.values() for c in cc for me, s, d in [F.split_condition(c)]])
    cal = {"threshold": 0.5, "fpr_target": 0.01, "fpr_achieved": 0.01, "n_human": 100, "n_human_invalid": 0, "note": ""}
    thr = thresholds or {ds: {d: {"none": {"fpr=0.01": cal}} for d in dd if d != "mean"} for ds, dd in m.items()}
    buf = io.BytesIO()
    M.metrics_long(facts, m, thr).to_parquet(buf, index=False)
    return F.results_frame(pd.read_parquet(buf))


SYN = _metrics({"m0": [0.9, 0.95, 0.7], "m1:N=1": [0.6, 0.7, 0.5], "m1:N=2": [0.5, 0.6, 0.4], "m1:N=4": [0.3, 0.5, 0.2],
                "m3:guide=fast_detectgpt,N=4": [0.05, 0.6, 0.3], "m3:guide=fast_detectgpt,N=8": [0.02, 0.55, 0.25],
                "m3:guide=roberta_openai,N=4": [0.5, 0.03, 0.4], "m3:guide=ensemble,N=8": [0.1, 0.1, 0.1],
                "shield:strategy=random,p=0.05,infill=causal_lm": [0.8, 0.9, 0.6],
                "shield:strategy=random,p=0.1,infill=causal_lm": [0.6, 0.8, 0.4],
                "shield:strategy=ai_swap,p=0.05,infill=causal_lm": [0.7, 0.7, 0.5],
                "shield:strategy=recursive,rounds=1": [0.7, 0.8, 0.6], "shield:strategy=recursive,rounds=3": [0.4, 0.5, 0.3]})
SYN["mage"]["fast_detectgpt"]["polish:polish=degree,level=minor"] = {"label": "human", "defense": "none", "flag_rate1": 0.2}
SYN_R = _results(SYN)
QUAL = {"mage": {"m0": {"sim_median": 1.0}, "m1:N=1": {"sim_median": 0.95}, "m1:N=2": {"sim_median": 0.94},
                 "m1:N=4": {"sim_median": 0.92}, "m3:guide=fast_detectgpt,N=4": {"sim_median": 0.9},
                 "m3:guide=fast_detectgpt,N=8": {"sim_median": 0.88}, "m3:guide=ensemble,N=8": {"sim_median": 0.97}}}


def test_parse_setting_and_labels():
    assert F.parse_setting("guide=fast_detectgpt,N=8") == {"guide": "fast_detectgpt", "N": 8}
    assert F.parse_setting("strategy=ai_swap,p=0.05,infill=causal_lm") == {"strategy": "ai_swap", "p": 0.05, "infill": "causal_lm"}
    assert F.short_label("m3", F.parse_setting("guide=roberta_openai,N=4")) == "M3 g=RoBERTa N=4"
    assert F.short_label("shield", F.parse_setting("strategy=recursive,rounds=3")) == "SHIELD recursive rounds=3"
    assert F.short_label("m5", F.parse_setting("homoglyph_p=0.01"), "sanitize") == "M5 p=1% +san"
    r = _results(_metrics({"m3:guide=roberta_openai,N=4": [0.5] * 3, "m5:homoglyph_p=0.01+sanitize": [0.5] * 3}))
    c = F.conditions(r)                                                  # the loaded table carries the labels and typed fields
    assert list(c["short"]) == ["M3 g=RoBERTa N=4", "M5 p=1% +san"] and list(c["setting.N"].fillna(0)) == [4, 0]


def test_budget_sweep(tmp_path):
    path = tmp_path / "fig_budget_sweep.png"
    data = F.plot_budget_sweep(SYN_R, QUAL, path)
    assert path.stat().st_size > 20_000
    series = {s["label"]: s for s in data["mage"]}
    assert set(series) == {"M1", "M3 g=FDG", "M3 g=RoBERTa", "M3 g=ens"}
    assert series["M1"]["N"] == [1, 2, 4]
    assert series["M1"]["tpr"] == pytest.approx([0.6, 0.5, 1 / 3])
    assert series["M1"]["sim"] == pytest.approx([0.95, 0.94, 0.92])
    assert series["M3 g=FDG"]["N"] == [4, 8] and series["M3 g=FDG"]["tpr_lo"] == pytest.approx([0.3167 - 0.05, 0.2733 - 0.05], abs=1e-3)
    assert np.isnan(series["M3 g=RoBERTa"]["sim"][0])                 # no quality entry: NaN, not invented
    one = _results(_metrics({"m0": [0.9, 0.9, 0.9], "m1:N=4": [0.5, 0.5, 0.5]}))
    assert F.plot_budget_sweep(one, QUAL, tmp_path / "none.png") == {} and not (tmp_path / "none.png").exists()


def test_tradeoff(tmp_path):
    path = tmp_path / "fig_tradeoff.png"
    data = F.plot_tradeoff(SYN_R, QUAL, path)
    assert path.stat().st_size > 20_000
    pts = {p["condition"]: p for p in data["mage"]}
    assert set(pts) == set(QUAL["mage"])                               # only conditions with a similarity
    assert pts["m1:N=4"]["tpr"] == pytest.approx(1 / 3) and pts["m1:N=4"]["sim"] == 0.92
    # ensemble N=8 (sim 0.97, tpr 0.1) dominates every point with lower similarity; M0 (sim 1) is not dominated
    assert {c for c, p in pts.items() if p["pareto"]} == {"m0", "m3:guide=ensemble,N=8"}


def test_shield(tmp_path):
    path = tmp_path / "fig_shield.png"
    data = F.plot_shield(SYN_R, path)
    assert path.stat().st_size > 20_000
    d = data["mage"]
    assert list(d) == ["ai_swap", "random", "recursive"]
    assert d["random"]["knob"] == "p" and d["recursive"]["knob"] == "rounds"
    r = d["random"]["series"]["infill=causal_lm"]
    assert r["x"] == [0, 0.05, 0.1] and r["conditions"][0] == "m0"
    assert r["tpr"] == pytest.approx([np.mean([0.9, 0.95, 0.7]), np.mean([0.8, 0.9, 0.6]), np.mean([0.6, 0.8, 0.4])])
    assert d["recursive"]["series"][""]["per_detector"]["log_rank"] == pytest.approx([0.7, 0.6, 0.3])
    assert F.plot_shield(_results(_metrics({"m0": [0.9, 0.9, 0.9]})), tmp_path / "none.png") == {}


def md_rows(md: str) -> list:
    "The stripped cells of every markdown table row (pandas pads cells to the column width)."
    return [[c.strip() for c in l.strip().strip("|").split("|")] for l in md.splitlines() if l.startswith("|") and not set(l) <= set("|:- ")]


def test_transfer_table():
    td = F.transfer_data(SYN_R, "mage")
    assert td["detectors"] == ["fast_detectgpt", "roberta_openai", "log_rank"]
    rows = {r["condition"]: r for r in td["rows"]}
    assert list(rows)[0] == "m0" and len(rows) == 5
    r = rows["m3:guide=fast_detectgpt,N=8"]
    assert r["tpr"]["fast_detectgpt"] == 0.02 and r["heldout_mean"] == pytest.approx((0.55 + 0.25) / 2)
    assert np.isnan(rows["m3:guide=ensemble,N=8"]["heldout_mean"])
    md = F.transfer_table(SYN_R)
    assert ["fast_detectgpt", "8", "**0.020**", "0.550", "0.250", "0.273", "0.400"] in md_rows(md)
    assert ["roberta_openai", "4", "0.500", "**0.030**", "0.400"] in [r[:5] for r in md_rows(md)]
    assert F.transfer_table(_results(_metrics({"m0": [0.9, 0.9, 0.9], "m1:N=1": [0.5, 0.5, 0.5]}))) == ""


def test_main_table_footnotes_skipped():
    thr = {"mage": {d: {"none": {"fpr=0.01": {"threshold": 1.0, "fpr_target": 0.01, "n_human": 200, "fpr_achieved": 0.01, "note": ""}}}
                    for d in ("fast_detectgpt", "roberta_openai", "log_rank")}}
    md, tex = F.main_table(_results(SYN, thr), "mage", skipped={"binoculars": "falcon-7b not in the hub cache"},
                           skipped_methods={"m4": "authormist unreachable offline"})
    assert "binoculars: falcon-7b not in the hub cache" in md and "m4: authormist unreachable offline" in md
    assert "POLISH" not in md                                          # human-text conditions are not attacks
    assert ["M1 N=4", "0.650", "0.300", "0.700"] in [r[:4] for r in md_rows(md)]
    assert "fast_detectgpt: threshold 1 from 200 human texts (achieved FPR 0.010)" in md    # the calibration rows of the table
    assert "- M1 N=4 / fast_detectgpt: AUC [0.400, 0.900], TPR [0.200, 0.400], n_ai=100 (invalid 0)" in md
