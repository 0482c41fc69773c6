"""The figures as printed: one column (3.3 in) or two (7 in) wide, no font under 7 pt, nothing cut off by the canvas,
no two texts on top of each other, one colour per method across figures, and a theme that does not leak."""
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
import pytest
from matplotlib.colors import to_hex
from matplotlib.figure import Figure
from matplotlib.text import Annotation, Text
from PIL import Image

from stealth_eval import figures as F
from test_report import QUAL, SYN, SYN_R, _metrics, _results


def _overlap(a, b, tol=1.0) -> bool:
    return min(a.x1, b.x1) - max(a.x0, b.x0) > tol and min(a.y1, b.y1) - max(a.y0, b.y0) > tol


def print_facts(fig) -> dict:
    "What a reader of the printed figure meets: its size, its smallest font, texts that leave the canvas or overlap."
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    shown = lambda t: t.get_visible() and t.get_text().strip()
    box = lambda t: F._text_box(t, r) if isinstance(t, Annotation) else t.get_window_extent(r)
    boxes = []                                                   # (what, bbox, may be checked for overlap)
    for k, ax in enumerate(fig.axes):
        if not ax.get_visible() or not ax.axison: continue
        for what, t in [("title", ax.title), ("xlabel", ax.xaxis.label), ("ylabel", ax.yaxis.label)] + [("text", t) for t in ax.texts]:
            if shown(t): boxes.append((f"ax{k} {what} {t.get_text()!r}", box(t), True))
        for axis, lim, i in ((ax.xaxis, ax.get_xlim(), 0), (ax.yaxis, ax.get_ylim(), 1)):
            lo, hi = sorted(lim)
            for t in axis.get_majorticklabels():
                if shown(t) and lo <= t.get_position()[i] <= hi:   # a label of a tick in view
                    boxes.append((f"ax{k} tick {t.get_text()!r}", box(t), t.get_rotation() % 180 == 0))
        if ax.get_legend(): boxes.append((f"ax{k} legend", ax.get_legend().get_window_extent(r), True))
    boxes += [(f"figure legend {i}", lg.get_window_extent(r), True) for i, lg in enumerate(fig.legends)]
    boxes += [(f"figure {t.get_text()!r}", t.get_window_extent(r), True) for t in (fig._suptitle, fig._supxlabel, fig._supylabel) if t and shown(t)]
    boxes += [(f"figure text {t.get_text()!r}", t.get_window_extent(r), True) for t in fig.texts   # a diagonal watermark may be cut
              if shown(t) and t.get_rotation() % 180 == 0 and t not in (fig._suptitle, fig._supxlabel, fig._supylabel)]
    c = fig.bbox
    outside = [w for w, b, _ in boxes if b.x0 < c.x0 - 1 or b.y0 < c.y0 - 1 or b.x1 > c.x1 + 1 or b.y1 > c.y1 + 1]
    flat = [(w, b) for w, b, ok in boxes if ok]
    overlaps = [(w1, w2) for i, (w1, b1) in enumerate(flat) for w2, b2 in flat[i + 1:] if _overlap(b1, b2)]
    colours = {}
    for lg in fig.legends:
        for t, h in zip(lg.get_texts(), lg.legend_handles):
            if hasattr(h, "get_color"): colours[t.get_text()] = to_hex(h.get_color())
    return {"size": tuple(fig.get_size_inches().round(2)), "min_pt": min(t.get_fontsize() for t in fig.findobj(Text) if shown(t)),
            "outside": outside, "overlaps": overlaps, "legend_colours": colours, "texts": [t.get_text() for ax in fig.axes for t in ax.texts],
            "figure_texts": [t.get_text() for t in fig.texts]}


@pytest.fixture
def facts(monkeypatch):
    "{file name: print_facts} of every figure written while the test runs (as saved: with a rehearsal's marks)."
    seen, save = {}, Figure.savefig
    def spy(fig, path, **kw):
        seen[Path(path).name] = print_facts(fig)
        return save(fig, path, **kw)
    monkeypatch.setattr(Figure, "savefig", spy)
    return seen


def _roc_scores(r, ds="mage", n=40, seed=0):
    "scores.parquet-shaped rows: human texts (M0) and AI texts of M0 and the strongest attack, for every detector of `r` (`results_frame`)."
    rng, rows = np.random.default_rng(seed), []
    dets = F.detectors(r, ds)
    for d in dets:
        rows += [{"dataset": ds, "candidate_rank": 0, "defense": "none", "label": "human", "condition": "m0", "sample_id": f"h{i}",
                  "detector_name": d, "detector_score_ai": v} for i, v in enumerate(rng.normal(0, 1, n))]
        for c, shift in (("m0", 1.5), (F.strongest_attack(r, ds), 0.3)):
            rows += [{"dataset": ds, "candidate_rank": 0, "defense": "none", "label": "ai", "condition": c, "sample_id": f"a{i}",
                      "detector_name": d, "detector_score_ai": v} for i, v in enumerate(rng.normal(shift, 1, n))]
    return pd.DataFrame(rows)


SAN = _results(_metrics({"m0": [0.9, 0.95, 0.7], "m5:homoglyph_p=0.005": [0.5, 0.9, 0.2], "m5:homoglyph_p=0.02": [0.2, 0.85, 0.05],
                         "m0+sanitize": [0.9, 0.95, 0.7], "m5:homoglyph_p=0.005+sanitize": [0.88, 0.95, 0.68],
                         "m5:homoglyph_p=0.02+sanitize": [0.86, 0.94, 0.66]}))
PAPER_DETS = ("roberta_openai", "log_likelihood", "log_rank", "rank", "entropy", "lrr", "fast_detectgpt", "detectgpt", "npr",
              "proxihuman", "binoculars")
PAPER_CONDS = (["m0"] + [f"m{k}:N={n}" for k in (1, 2, 4) for n in (1, 2, 4, 8)]
               + [f"m3:guide={g},N={n}" for g in ("roberta_openai", "fast_detectgpt", "binoculars", "ensemble") for n in (1, 2, 4, 8)]
               + [f"m5:homoglyph_p={p}{d}" for d in ("", "+sanitize") for p in (0.001, 0.005, 0.01, 0.02)] + ["m0+sanitize"])


def test_every_figure_reads_at_print_size(tmp_path, facts):
    font = matplotlib.rcParams["font.size"]
    two, q2 = _results({**SYN, "raid": SYN["mage"]}), {**QUAL, "raid": QUAL["mage"]}
    rng = np.random.default_rng(1)
    paper = _results(_metrics({c: list(rng.uniform(0, 1, len(PAPER_DETS))) for c in PAPER_CONDS}, dets=PAPER_DETS))
    F.plot_heatmap(SYN_R, "mage", tmp_path / "heatmap.png", reward=F.in_reward_cells({}, F.heatmap_data(SYN_R, "mage")[1]))
    F.plot_heatmap(paper, "mage", tmp_path / "heatmap_paper.png", reward=F.in_reward_cells({}, F.heatmap_data(paper, "mage")[1]))
    F.plot_tradeoff(SYN_R, QUAL, tmp_path / "tradeoff.png", sim_name="all-minilm-l6-v2")
    F.plot_tradeoff(two, q2, tmp_path / "tradeoff_two.png")
    F.plot_budget_sweep(two, q2, tmp_path / "budget.png")
    F.plot_shield(SYN_R, tmp_path / "shield.png")
    F.plot_sanitize(SAN, "mage", tmp_path / "sanitize.png")
    assert F.plot_roc(_roc_scores(SYN_R), SYN_R, "mage", tmp_path / "roc.png")
    assert len(facts) == 8
    for name, f in facts.items():
        w, h = f["size"]
        assert w in (F.COLUMN_IN, F.PAGE_IN), (name, w)            # one column or two, so the fonts print at their size
        assert h <= 9.5, (name, h)                                 # and a page high at most
        assert f["min_pt"] >= F.MIN_PT, (name, f["min_pt"])
        assert not f["outside"], (name, f["outside"])
        assert not f["overlaps"], (name, f["overlaps"][:5])
        assert Image.open(tmp_path / name).size[0] == round(w * F.DPI), name
    assert facts["tradeoff.png"]["size"][0] == F.COLUMN_IN and facts["heatmap_paper.png"]["size"][0] == F.PAGE_IN
    for fig, label in (("tradeoff.png", "M1"), ("budget.png", "M1"), ("tradeoff.png", "M3"), ("budget.png", "M3 g=FDG")):
        assert facts[fig]["legend_colours"][label] == F.method_color(label[:2].lower()), (fig, label)   # one colour per method
    assert F.method_color("m1") == F.palette()[0] != F.method_color("m3")
    assert matplotlib.rcParams["font.size"] == font                  # the theme did not leak


def test_tradeoff_labels_of_coinciding_points(tmp_path, facts):
    "One point per method, several at the same place (M1 and M3 at N = 1 choose among one candidate): labels stay apart."
    m = _results(_metrics({"m0": [0.9, 0.9, 0.9], "m1:N=1": [0.3, 0.3, 0.3], "m3:guide=ensemble,N=1": [0.3, 0.3, 0.3],
                           "m3:guide=fast_detectgpt,N=1": [0.3, 0.3, 0.3], "m5:homoglyph_p=0.02": [0.35, 0.3, 0.3]}))
    q = {"mage": {"m0": {"sim_median": 1.0}, "m1:N=1": {"sim_median": 0.71}, "m3:guide=ensemble,N=1": {"sim_median": 0.71},
                  "m3:guide=fast_detectgpt,N=1": {"sim_median": 0.71}, "m5:homoglyph_p=0.02": {"sim_median": 0.995}}}
    pts = F.plot_tradeoff(m, q, tmp_path / "fig_tradeoff.png")["mage"]
    f = facts["fig_tradeoff.png"]
    assert sorted(f["texts"]) == sorted(p["label"] for p in pts)   # all five on the front, all labelled
    assert not f["overlaps"] and not f["outside"], (f["overlaps"], f["outside"])


def test_a_rehearsal_banner_sits_above_the_titles(tmp_path, facts, monkeypatch):
    "A rehearsal run stamps every figure (06_rehearsal): the banner stays on the canvas and off every title."
    monkeypatch.setitem(F._MARK, "rehearsal", True)
    F.plot_tradeoff(SYN_R, QUAL, tmp_path / "tradeoff.png")
    F.plot_heatmap(SYN_R, "mage", tmp_path / "heatmap.png")
    F.plot_roc(_roc_scores(SYN_R), SYN_R, "mage", tmp_path / "roc.png")
    assert len(facts) == 3
    for name, f in facts.items():
        assert any("REHEARSAL" in t for t in f["figure_texts"]), name
        assert not f["outside"] and not f["overlaps"] and f["min_pt"] >= F.MIN_PT, (name, f["outside"], f["overlaps"])


def test_fpr_under_attack_at_print_size(tmp_path, facts):
    "RAID's default attacks on four detectors, each with its sanitize twin: an entry per attack, each in a colour of its own."
    from stealth_eval.schema import Raid
    attacks, rows = [f"raid:{a}" for a in Raid().attacks], []
    for k, det in enumerate(("roberta_openai", "fast_detectgpt", "binoculars", "log_likelihood")):
        for i, att in enumerate(attacks):
            for defense in ("none", "sanitize"):
                g = att + ("+sanitize" if defense == "sanitize" else "")
                f, tp = (0.02 + 0.03 * i) / (4 if defense == "sanitize" else 1), 0.9 - 0.07 * i + 0.01 * k
                b = {"family": "human_attack", "dataset": "raid", "detector": det, "aggregate": None, "defense": defense, "group": g, "fpr_target": 0.01}
                rows += [{**b, "label": "human", "metric": "human_attack:fpr", "value": f, "ci_low": f / 2, "ci_high": f * 1.5, "n_human": 200},
                         {**b, "label": "human", "metric": "human_attack:fpr_clean", "value": 0.01, "ci_low": 0.0, "ci_high": 0.03, "n_human": 200},
                         {**b, "label": "ai", "metric": "human_attack:tpr", "value": tp, "ci_low": tp - 0.05, "ci_high": tp + 0.05, "n_ai": 200}]
        rows.append({"family": "main", "dataset": "raid", "detector": det, "aggregate": None, "defense": "none", "label": "ai",
                     "condition": "m0", "metric": "tpr", "fpr_target": 0.01, "value": 0.95, "ci_low": 0.9, "ci_high": 1.0, "n_ai": 200})
    assert F.plot_human_attack(pd.DataFrame(rows), "raid", tmp_path / "fig_fpr_attack_raid.png")
    f = facts["fig_fpr_attack_raid.png"]
    assert f["size"][0] == F.PAGE_IN and f["min_pt"] >= F.MIN_PT and not f["outside"] and not f["overlaps"], f
    names = [F.short_label("raid", F.parse_setting(a.partition(":")[2]), "none") for a in attacks]
    assert set(names) | {"open: + sanitize defense"} <= set(f["legend_colours"])      # each attack once, the defense once
    assert not any("+san" in lab for lab in f["legend_colours"])
    assert len({f["legend_colours"][n] for n in names}) == len(names) == 9              # nine attacks, nine colours


def _probs(r, ds="mage", n=60, seed=0):
    "metrics.probability_frame-shaped P(AI) of every detector of `r`: human texts and the AI texts of M0 and the strongest attack."
    rng, parts = np.random.default_rng(seed), []
    for d in F.detectors(r, ds):
        for lab, c, p in (("human", "m0", rng.beta(2, 5, n)), ("ai", "m0", rng.beta(5, 2, n)), ("ai", F.strongest_attack(r, ds), rng.beta(2, 3, n))):
            parts.append(pd.DataFrame({"dataset": ds, "defense": "none", "detector": d, "calibrator": "platt", "condition": c, "label": lab,
                                       "sample_id": [f"{lab}{i}" for i in range(n)], "score": p, "fold": 0, "p_ai": p}))
    return pd.concat(parts, ignore_index=True)


def test_reliability_and_risk_coverage_at_print_size(tmp_path, facts):
    "The two figures of P(AI) on the paper's eleven detectors (a page wide) and on one (a column wide): readable, nothing cut or overlapping."
    rng = np.random.default_rng(2)
    paper = _results(_metrics({c: list(rng.uniform(0, 1, len(PAPER_DETS))) for c in PAPER_CONDS}, dets=PAPER_DETS))
    one = _results(_metrics({"m0": [0.9], "m5:homoglyph_p=0.02": [0.3]}, dets=("fast_detectgpt",)))
    for r, tag in ((paper, "paper"), (one, "one")):
        assert F.plot_reliability(_probs(r), r, "mage", tmp_path / f"fig_reliability_{tag}.png")
        assert F.plot_risk_coverage(_probs(r), r, "mage", tmp_path / f"fig_risk_coverage_{tag}.png")
    assert len(facts) == 4
    for name, f in facts.items():
        assert f["size"][0] == (F.PAGE_IN if "paper" in name else F.COLUMN_IN) and f["size"][1] <= 9.5, (name, f["size"])
        assert f["min_pt"] >= F.MIN_PT and not f["outside"] and not f["overlaps"], (name, f["outside"], f["overlaps"][:5])
    assert {"M0", "perfect calibration"} <= set(facts["fig_reliability_paper.png"]["legend_colours"])
