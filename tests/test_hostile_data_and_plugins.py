"""Issue #25, items 3, 5 (data and plugins) and 6: dataset names that claim one file, user files named like a benchmark,
dataset paths that are not regular files, ids and keys read exactly, and plugins that end the process or take a
registered name. Each case is refused in one line naming the input, before the run where the runner can see it.

The runner's own entry point, `run_pipeline`, runs with papermill replaced by a sentinel (as in
`test_hostile_inputs.py`): reaching it means the run would have started. No model is loaded; a few cases go through the
real command line for the exit status and the one line on stderr.
"""
import inspect
import json
import os
import sys
import threading

import pandas as pd
import pytest

from conftest import run_cli
from stealth_eval import components
from stealth_eval.benchmarks import _read_json_rows
from stealth_eval.components import DATASETS, DETECTORS, dataset_analyses, load_plugins
from stealth_eval.config import resolve_config
from stealth_eval.core import StealthEvalError, read_jsonl
from stealth_eval.data import load_dataset_file, run_data_stage
from stealth_eval.run import run_pipeline

W = "word " * 12
ROWS = [{"id": "h", "label": "human", "domain": "news", "generator": "human", "text": W},
        {"id": "a", "label": "ai", "domain": "news", "generator": "gpt", "text": W}]


def write(path, recs=ROWS):
    path.write_text("".join(json.dumps(r) + "\n" for r in recs), encoding="utf-8")
    return path


class _Started(Exception):
    "Raised instead of executing the first stage: the checks let the run start."


def refused_before_the_run(datasets, tmp_path, monkeypatch, plugins=None) -> str:
    "The one-line error `run_pipeline` raises before the first stage (the test fails if the run would start)."
    import papermill
    def start(*a, **k): raise _Started()
    monkeypatch.setattr(papermill, "execute_notebook", start)
    try: run_pipeline("tiny", datasets=[str(d) for d in datasets], out_dir=str(tmp_path / "run"),
                      overrides={"device": "cpu"}, plugins=plugins)
    except _Started: pytest.fail(f"the run would start with {datasets}")
    except StealthEvalError as e:
        assert "\n" not in str(e)
        return str(e)


# --- item 3: one file per dataset, analyses by component ---------------------------------------------------------

COLLIDING = {   # inputs (a registered name, or a file name) -> the data file both would write
    "mage + mage_eval.jsonl": (["mage", "mage_eval.jsonl"], "data/mage_eval.jsonl"),
    "x.train.jsonl + x.jsonl": (["x.train.jsonl", "x.jsonl"], "data/x.train.jsonl"),
    "X.csv + x.jsonl": (["X.csv", "x.jsonl"], "data/x.jsonl"),   # one file on a case-insensitive file system
}


def _inputs(names, tmp_path):
    out = []
    for n in names:
        if "." not in n: out.append(n); continue
        p = tmp_path / n
        if p.suffix == ".csv": pd.DataFrame(ROWS).to_csv(p, index=False)
        else: write(p)
        out.append(str(p))
    return out


@pytest.mark.parametrize("case", list(COLLIDING))
def test_data_stage_refuses_two_datasets_that_write_one_file(case, tmp_path, monkeypatch):
    """Before: both datasets were scored on the second one's texts, or x's split replaced x.train's data. Now: one line,
    nothing written, also from the data stage itself (a config.json written without the runner's check)."""
    names, target = COLLIDING[case]
    inputs = _inputs(names, tmp_path)
    with monkeypatch.context() as m:
        m.setattr("stealth_eval.data.check_dataset_specs", lambda specs: None)   # the runner's check skipped
        cfg = resolve_config("tiny", inputs, out_dir=str(tmp_path / "run"))
    with pytest.raises(StealthEvalError) as e:
        run_data_stage(cfg)
    msg = str(e.value)
    assert "\n" not in msg and f"would both write {target}" in msg, msg
    assert all(i in msg for i in inputs), msg
    assert not (tmp_path / "run" / "data").exists() or not any((tmp_path / "run" / "data").iterdir())


@pytest.mark.parametrize("case", list(COLLIDING))
def test_runner_refuses_two_datasets_that_write_one_file_before_the_run(case, tmp_path, monkeypatch):
    names, target = COLLIDING[case]
    inputs = _inputs(names, tmp_path)
    msg = refused_before_the_run(inputs, tmp_path, monkeypatch)
    assert f"would both write {target}" in msg and all(i in msg for i in inputs), msg


@pytest.mark.parametrize("name", ["padben", "beemo", "apt_eval"])
def test_a_file_named_like_a_benchmark_never_gets_its_analyses(name, tmp_path, monkeypatch):
    "Before: `padben.jsonl` was the dataset 'padben' to `dataset_analyses`, so it got PadBen's tables. Now it is refused."
    f = write(tmp_path / f"{name}.jsonl")
    assert dataset_analyses(name) == DATASETS.get(name).analyses != ()   # what such a file would have been given
    with monkeypatch.context() as m:                                      # the data stage checks on its own too
        m.setattr("stealth_eval.data.check_dataset_specs", lambda specs: None)
        cfg = resolve_config("tiny", [str(f)], out_dir=str(tmp_path / "run"))
    with pytest.raises(StealthEvalError, match=f"{f}: a dataset file may not take the name of the registered dataset '{name}'"):
        run_data_stage(cfg)
    assert not (tmp_path / "run" / "data" / f"{name}.jsonl").exists()


def test_runner_refuses_a_file_named_like_a_benchmark_before_the_run(tmp_path, monkeypatch):
    f = write(tmp_path / "padben.jsonl")
    assert "may not take the name of the registered dataset 'padben'" in refused_before_the_run([f], tmp_path, monkeypatch)


# --- item 5: a dataset path that is not a regular file -----------------------------------------------------------

def test_a_folder_named_like_a_dataset_is_refused_before_the_run(tmp_path, monkeypatch):
    "Before: IsADirectoryError (a traceback). Now: one line."
    (tmp_path / "d.jsonl").mkdir()
    msg = refused_before_the_run([tmp_path / "d.jsonl"], tmp_path, monkeypatch)
    assert msg == f"{tmp_path / 'd.jsonl'}: is a folder, not a dataset file (a regular .jsonl, .csv or .parquet file)"


def test_a_named_pipe_is_refused_without_opening_it(tmp_path):
    "Before: reading the FIFO waited for a writer forever. Now: refused at once (the pipe is never opened)."
    fifo = tmp_path / "d.jsonl"
    os.mkfifo(fifo)
    got = {}
    def load():
        try: load_dataset_file(fifo)
        except Exception as e: got["error"] = e
    t = threading.Thread(target=load, daemon=True)
    t.start(); t.join(20)
    if t.is_alive():                      # the old behaviour: blocked in open(); let it go, then fail
        open(fifo, "wb").close(); t.join(5)
        pytest.fail("load_dataset_file blocked on a named pipe")
    assert isinstance(got.get("error"), StealthEvalError) and "is a named pipe (FIFO), not a dataset file" in str(got["error"])


def test_cli_folder_dataset_exits_2_in_one_line(tmp_path):
    (tmp_path / "d.csv").mkdir()
    p = run_cli("--profile", "tiny", "--datasets", tmp_path / "d.csv", "--out_dir", tmp_path / "run", check=False, timeout=300)
    assert p.returncode == 2 and p.stderr.strip().splitlines() == [
        f"stealth-eval: error: {tmp_path / 'd.csv'}: is a folder, not a dataset file (a regular .jsonl, .csv or .parquet file)"], p.stderr[-3000:]
    assert not (tmp_path / "run" / "notebooks").exists()


# --- item 6: ids and keys read exactly ---------------------------------------------------------------------------

def test_ids_are_read_as_written(tmp_path):
    "Before: ids 0 and 1.5 in one JSONL column came back as '0.0' and '1.5'. Now every id is its text in the file."
    f = tmp_path / "ids.jsonl"
    f.write_text("".join(f'{{"id": {i}, "label": "{lab}", "domain": "n", "generator": "g", "text": "{W}"}}\n'
                         for i, lab in (("0", "human"), ("1.5", "ai"), ("2", "human"), ("1e3", "ai"))))
    cfg = resolve_config("tiny", [str(f)], out_dir=str(tmp_path / "run"))
    run_data_stage(cfg)
    assert [r["id"] for r in read_jsonl(tmp_path / "run" / "data" / "ids.jsonl")] == ["0", "1.5", "2", "1e3"]   # before: 0.0, 1.5, 2.0, 1000.0


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_csv_and_parquet_ids_stay_as_stored(fmt, tmp_path):
    "CSV is read as text (leading zeros kept); a Parquet integer column gives its integers' text."
    f = tmp_path / f"ids.{fmt}"
    df = pd.DataFrame([{**r, "id": i} for r, i in zip(ROWS, (["007", "7"] if fmt == "csv" else [0, 7]))])
    df.to_csv(f, index=False) if fmt == "csv" else df.to_parquet(f)
    assert load_dataset_file(f)["id"].tolist() == (["007", "7"] if fmt == "csv" else ["0", "7"])


def test_a_key_repeated_in_one_object_refuses_the_file(tmp_path, monkeypatch):
    "Before: the last 'label' won (a human text became AI). Now: the file and line, before the run."
    f = tmp_path / "dup.jsonl"
    f.write_text(json.dumps(ROWS[0]) + "\n" + '{"id": "x", "label": "human", "domain": "n", "generator": "g", '
                 f'"text": "{W}", "label": "ai"}}\n', encoding="utf-8")
    msg = refused_before_the_run([f], tmp_path, monkeypatch)
    assert msg.startswith(f"{f}:2: key 'label' occurs twice in one JSON object"), msg


def test_a_benchmark_json_file_with_a_repeated_key_is_refused(tmp_path):
    f = tmp_path / "task.json"
    f.write_text('[{"idx": 0, "sentence": "a", "label": 0},\n {"idx": 1, "sentence": "b", "label": 0, "label": 1}]')
    with pytest.raises(StealthEvalError, match="task.json: row 1: key 'label' occurs twice in one JSON object"):
        _read_json_rows(f, ("idx", "sentence", "label"))


# --- item 5: plugins ---------------------------------------------------------------------------------------------

def test_a_plugin_that_calls_os_exit_does_not_end_the_run_silently(tmp_path):
    "Before: exit 0 and nothing run, no message. Now: exit 2, one line naming the plugin, nothing run."
    plugin = tmp_path / "quits.py"
    plugin.write_text("import os\nos._exit(0)\n", encoding="utf-8")
    p = run_cli("--profile", "tiny", "--plugin", plugin, "--out_dir", tmp_path / "run", check=False, timeout=300)
    assert p.returncode == 2, (p.returncode, p.stderr[-3000:])
    assert p.stderr.strip().splitlines() == [
        f"stealth-eval: error: --plugin {plugin}: importing it ends the process (exit status 0: os._exit or a crash) "
        "instead of returning; a plugin must only define and register components"], p.stderr[-3000:]
    assert not (tmp_path / "run" / "notebooks").exists()


def test_a_plugin_that_calls_sys_exit_is_reported_by_list_too(tmp_path):
    "The runner caught sys.exit during a run; `--list` did not (exit 3, no message). Both now name the plugin."
    plugin = tmp_path / "exits.py"
    plugin.write_text("import sys\nsys.exit(3)\n", encoding="utf-8")
    p = run_cli("--plugin", plugin, "--list", check=False, timeout=300)
    assert p.returncode == 2 and p.stderr.strip().splitlines() == [
        f"stealth-eval: error: --plugin {plugin}: importing it called sys.exit(3); a plugin must raise an exception, "
        "never end the run"], (p.returncode, p.stderr[-3000:])


TAKES = '''
from dataclasses import dataclass
from stealth_eval.components import DETECTORS, Detector

@DETECTORS.register
@dataclass(frozen=True, kw_only=True)
class Mine(Detector):
    name: str = "{name}"
    family: str = "lexical"
    direction: int = 1
    stat: str = "n"
    def compute(self, texts, cfg, cache): return {{t: {{"n": 1.0, "n_tokens_input": 1, "truncated": False}} for t in texts}}
'''


def test_a_plugin_taking_a_registered_name_is_refused_and_leaves_nothing(tmp_path):
    "Before: the plugin's 'log_likelihood' replaced the built-in (or was overwritten by it), silently. Now: one line."
    before = DETECTORS.get("log_likelihood")
    plugin = tmp_path / "takes.py"
    plugin.write_text(TAKES.format(name="log_likelihood"), encoding="utf-8")
    with pytest.raises(StealthEvalError) as e:
        load_plugins([plugin])
    assert str(e.value) == (f"--plugin {plugin}: registers detector 'log_likelihood', a name stealth_eval.detectors "
                            "already registers; give it another name")
    assert DETECTORS.get("log_likelihood") is before and components._module_name(plugin) not in sys.modules


def test_the_same_plugin_imported_under_two_names_is_not_a_conflict(tmp_path, monkeypatch):
    "A plugin file also imported as a module (two module objects, one definition) registers its detector once, quietly."
    plugin = tmp_path / "twice_plugin_issue25.py"
    plugin.write_text(TAKES.format(name="twice_issue25"), encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert load_plugins([plugin, "twice_plugin_issue25"]) == [str(plugin), "twice_plugin_issue25"]
        assert DETECTORS.get("twice_issue25").name == "twice_issue25"
    finally:
        DETECTORS.entries.pop("twice_issue25", None)
        sys.modules.pop("twice_plugin_issue25", None); sys.modules.pop(components._module_name(plugin), None)


def test_a_second_plugin_taking_the_first_plugins_name_is_refused(tmp_path):
    "Two plugins, one name: the second is refused with its file and the first plugin's, the first stays registered."
    first, second = tmp_path / "first_issue25.py", tmp_path / "second_issue25.py"
    first.write_text(TAKES.format(name="shared_issue25"), encoding="utf-8")
    second.write_text(TAKES.format(name="shared_issue25").replace("class Mine", "class Other"), encoding="utf-8")
    try:
        with pytest.raises(StealthEvalError) as e:
            load_plugins([first, second])
        assert str(e.value) == (f"--plugin {second}: registers detector 'shared_issue25', a name {first} already registers; "
                                "give it another name")
        assert type(DETECTORS.get("shared_issue25")).__qualname__ == "Mine"
    finally:
        DETECTORS.entries.pop("shared_issue25", None)
        for f in (first, second): sys.modules.pop(components._module_name(f), None)


def test_a_dataset_name_that_files_and_figures_cannot_carry_is_refused_before_the_run(tmp_path, monkeypatch):
    "Before: the name reached the figures stage (titles, file names, LaTeX) after all the work. Now: one line first."
    f = write(tmp_path / "my data$1.jsonl")
    msg = refused_before_the_run([f], tmp_path, monkeypatch)
    assert "the dataset name 'my data$1'" in msg and "may hold only letters, digits" in msg, msg
