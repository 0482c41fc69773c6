"""The shape of the package (#14): stages only look down, components honour their contracts, and a component written
outside the package runs end to end through the command line without touching any other file."""
import ast
import json
import re
from pathlib import Path

import pandas as pd
import pytest

from conftest import ROOT, run_cli

PKG = ROOT / "stealth_eval"
# the pipeline's stages in order, with the modules each owns; a module may import its own stage's and earlier ones
STAGES = [("data", {"data", "benchmarks", "benchmarks_hub"}),
          ("methods", {"methods", "paraphrase", "humanify", "raid", "dipper"}),
          ("detectors", {"stream", "detectors", "perturbation", "supervised", "quality", "lastde", "dna_detectllm", "ghostbuster",
                    "specdetect", "glimpse",
                    "adadetectgpt", "tocsin", "imbd"}),
          ("metrics", {"metrics", "acceptance"}),
          ("figures", {"figures"}),
          ("report", {"report"}),
          ("run", {"run"})]
# below every stage: they may not import any stage module
BASE = {"core", "components", "engine", "models", "schema", "watermark"}


def import_graph() -> dict:
    "module -> the package's modules it imports, function-local imports and registry strings included (walked with `ast`)."
    mods = {p.stem for p in PKG.glob("*.py") if p.stem not in ("__init__", "_modidx")}
    graph = {}
    for m in mods:
        deps = set()
        for n in ast.walk(ast.parse((PKG / f"{m}.py").read_text(encoding="utf-8"))):
            if isinstance(n, ast.ImportFrom):
                if n.level == 1: deps |= {n.module.split(".")[0]} if n.module else {a.name for a in n.names}
                elif n.module == "stealth_eval": deps |= {a.name for a in n.names}
                elif n.module and n.module.startswith("stealth_eval."): deps.add(n.module.split(".")[1])
            elif isinstance(n, ast.Import):
                deps |= {a.name.split(".")[1] for a in n.names if a.name.startswith("stealth_eval.")}
            elif isinstance(n, ast.Constant) and isinstance(n.value, str):   # a registry's lazy "stealth_eval.mod:attr"
                m_ = re.fullmatch(r"stealth_eval\.(\w+):\w+", n.value)
                if m_: deps.add(m_.group(1))
        graph[m] = deps & mods - {m}
    return graph


def cycles(graph: dict) -> list:
    "Strongly connected components with more than one module (Tarjan)."
    index, low, stack, on, out = {}, {}, [], set(), []
    def visit(v):
        index[v] = low[v] = len(index); stack.append(v); on.add(v)
        for w in sorted(graph[v]):
            if w not in index: visit(w); low[v] = min(low[v], low[w])
            elif w in on: low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop(); on.discard(w); comp.append(w)
                if w == v: break
            if len(comp) > 1: out.append(sorted(comp))
    for v in sorted(graph):
        if v not in index: visit(v)
    return out


def test_the_import_walk_sees_function_local_imports():
    g = import_graph()
    assert "report" in g["run"]          # `from stealth_eval.report import headline` inside main()
    assert "models" in g["detectors"]    # function-local `from stealth_eval.models import ...`
    assert "benchmarks_hub" in g["data"]  # a registry string "stealth_eval.benchmarks_hub:load_mage"


def test_no_import_circle():
    assert cycles(import_graph()) == []
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]   # the check can fail


def test_no_stage_imports_a_later_stage_and_the_base_imports_no_stage():
    g = import_graph()
    rank = {m: i for i, (_, ms) in enumerate(STAGES) for m in ms}
    assert set(rank) | BASE <= set(g), "a module named here no longer exists: update STAGES/BASE"
    up = [(m, d) for m in rank for d in g[m] if d in rank and rank[d] > rank[m]]
    assert up == [], f"stage modules importing a later stage: {up}"
    base_up = [(m, d) for m in BASE for d in g[m] if d in rank]
    assert base_up == [], f"base modules importing a stage: {base_up}"


def underscore_imports(pkg: Path = PKG) -> list:
    "(module, from module, name) of every import of another module's underscore name in the package (function-local ones too)."
    out = []
    for p in sorted(pkg.glob("*.py")):
        if p.stem in ("__init__", "_modidx"): continue
        for n in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(n, ast.ImportFrom) and (n.level or (n.module or "").startswith("stealth_eval")):
                out += [(p.stem, n.module, a.name) for a in n.names if a.name.startswith("_") and not a.name.startswith("__")]
    return out


def test_no_module_imports_another_modules_underscore_names(tmp_path):
    "Seams are public (CONVENTIONS.md): what a module takes from another is a documented name; its underscore names are its own."
    assert underscore_imports() == []
    (tmp_path / "a.py").write_text("def f():\n    from stealth_eval.detectors import _hidden\n")   # the check can fail
    assert underscore_imports(tmp_path) == [("a", "stealth_eval.detectors", "_hidden")]


def test_every_registered_component_is_an_instance_of_its_base():
    from stealth_eval.components import DATASETS, DETECTORS, METHODS, Dataset, Detector, Method
    for reg, base, n_min in ((DATASETS, Dataset, 10), (METHODS, Method, 8), (DETECTORS, Detector, 19)):
        comps = reg.all()
        assert len(comps) >= n_min
        for name, c in comps.items():
            assert isinstance(c, base) and c.name == name, (reg.kind, name)
    # what used to switch on names now reads fields
    assert DETECTORS.get("classifier_offline").needs_train_split and METHODS.get("shield").needs_train_split
    assert {n for n, d in DETECTORS.all().items() if d.supervised} == {"roberta_openai", "classifier_offline", "radar", "roberta_base_openai",
                                                                     "fakespot_roberta", "ghostbuster_local",
                                                                     "adadetectgpt",
                                                                     "imbd", "detectanyllm", "imbd_local", "detectanyllm_local"}
    assert METHODS.get("polish").applies_to == "human" and "paraphraser" in METHODS.get("m1").model_keys
    assert "padben" in DATASETS.get("padben").analyses and DATASETS.get("mage").file == "mage_eval"


def test_importing_the_package_and_resolving_a_config_loads_no_torch():
    import subprocess, sys
    code = ("import sys; from stealth_eval.config import resolve_config; resolve_config('tiny', out_dir='/tmp/x'); "
            "from stealth_eval.components import DETECTORS; DETECTORS.names(); print('torch' in sys.modules)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert p.stdout.strip() == "False", p.stderr[-2000:]


PLUGIN = '''
"A detector written outside the package: one class and a decorator."
from dataclasses import dataclass

from stealth_eval.components import DETECTORS, Detector
from stealth_eval.core import sha256_text


@DETECTORS.register
@dataclass(frozen=True, kw_only=True)
class TypeTokenRatio(Detector):
    name: str = "type_token_ratio"
    family: str = "lexical"
    direction: int = -1          # machine text repeats itself: a lower ratio means more AI
    stat: str = "ttr"
    label: str = "TTR"
    reference: str = "a test plugin"

    def compute(self, texts, cfg, cache):
        out = {}
        for t in texts:
            w = t.lower().split()
            out[sha256_text(t)] = {"ttr": len(set(w)) / len(w), "n_tokens_input": len(w), "truncated": False} if w else None
        return out
'''


def test_a_plugin_detector_runs_end_to_end_through_the_cli(tmp_path, warm_store):
    "A plugin's detector beside a panel detector, through the CLI: scored, calibrated, tabled, drawn (the texts cached)."
    plugin = tmp_path / "ttr_plugin.py"
    plugin.write_text(PLUGIN, encoding="utf-8")
    out = tmp_path / "run"
    listed = run_cli("--plugin", plugin, "--list")
    assert "type_token_ratio" in listed.stdout
    bad = run_cli("--detectors", "type_token_ratio", "--out_dir", out, check=False)
    assert bad.returncode == 2 and "unknown detector 'type_token_ratio'" in bad.stderr   # without the plugin: not known
    run_cli("--profile", "tiny", "--plugin", plugin, "--detectors", "log_likelihood", "type_token_ratio",
            "--methods", "m5", "--set", "data.n_per_class=6", "n_bootstrap=50", "--out_dir", out, "--offline",
            "--cache_dir", warm_store)   # the tiny run's first 6 texts a class: generations, attacks and panel scores cached
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["plugins"] == [str(plugin.resolve())] and cfg["detectors"] == ["log_likelihood", "type_token_ratio"]
    s = pd.read_parquet(out / "scores.parquet")
    t = s[s["detector_name"] == "type_token_ratio"]
    assert len(t) == len(s) / 2 and set(t["detector_family"]) == {"lexical"} and (t["detector_direction"] == -1).all()
    ok = t[t["valid"]]
    assert len(ok) > 0 and ok["detector_score_raw"].between(0, 1).all()
    ttr = lambda x: len(set(x.lower().split())) / len(x.lower().split())
    assert ok["detector_score_raw"].tolist() == pytest.approx(ok["text_out"].map(ttr).tolist(), abs=1e-12)
    m = json.loads((out / "metrics.json").read_text())
    assert "type_token_ratio" in m["lee_news"] and "m0" in m["lee_news"]["type_token_ratio"]
    assert 0 <= m["lee_news"]["type_token_ratio"]["m0"]["auc"] <= 1
    assert (out / "figures" / "fig_heatmap_t1f.png").exists()


def test_every_notebook_is_a_page_of_the_documentation(tmp_path):
    "nbdev's sidebar (rendered by `nbdev_docs` with Quarto) and the offline builder list every notebook of nbs/."
    from stealth_eval.report import build_docs, library_notebooks, sidebar_yml
    nbs = library_notebooks()
    assert {p.name for p in nbs} == {p.name for p in (ROOT / "nbs").glob("*.ipynb")} and nbs[0].stem == "index"
    assert (ROOT / "nbs" / "sidebar.yml").read_text() == sidebar_yml(), "nbs/sidebar.yml is stale: run nbdev_sidebar"
    assert (ROOT / "nbs" / "_quarto.yml").exists() and (ROOT / "nbs" / "nbdev.yml").exists()
    p = run_cli("docs", "--site_dir", tmp_path / "docs")
    pages = sorted(q.name for q in (tmp_path / "docs").glob("*.html"))
    assert len(pages) == len(nbs) and "index.html" in pages and "01_components.html" in pages, p.stdout
    html = (tmp_path / "docs" / "01_components.html").read_text()
    assert "Registries filled at the definition" in html and "20_detectors.html" in html   # its prose, and the navigation


def test_registry_order_does_not_depend_on_what_was_imported_first():
    "Names (listings, error messages, defaults) come out provider by provider, whichever module a process imported first."
    import subprocess, sys
    code = ("import sys\nfor m in sys.argv[1:]: __import__(m)\nfrom stealth_eval.components import METHODS, DETECTORS\n"
            "print(METHODS.names(), DETECTORS.names())")
    outs = {subprocess.run([sys.executable, "-c", code, *first], capture_output=True, text=True, cwd=ROOT, timeout=300).stdout
            for first in ([], ["stealth_eval.humanify", "stealth_eval.paraphrase", "stealth_eval.supervised"])}
    assert len(outs) == 1 and "'m0', 'm5', 'm1'" in outs.pop()


PLUGIN_DATA_METHOD = '''
"A dataset and a method written outside the package: one definition and one registration each."
from stealth_eval.components import DATASETS, METHODS, Built, FunctionDataset, FunctionMethod

HUMAN = ["the harbour master said the ferry would run again on monday once the storm had passed the coast",
         "our street held a bake sale and the money went to fixing the roof of the old village hall",
         "she kept a notebook of every bird she saw on the walk to school and drew most of them badly",
         "the match was called off at half time because the pitch had turned into a pond after the rain",
         "my grandfather fixed clocks in a shop that smelled of oil and pipe smoke until he was eighty",
         "the library now opens late on thursdays so that people who work all day can borrow books too"]
AI = ["artificial intelligence is transforming industries by enabling more efficient and accurate decision making processes",
      "in conclusion the benefits of renewable energy sources are numerous and include environmental and economic advantages",
      "effective communication is essential in the workplace as it fosters collaboration and enhances overall productivity",
      "the importance of regular exercise cannot be overstated as it contributes significantly to physical and mental health",
      "climate change presents significant challenges that require coordinated global efforts and innovative solutions today",
      "education plays a crucial role in shaping the future by equipping individuals with essential knowledge and skills"]

def build(cfg, cache):
    rows = [{"id": f"{lab}{i}", "text": t, "label": lab, "domain": "toy", "generator": "human" if lab == "human" else "toy-writer"}
            for lab, texts in (("human", HUMAN), ("ai", AI)) for i, t in enumerate(texts)]
    return Built(records=rows, drops=[])

DATASETS.register(FunctionDataset(name="plugin_texts", fn=build, description="six human and six AI sentences"))

def shout(items, cfg, cache):
    return [[{"setting": "", "candidates": [{"text": it["text"].upper(), "facts": {"changed": "case"}}]}] for it in items]

METHODS.register(FunctionMethod(name="shout", fn=shout, label="upper case", color="C9", reference="a test plugin"))
'''


def test_a_plugin_dataset_and_method_run_end_to_end_through_the_cli(tmp_path):
    "With the detector above: a new dataset, method and detector each touch one file (the plugin), nothing else."
    plugin, det = tmp_path / "data_method_plugin.py", tmp_path / "ttr_plugin.py"
    plugin.write_text(PLUGIN_DATA_METHOD, encoding="utf-8"); det.write_text(PLUGIN, encoding="utf-8")
    out = tmp_path / "run"
    listed = run_cli("--plugin", plugin, "--list").stdout
    assert "plugin_texts" in listed and "shout" in listed
    run_cli("--profile", "tiny", "--plugin", plugin, det, "--datasets", "plugin_texts", "--methods", "shout",
            "--detectors", "type_token_ratio", "--set", "n_bootstrap=50", "--out_dir", out, "--offline")
    raw = pd.read_json(out / "raw_outputs.jsonl", lines=True)
    sh = raw[raw["method"] == "shout"]
    assert len(sh) == 6 and sh["text_out"].str.isupper().all() and set(raw["dataset"]) == {"plugin_texts"}
    card = json.loads((out / "data" / "plugin_texts.card.json").read_text())
    assert card["by_label"] == {"human": 6, "ai": 6}
    m = json.loads((out / "metrics.json").read_text())["plugin_texts"]["type_token_ratio"]
    assert m["shout"]["auc"] == pytest.approx(m["m0"]["auc"])      # the type-token ratio ignores case
    q = pd.read_parquet(out / "quality.parquet")
    assert (q.loc[q["method"] == "shout", "edit_rate"] == 1.0).all()   # every word changed (its case)


def test_the_readme_names_every_stand_in_and_what_it_stands_in_for():
    "README's stand-in table lists each detector whose `stands_in_for` is set, with the detector it replaces."
    from stealth_eval.components import DETECTORS
    readme = (ROOT / "README.md").read_text()
    rows = [l for l in readme.splitlines() if l.startswith("| `")]
    for n, d in DETECTORS.all().items():
        if not d.stands_in_for: continue
        row = next((l for l in rows if f"`{n}`" in l.split(" | ")[0]), None)    # the row's first cell names it
        assert row is not None, f"README: no stand-in row for {n}"
        assert d.stands_in_for.split()[0] in row.split(" | ")[1], (n, d.stands_in_for, row)   # in its "stands in for" cell


def test_the_test_order_keeps_files_whole_and_the_first_half_full():
    "conftest.order_by_duration: files dealt longest first to the half with less work; xdist's first N // 2 are half one."
    from conftest import order_by_duration
    ids = [f"{f}::t{k}" for f, n in (("a.py", 3), ("b.py", 1), ("c.py", 4), ("d.py", 2)) for k in range(n)]
    dur = {"a.py::t0": 50, "b.py::t0": 90, "c.py::t1": 10, "d.py::t0": 40}
    order = order_by_duration(ids, dur)
    assert sorted(order) == sorted(ids)
    files = [i.split("::")[0] for i in order]
    assert files == ["b.py", "c.py", "c.py", "c.py", "c.py", "a.py", "a.py", "a.py", "d.py", "d.py"]   # halves b, c (5 tests) and a, d
    assert [i for i in order if i.startswith("c.py")] == [f"c.py::t{k}" for k in range(4)]             # a file's own order
