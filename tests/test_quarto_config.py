"""Quarto's configurations, checked where Quarto cannot be installed: every page and resource they name exists, and
every option in them is one Quarto documents for a website project.

Two sites: nbdev's documentation of the library (nbs/_quarto.yml with its metadata-files nbs/nbdev.yml and
nbs/sidebar.yml; `nbdev_docs` renders it) and the report site of a run (_quarto.yml at the project root; `quarto render`
renders the default run folder artifacts/, here a tiny run's folder stands in for it).

The allow-lists are Quarto's documented options (those a site like these might use), from its reference pages
https://quarto.org/docs/reference/projects/websites.html (project and website options, navbar, sidebar),
https://quarto.org/docs/reference/formats/html.html (format options, `keep-md` included) and
https://quarto.org/docs/projects/quarto-projects.html (`metadata-files`), which Quarto's schema files generate
(quarto-cli src/resources/schema/project.yml, definitions.yml `base-website`, document-render.yml). `execute: enabled`
is left out on purpose: it is `hidden: true` in document-execute.yml and missing from the reference (quarto-cli#5376);
an .ipynb is rendered with the outputs it holds unless `quarto render --execute` is asked for.
"""
import fnmatch
from pathlib import Path

import pytest
import yaml

from conftest import ROOT

from stealth_eval.report import run_notebooks

TOP = {"project", "website", "format", "execute", "metadata-files", "title", "lang"}
PROJECT = {"type", "title", "render", "execute-dir", "output-dir", "lib-dir", "resources", "preview", "pre-render",
           "post-render"}
WEBSITE = {"title", "description", "favicon", "site-url", "site-path", "repo-url", "repo-link-target", "repo-link-rel",
           "repo-subdir", "repo-branch", "issue-url", "repo-actions", "reader-mode", "google-analytics", "cookie-consent",
           "search", "navbar", "sidebar", "body-header", "body-footer", "margin-header", "margin-footer", "page-navigation",
           "back-to-top-navigation", "bread-crumbs", "page-footer", "image", "image-alt", "comments", "open-graph",
           "twitter-card", "other-links", "code-links"}
NAVBAR = {"title", "logo", "logo-alt", "logo-href", "background", "foreground", "search", "pinned", "collapse",
          "collapse-below", "left", "right", "toggle-position"}
SIDEBAR = {"id", "title", "logo", "search", "tools", "contents", "style", "background", "foreground", "border", "alignment",
           "collapse-level", "pinned", "header", "footer"}
NAV_ITEM = {"href", "text", "icon", "menu", "aria-label", "rel", "target"}
SECTION = {"section", "href", "contents"}
FORMATS = {"html", "commonmark", "gfm"}
HTML = {"theme", "css", "toc", "toc-depth", "toc-location", "toc-title", "number-sections", "code-fold", "code-summary",
        "code-tools", "code-copy", "code-overflow", "code-line-numbers", "highlight-style", "keep-md", "keep-ipynb",
        "embed-resources", "page-layout", "html-math-method", "anchor-sections", "smooth-scroll", "link-external-icon",
        "link-external-newwindow", "include-in-header", "include-before-body", "include-after-body", "fig-width",
        "fig-height"}
EXECUTE = {"eval", "echo", "output", "warning", "error", "include", "cache", "freeze"}
REPO_ACTIONS = {"none", "edit", "source", "issue"}
# Files a Quarto project never renders, even when its render list names them (quarto-cli src/project/project-context.ts,
# projectHiddenIgnoreGlob): names starting with `_` or `.`, and README.md.
QUARTO_SKIPS = ("_*", ".*", "README.md", "README.qmd", "README.Rmd")


def _as_list(v) -> list:
    return [] if v is None else v if isinstance(v, list) else [v]


def _nav_items(items, where: str):
    "Every (where, item) of a navbar/sidebar list, sections and menus included."
    for i, it in enumerate(_as_list(items)):
        yield f"{where}[{i}]", it
        if isinstance(it, dict):
            for k in ("contents", "menu"):
                if isinstance(it.get(k), list): yield from _nav_items(it[k], f"{where}[{i}].{k}")


def _sidebars(cfg: dict) -> list:
    return _as_list((cfg.get("website") or {}).get("sidebar")) if isinstance((cfg.get("website") or {}).get("sidebar"), (dict, list)) else []


def undocumented(cfg: dict) -> list:
    "Every key (and repo-actions value) of a Quarto config that is not one Quarto documents: ['website.twiter-card', ...]."
    bad = [k for k in cfg if k not in TOP]
    sections = {"project": PROJECT, "website": WEBSITE, "execute": EXECUTE, "format": FORMATS}
    for sect, allowed in sections.items():
        if isinstance(cfg.get(sect), dict): bad += [f"{sect}.{k}" for k in cfg[sect] if k not in allowed]
    for fmt, opts in (cfg.get("format") or {}).items():
        if fmt == "html" and isinstance(opts, dict): bad += [f"format.html.{k}" for k in opts if k not in HTML]
        elif not (opts == "default" or isinstance(opts, dict)): bad.append(f"format.{fmt}: {opts!r}")
    web = cfg.get("website") or {}
    bad += [f"website.repo-actions: {a}" for a in _as_list(web.get("repo-actions")) if a not in REPO_ACTIONS]
    items = []
    if isinstance(web.get("navbar"), dict):
        bad += [f"website.navbar.{k}" for k in web["navbar"] if k not in NAVBAR]
        items += [x for side in ("left", "right") for x in _nav_items(web["navbar"].get(side), f"website.navbar.{side}")]
    for i, sb in enumerate(_sidebars(cfg)):
        bad += [f"website.sidebar.{k}" for k in sb if k not in SIDEBAR]
        if isinstance(sb.get("contents"), list): items += list(_nav_items(sb["contents"], "website.sidebar.contents"))
    for where, it in items:
        if isinstance(it, dict):
            allowed = SECTION if "section" in it else NAV_ITEM
            bad += [f"{where}.{k}" for k in it if k not in allowed]
    return bad


def pages(cfg: dict) -> list:
    "Every page a config names: the render list, navbar and sidebar entries (paths or globs)."
    out = list(_as_list((cfg.get("project") or {}).get("render")))
    web = cfg.get("website") or {}
    items = []
    if isinstance(web.get("navbar"), dict):
        items += [x for side in ("left", "right") for x in _nav_items(web["navbar"].get(side), "navbar")]
    for sb in _sidebars(cfg):
        c = sb.get("contents")
        if isinstance(c, str): out.append(c)
        items += list(_nav_items(c if isinstance(c, list) else [], "sidebar"))
    for _, it in items:
        if isinstance(it, str): out.append(it)
        elif isinstance(it, dict):
            out += [it[k] for k in ("href", "file") if isinstance(it.get(k), str) and "://" not in it[k]]
            if isinstance(it.get("contents"), str): out.append(it["contents"])
    return out


def resources(cfg: dict) -> list:
    "Every other file a config names: project resources, metadata-files, the html format's css."
    html = (cfg.get("format") or {}).get("html")
    return (_as_list((cfg.get("project") or {}).get("resources")) + _as_list(cfg.get("metadata-files"))
            + (_as_list(html.get("css")) if isinstance(html, dict) else []))


def resolve(name: str, base: Path, artifacts: Path | None = None) -> list:
    "The files a name (or glob) stands for; `artifacts/...` is looked up in the run folder `artifacts` when given."
    if artifacts is not None and name.startswith("artifacts/"):
        base, name = artifacts, name[len("artifacts/"):]
    return sorted(p for p in base.glob(name) if p.is_file()) if any(c in name for c in "*?[") else \
        ([base / name] if (base / name).is_file() else [])


def missing(names: list, base: Path, artifacts: Path | None = None) -> list:
    return [n for n in names if not resolve(n, base, artifacts)]


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text(encoding="utf-8")) or {}


# ---------------------------------------------------------------- the checks themselves can fail

def test_checker_reports_undocumented_options_and_missing_pages(tmp_path):
    good = {"project": {"type": "website", "output-dir": "_site", "render": ["a.ipynb"]},
            "website": {"title": "t", "repo-actions": ["issue"], "twitter-card": True, "open-graph": True,
                        "navbar": {"left": [{"href": "a.ipynb", "text": "A"}]},
                        "sidebar": {"style": "floating", "contents": ["a.ipynb", {"section": "S", "contents": "t/*.md"}]}},
            "format": {"html": {"theme": "cosmo", "css": "s.css", "keep-md": True}, "commonmark": "default"},
            "metadata-files": ["m.yml"]}
    assert undocumented(good) == []
    bad = {"project": {"type": "website", "outputdir": "_site"}, "execute": {"enabled": False},
           "website": {"twiter-card": True, "repo-actions": ["issues"], "navbar": {"left": [{"href": "a", "txt": "A"}]},
                       "sidebar": {"contents": [{"section": "S", "contents": [{"href": "b", "label": "B"}]}]}},
           "format": {"html": {"themes": "cosmo"}, "gfm": "yes"}, "metadata-file": ["m.yml"]}
    assert sorted(undocumented(bad)) == sorted([
        "metadata-file", "project.outputdir", "execute.enabled", "website.twiter-card", "format.html.themes",
        "format.gfm: 'yes'", "website.repo-actions: issues", "website.navbar.left[0].txt",
        "website.sidebar.contents[0].contents[0].label"])
    for f in ("a.ipynb", "s.css", "m.yml", "t/x.md"):
        (tmp_path / f).parent.mkdir(exist_ok=True)
        (tmp_path / f).write_text("x")
    assert pages(good) == ["a.ipynb", "a.ipynb", "a.ipynb", "t/*.md"] and resources(good) == ["m.yml", "s.css"]
    assert missing(pages(good) + resources(good), tmp_path) == []
    assert missing(["a.ipynb", "gone.ipynb", "t/*.qmd", "artifacts/x.md"], tmp_path, artifacts=tmp_path / "t") == \
        ["gone.ipynb", "t/*.qmd"]


# ---------------------------------------------------------------- nbdev's documentation site

def test_docs_site_config():
    "nbs/_quarto.yml and its metadata-files: documented options only; every page a notebook of nbs/, every file there."
    nbs = ROOT / "nbs"
    main = load(nbs / "_quarto.yml")
    assert main["project"]["type"] == "website"
    files = {"_quarto.yml": main} | {m: load(nbs / m) for m in _as_list(main.get("metadata-files"))}
    assert set(files) >= {"_quarto.yml", "nbdev.yml", "sidebar.yml"}
    for name, cfg in files.items():
        assert undocumented(cfg) == [], f"nbs/{name}: options Quarto does not document: {undocumented(cfg)}"
        assert missing(pages(cfg) + resources(cfg), nbs) == [], f"nbs/{name} names missing files: {missing(pages(cfg) + resources(cfg), nbs)}"
    named = [p for cfg in files.values() for p in pages(cfg)]
    assert len(named) >= 10 and all(p.endswith(".ipynb") for p in named), named
    assert not [p for p in named if any(fnmatch.fnmatch(Path(p).name, g) for g in QUARTO_SKIPS)]
    web = {k: v for cfg in files.values() for k, v in (cfg.get("website") or {}).items()}
    assert not web.get("repo-actions") or web.get("repo-url"), "repo-actions need website.repo-url"


# ---------------------------------------------------------------- the report site of a run

def test_run_site_config(tiny_run):
    "_quarto.yml: documented options only; every page and resource exists for a tiny run; every executed notebook rendered."
    run = Path(tiny_run["out"])
    cfg = load(ROOT / "_quarto.yml")
    assert cfg["project"]["type"] == "website"
    assert undocumented(cfg) == [], f"_quarto.yml: options Quarto does not document: {undocumented(cfg)}"
    named = pages(cfg) + resources(cfg)
    assert missing(named, ROOT, artifacts=run) == [], f"_quarto.yml names what a run does not write: {missing(named, ROOT, artifacts=run)}"
    rendered = {p for n in cfg["project"]["render"] for p in resolve(n, ROOT, run)}
    skipped = [p for p in rendered if any(fnmatch.fnmatch(p.name, g) for g in QUARTO_SKIPS)]
    assert not skipped, f"Quarto never renders {skipped}"
    assert set(run_notebooks(run)) <= rendered, "an executed notebook of the run is not rendered"
    assert {run / "acceptance.md", run / "qual_examples.md", ROOT / "nbs" / "index.ipynb"} <= rendered
    assert set((run / "tables").glob("*.md")) <= rendered
    linked = {p for n in pages(cfg) for p in resolve(n, ROOT, run)}
    assert linked <= rendered, f"navigation links pages that are not rendered: {sorted(map(str, linked - rendered))}"
    assert set(run_notebooks(run)) <= linked                          # each executed notebook is reachable
