"""Commands that delete or write outside a run act only on what they own (issue 25, items 1 and 2's report half).

`stealth-eval cache prune` on a folder that is not a content store removes nothing and says so in one line; inside a
store it removes only entries that fail and stale temporary files, never a foreign file or what a link points at; a
store written before the marker existed is still recognised and pruned. `stealth-eval report` writes only its own
files (modes of the others unchanged, links not written through), only from a run whose every stage finished, and
shows only the files that run wrote (issue #37.2). `stealth-eval docs` writes into its `--site_dir`, and `--help`
writes nothing (#37.4). Every case is built by hand in a temporary folder: no pipeline run.
"""
import os
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from conftest import ROOT, cli_env, one_error_line, run_cli

from stealth_eval.config import PIPELINE
from stealth_eval.core import STORE_MARKER, Cache, verify_store, write_json
from stealth_eval.report import SITE_MODE, build_docs


def _files(root: Path) -> dict:
    "Relative path -> (bytes or link target, mode) of everything under `root`, links not followed."
    out = {}
    for d, dirs, files in os.walk(root):
        for n in dirs + files:
            p = Path(d, n)
            if p.is_symlink(): out[str(p.relative_to(root))] = ("link", os.readlink(p))
            elif p.is_file(): out[str(p.relative_to(root))] = (p.read_bytes(), p.stat().st_mode & 0o777)
    return out


# ---------------------------------------------------------------- cache prune

def test_prune_refuses_a_folder_that_is_not_a_store(tmp_path):
    "The user cache folder (models beside store/) given as --cache_dir: exit 2, one line naming the marker, nothing removed."
    user = tmp_path / "stealth_eval"
    (user / "models" / "gemma").mkdir(parents=True)
    (user / "models" / "gemma" / "weights.gguf").write_bytes(b"GGUF weights")
    (user / "notes.txt").write_text("my notes")
    store = Cache(user / "store")
    store.put(store.key("lm_panel", text="t"), {"fdg": 1.25})
    before = _files(user)
    for action in ("prune", "verify"):
        line = one_error_line(run_cli("cache", action, "--cache_dir", user, check=False), "cache")
        assert f"{user} is not a stealth-eval content store (no marker {STORE_MARKER}" in line, line
        assert line.endswith(f"did you mean {user / 'store'}?"), line
    assert _files(user) == before                                        # every file kept, store included
    home = tmp_path / "home"; home.mkdir(); (home / "thesis.tex").write_text("\\section{}")
    line = one_error_line(run_cli("cache", "prune", "--cache_dir", home, check=False), "cache")
    assert "thesis.tex is not a store entry" in line and "did you mean" not in line
    assert (home / "thesis.tex").read_text() == "\\section{}"


def test_prune_inside_a_store_removes_only_failing_entries(tmp_path):
    "A store holding a foreign file, a link to an outside file at an entry's place and a linked folder: only the torn entry goes."
    outside = tmp_path / "outside"; outside.mkdir()
    (outside / "victim.json").write_text("not an entry")                 # would fail verification if read through the link
    c = Cache(tmp_path / "store")
    good, torn, linked = (c.key("lm_panel", text=t) for t in ("good", "torn", "linked"))
    for k in (good, torn): c.put(k, {"fdg": 1.0})
    c._path(torn).write_text('{"key": "lm_')
    c._path(linked).parent.mkdir(parents=True, exist_ok=True)
    c._path(linked).symlink_to(outside / "victim.json")
    (outside / "ns").mkdir(); (outside / "ns" / "00").mkdir()
    (outside / "ns" / "00" / ("00" + "0" * 62 + ".json")).write_text("torn")   # entry-shaped, behind a linked folder
    (tmp_path / "store" / "ns").symlink_to(outside / "ns", target_is_directory=True)
    (tmp_path / "store" / "README.txt").write_text("mine")
    rep = verify_store(tmp_path / "store")
    assert (rep["entries"], rep["ok"]) == (2, 1)
    assert sorted(Path(f).name for f in rep["foreign"]) == sorted(["README.txt", "ns", c._path(linked).name])
    out_before, p = _files(outside), run_cli("cache", "prune", "--cache_dir", tmp_path / "store")
    assert "removed 1 file(s)" in p.stdout, p.stdout
    assert not c._path(torn).exists() and c.get(good) == {"fdg": 1.0}
    assert (tmp_path / "store" / "README.txt").read_text() == "mine" and c._path(linked).is_symlink()
    assert _files(outside) == out_before                                 # nothing behind a link read as ours or removed


def test_store_written_before_the_marker_is_still_pruned(tmp_path):
    "A marker-less store of entries and temporary files (an older version's): recognised, the torn entry and old temp file go."
    c = Cache(tmp_path / "store")
    good, torn = c.key("scores", text="a"), c.key("scores", text="b")
    for k in (good, torn): c.put(k, [1, 2])
    assert (tmp_path / "store" / STORE_MARKER).is_file()                 # a store marks itself with its first entry
    (tmp_path / "store" / STORE_MARKER).unlink()
    c._path(torn).write_bytes(os.urandom(40))
    old, fresh = (c._path(good).parent / f".{c._path(good).name}.{s}.tmp" for s in ("abc123_x", "def456_y"))
    old.write_text("{"); fresh.write_text("{")
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    p = run_cli("cache", "prune", "--cache_dir", tmp_path / "store")
    assert "removed 2 file(s)" in p.stdout, p.stdout
    assert sorted(_files(tmp_path / "store")) == sorted(str(x.relative_to(tmp_path / "store")) for x in (c._path(good), fresh))
    assert verify_store(tmp_path / "store")["problems"] == {}


# ---------------------------------------------------------------- report

def _run_folder(root: Path, stages: dict | None = None) -> Path:
    "A run folder by hand: run_info (every stage ok unless `stages`), config, an empty metrics.json, a figure, a table."
    run = root / "run"
    (run / "figures").mkdir(parents=True); (run / "tables").mkdir()
    ok = {nb: {"status": "ok", "seconds": 1.0} for nb in PIPELINE}
    write_json(run / "run_info.json", {"started": "2026-01-01T00:00:00+00:00", "git": "test", "stages": ok if stages is None else stages,
                                       "files": ["config.json", "figures/fig_heatmap_t1f.png", "metrics.json", "run_info.json",
                                                 "tables/table_main.md"]})
    write_json(run / "config.json", {"profile": "tiny", "datasets": [], "methods": [], "detectors": []})
    write_json(run / "metrics.json", {})
    (run / "figures" / "fig_heatmap_t1f.png").write_bytes(b"\x89PNG figure of this run")
    (run / "tables" / "table_main.md").write_text("| a | b |\n|---|---|\n| 1 | 2 |\n")
    return run


def test_report_writes_only_its_own_files(tmp_path):
    "A site folder holding a 0600 file, a script and a link where a figure goes: modes, contents and the link's target kept."
    run, site, outside = _run_folder(tmp_path), tmp_path / "www", tmp_path / "victim.png"
    (site / "figures").mkdir(parents=True)
    (site / "secret.txt").write_text("token"); (site / "secret.txt").chmod(0o600)
    (site / "deploy.sh").write_text("#!/bin/sh\necho deploy\n"); (site / "deploy.sh").chmod(0o755)
    outside.write_bytes(b"someone else's picture"); outside.chmod(0o600)
    (site / "figures" / "fig_heatmap_t1f.png").symlink_to(outside)
    p = run_cli("report", "--out_dir", run, "--site_dir", site)
    assert "wrote" in p.stdout, p.stderr
    assert [(site / n).stat().st_mode & 0o777 for n in ("secret.txt", "deploy.sh")] == [0o600, 0o755]
    assert (site / "secret.txt").read_text() == "token" and os.access(site / "deploy.sh", os.X_OK)
    assert (outside.read_bytes(), outside.stat().st_mode & 0o777) == (b"someone else's picture", 0o600)   # not written through
    fig = site / "figures" / "fig_heatmap_t1f.png"
    assert not fig.is_symlink() and fig.read_bytes() == b"\x89PNG figure of this run"
    assert {n: (site / n).stat().st_mode & 0o777 for n in ("index.html", "figures/fig_heatmap_t1f.png")} == \
           {"index.html": SITE_MODE, "figures/fig_heatmap_t1f.png": SITE_MODE}


def test_report_refuses_a_linked_figures_folder(tmp_path):
    "site/figures a link to another folder: refused in one line before anything is written there."
    run, site, elsewhere = _run_folder(tmp_path), tmp_path / "www", tmp_path / "photos"
    site.mkdir(); elsewhere.mkdir(); (elsewhere / "holiday.png").write_bytes(b"mine")
    (site / "figures").symlink_to(elsewhere, target_is_directory=True)
    before = _files(elsewhere)
    line = one_error_line(run_cli("report", "--out_dir", run, "--site_dir", site, check=False), "report")
    assert "is a symbolic link" in line, line
    assert _files(elsewhere) == before and not (site / "index.html").exists()


def test_docs_write_only_their_own_pages(tmp_path):
    "`build_docs` into a folder holding a private page: its own pages readable, the other one's mode kept."
    nbs, site = tmp_path / "nbs", tmp_path / "docs"
    nbs.mkdir(); site.mkdir()
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# Index")]), str(nbs / "index.ipynb"))
    (site / "private.html").write_text("<p>mine</p>"); (site / "private.html").chmod(0o600)
    build_docs(site, nbs)
    assert {p.name: p.stat().st_mode & 0o777 for p in site.iterdir()} == {"index.html": SITE_MODE, "private.html": 0o600}


@pytest.mark.parametrize("stages, said", [
    ({**{nb: {"status": "ok"} for nb in PIPELINE}, "20_detectors": {"status": "failed", "error": "ValueError: boom"}},
     "stage 20_detectors failed (ValueError: boom)"),
    ({"00_data": {"status": "ok"}, "10_methods": {"status": "interrupted"}}, "stage 10_methods interrupted"),
    ({nb: {"status": "ok"} for nb in PIPELINE[:3]}, f"stage {PIPELINE[3]} did not run"),
])
def test_report_of_an_incomplete_run_is_refused_naming_the_stage(tmp_path, stages, said):
    "A run folder whose run_info.json records a stage failed, interrupted or never run (metrics.json of an earlier run there)."
    run = _run_folder(tmp_path, stages)
    line = one_error_line(run_cli("report", "--out_dir", run, check=False), "report")
    assert said in line and str(run) in line, line
    assert not (run / "site").exists()


def test_report_shows_only_what_the_run_wrote(tmp_path):
    "A table, a figure and an acceptance page that run_info.json does not list (a user's, an earlier run's): not shown."
    run = _run_folder(tmp_path)
    (run / "tables" / "table_main_old_dataset.md").write_text("| old | table |\n|---|---|\n| 9 | 9 |\n")
    (run / "figures" / "fig_roc_old_dataset.png").write_bytes(b"\x89PNG an earlier dataset's")
    (run / "acceptance.md").write_text("# Acceptance of someone else's run\n")
    assert "wrote" in run_cli("report", "--out_dir", run).stdout
    index = (run / "site" / "index.html").read_text()
    assert "table_main.md" in index and 'src="figures/fig_heatmap_t1f.png"' in index              # the run's own
    assert "old_dataset" not in index and "someone else" not in index, index
    assert sorted(p.name for p in (run / "site" / "figures").iterdir()) == ["fig_heatmap_t1f.png"]


def test_docs_writes_into_its_site_dir_and_help_writes_nothing(tmp_path):
    """`docs --site_dir DIR` wrote into the project's _docs/ (and so did `docs --help` and `docs --site_dir` with no
    value). Now DIR, relative to the current folder, is where the pages go; --help prints; no value is an error."""
    nbs, docs = tmp_path / "nbs", ROOT / "_docs"
    nbs.mkdir()
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# Index")]), str(nbs / "index.ipynb"))
    stamps = lambda: {p: p.stat().st_mtime_ns for p in docs.rglob("*")} if docs.exists() else None
    before = stamps()
    docs_cli = lambda *a: subprocess.run([sys.executable, "-m", "stealth_eval.run", "docs", *a], cwd=tmp_path, env=cli_env(),
                                         capture_output=True, text=True, timeout=300)
    h = docs_cli("--help")
    assert h.returncode == 0 and h.stdout.startswith("usage: stealth-eval docs") and "--site_dir" in h.stdout, h.stderr
    e = docs_cli("--site_dir")
    assert e.returncode == 2 and "argument --site_dir: expected one argument" in e.stderr, e.stderr
    p = docs_cli("--site_dir", "pages", "--nbs_dir", "nbs")
    assert p.returncode == 0 and f"wrote {tmp_path / 'pages' / 'index.html'} (1 pages)" in p.stdout, p.stderr
    assert sorted(x.name for x in tmp_path.iterdir()) == ["nbs", "pages"]
    assert stamps() == before                                      # the project's _docs/ untouched throughout


def test_report_of_a_folder_without_run_info_is_refused(tmp_path):
    run = _run_folder(tmp_path)
    (run / "run_info.json").unlink()
    line = one_error_line(run_cli("report", "--out_dir", run, check=False), "report")
    assert "no run_info.json" in line, line
