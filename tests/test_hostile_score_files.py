"""Hostile scores files (issue #37): keys that name no one text, a file that changes under the run, paths and names that
used to crash late, numbers a strict reader refuses. Each is refused before the run (or, for keys that need the run's
texts, right after the data stage) in one line naming the file and the row, or is read once and kept.

The runner is driven through `run_pipeline` with papermill replaced by in-process stand-ins for the stages: the data
stage (`run_data_stage`, no model for dataset files) and a scoring stage that loads `config.json` as a stage kernel does
(its own process: nothing parsed before is reused) and computes the scores-file detector. No model is loaded.
"""
import json
from pathlib import Path

import pytest

from stealth_eval import score_files as sf
from stealth_eval.components import DETECTORS
from stealth_eval.config import load_config
from stealth_eval.core import StealthEvalError, sha256_bytes, sha256_text
from stealth_eval.run import run_pipeline

W = "word " * 12


def _dataset(path: Path, texts: dict) -> Path:
    "A dataset file: id -> text, alternating labels."
    recs = [{"id": i, "label": ("human", "ai")[k % 2], "domain": "news", "generator": "g", "text": t}
            for k, (i, t) in enumerate(texts.items())]
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


class _Stages:
    """Stand-ins for the stage kernels: 00_data writes the data; every other stage loads config.json as a fresh kernel
    would (the scores files' parsed content and bytes forgotten) and `hooks[stage](cfg)` runs there."""
    def __init__(self, hooks=None): self.hooks, self.seen = hooks or {}, []

    def __call__(self, src, dst, parameters=None, **kw):
        nb = Path(dst).stem
        self.seen.append(nb)
        memo = [getattr(sf, n, {}) for n in ("_CONTENT", "_READ")]   # what this process parsed and read
        runner = [dict(m) for m in memo], DETECTORS.entries.get("scores:ext")
        for m in memo: m.clear()                              # a stage kernel is its own process
        try:
            cfg = load_config(parameters["config_path"])
            if nb == "00_data":
                from stealth_eval.data import run_data_stage
                run_data_stage(cfg)
            if nb in self.hooks: self.hooks[nb](cfg)
        finally:                                              # the runner's process, as it was
            for m, kept in zip(memo, runner[0]): m.clear(); m.update(kept)
            if runner[1] is not None: DETECTORS.entries["scores:ext"] = runner[1]
        Path(dst).parent.mkdir(parents=True, exist_ok=True)
        Path(dst).write_text("{}")


def _run(tmp_path, monkeypatch, datasets, detectors, hooks=None, overrides=None):
    import papermill
    stages = _Stages(hooks)
    monkeypatch.setattr(papermill, "execute_notebook", stages)
    monkeypatch.setattr("stealth_eval.run.stage_engine", lambda: None, raising=False)
    out = tmp_path / "run"
    run_pipeline("tiny", datasets=[str(d) for d in datasets], methods=["m0"], detectors=detectors, out_dir=str(out),
                 overrides={"device": "cpu", **(overrides or {})}, nbs_dir=None)
    return out, stages


def _scores(cfg, name="scores:ext") -> dict:
    "{text: score or None} of the detector over the run's dataset texts, computed as the scoring stage does."
    texts = [json.loads(l)["text"] for p in sorted((Path(cfg["out_dir"]) / "data").glob("*.jsonl")) if not p.name.endswith(".train.jsonl")
             for l in p.read_text().splitlines() if l.strip()]
    got = DETECTORS.get(name).compute(texts, cfg, None)
    return {t: (None if got[sha256_text(t)] is None else got[sha256_text(t)]["score"]) for t in texts}


# 1. keys name one text of one dataset

def test_ids_shared_by_two_datasets_are_refused_unless_a_dataset_column_chooses(tmp_path, monkeypatch):
    """Before: an id-keyed row scored the text with that id in *every* dataset of the run (b's text got a's 0.91).
    Now: the run stops right after the data stage, naming the row; with a `dataset` column, only a's text is scored."""
    a = _dataset(tmp_path / "a.jsonl", {"x": "alpha " + W, "y": "beta " + W})
    b = _dataset(tmp_path / "b.jsonl", {"x": "gamma " + W, "z": "delta " + W})
    f = tmp_path / "ext.csv"
    f.write_text("id,score,direction\nx,0.91,1\ny,0.2,1\n")
    with pytest.raises(StealthEvalError) as e:
        _run(tmp_path, monkeypatch, [a, b], [f"scores:{f}"])
    assert str(e.value) == f"{f}: row 1: id 'x' names different texts in datasets a, b of this run; add a 'dataset' column naming one"
    f.write_text("id,dataset,score,direction\nx,a,0.91,1\ny,a,0.2,1\n")
    got = {}
    _run(tmp_path, monkeypatch, [a, b], [f"scores:{f}"], hooks={"20_detectors": lambda cfg: got.update(_scores(cfg))})
    assert got == {"alpha " + W: 0.91, "beta " + W: 0.2, "gamma " + W: None, "delta " + W: None}


def test_a_raid_file_scores_only_its_own_texts(tmp_path, monkeypatch):
    "RAID's layout: a null score is a text the detector left out; it stays unscored, whatever another dataset holds."
    a = _dataset(tmp_path / "a.jsonl", {"r1": "alpha " + W, "r2": "beta " + W})
    b = _dataset(tmp_path / "b.jsonl", {"r1": "gamma " + W, "r2": "delta " + W})   # b shares a's ids, not its texts
    f = tmp_path / "ext.json"
    f.write_text(json.dumps([{"id": "r1", "dataset": "a", "score": 0.91}, {"id": "r2", "dataset": "a", "score": None}]))
    got = {}
    _run(tmp_path, monkeypatch, [a, b], [f"raid:{f}"], hooks={"20_detectors": lambda cfg: got.update(_scores(cfg))})
    assert got == {"alpha " + W: 0.91, "beta " + W: None, "gamma " + W: None, "delta " + W: None}


@pytest.mark.parametrize("rows, says", [
    (lambda: [("x", "a", sha256_text("gamma " + W), 0.5)], "row 1: id 'x' (dataset a) is a text whose SHA-256 is"),
    (lambda: [("x", "a", "", 0.5), ("", "", sha256_text("alpha " + W), 0.7)],
     "row 2: scores the text that row 1 scores, differently (0.7 here, 0.5 there)"),
    (lambda: [("x", "c", "", 0.5)], "row 1: dataset 'c' is not a dataset of this run (its datasets: a, b)"),
])
def test_keys_that_name_another_text_are_refused_with_the_row(rows, says, tmp_path, monkeypatch):
    a = _dataset(tmp_path / "a.jsonl", {"x": "alpha " + W, "y": "beta " + W})
    b = _dataset(tmp_path / "b.jsonl", {"x": "gamma " + W, "z": "delta " + W})
    f = tmp_path / "ext.csv"
    f.write_text("id,dataset,text_sha256,score,direction\n" + "".join(f"{i},{d},{h},{s},1\n" for i, d, h, s in rows()))
    with pytest.raises(StealthEvalError) as e:
        _run(tmp_path, monkeypatch, [a, b], [f"scores:{f}"])
    assert str(e.value).startswith(f"{f}: {says}"), str(e.value)
    assert "\n" not in str(e.value)


# 2. read once, verified, kept

def test_the_file_is_read_once_and_the_run_uses_its_kept_copy(tmp_path, monkeypatch):
    """Before: the file was read again by every stage: rewritten between stages, its new content was used; moved away
    after the scoring stage, the next stage failed. Now: the bytes read before the run are kept in the run folder
    (named by their SHA-256), every stage reads that copy, and a change of the user's file is logged, never used."""
    a = _dataset(tmp_path / "a.jsonl", {"x": "alpha " + W, "y": "beta " + W})
    f = tmp_path / "ext.csv"
    first = b"id,score,direction\nx,0.91,1\ny,0.2,1\n"
    f.write_bytes(first)
    got, later = {}, []
    def rewrite(cfg): f.write_text("id,score,direction\nx,0.0,1\ny,0.0,1\n")
    def score(cfg): got.update(_scores(cfg)); f.rename(tmp_path / "moved.csv")
    def after(cfg): later.append(DETECTORS.get("scores:ext").model(cfg))
    hooks = {"10_methods": rewrite, "20_detectors": score, "30_calibration_metrics": after, "40_figures": after}
    out, stages = _run(tmp_path, monkeypatch, [a], [f"scores:{f}"], hooks=hooks)
    assert stages.seen == ["00_data", "10_methods", "20_detectors", "30_calibration_metrics", "40_figures"]
    assert got == {"alpha " + W: 0.91, "beta " + W: 0.2}                          # the bytes read before the run
    sha = sha256_bytes(first)
    copy = out / "score_files" / f"{sha}.csv"
    assert copy.read_bytes() == first
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["score_files"] == {"ext": str(copy)}
    entry = json.loads((out / "score_files" / "manifest.json").read_text())[copy.name]
    assert (entry["source"], entry["sha256"], entry["bytes"], entry["direction"]) == (str(f), sha, len(first), 1)
    assert later == [f"scores file ext.csv@sha256:{sha[:16]}"] * 2                  # stages 30 and 40: the file is gone
    assert f"score_files/{copy.name}" in json.loads((out / "run_info.json").read_text())["files"]
    log = (out / "run.log").read_text()
    assert f"scores:ext: {f} changed since the run read it; the run goes on with what it read then (sha256 {sha[:16]}..." in log
    assert f"scores:ext: {f} is gone since the run read it" in log


def test_two_files_with_the_same_bytes_keep_their_own_names(tmp_path, monkeypatch):
    """Two scores files with identical bytes share one kept copy; each detector still names its own file (and its own
    stat): before, the manifest held the last file's source, so `scores:a` read "scores file b.csv" in every table."""
    a = _dataset(tmp_path / "a.jsonl", {"x": "alpha " + W, "y": "beta " + W})
    files = [tmp_path / "a.csv", tmp_path / "b.csv"]
    for f in files: f.write_text("id,score,direction\nx,0.91,1\ny,0.2,1\n")
    models = {}
    def after(cfg): models.update({n: DETECTORS.get(n).model(cfg) for n in ("scores:a", "scores:b")})
    out, _ = _run(tmp_path, monkeypatch, [a], [f"scores:{f}" for f in files], hooks={"30_calibration_metrics": after})
    sha = sha256_bytes(files[0].read_bytes())
    assert models == {"scores:a": f"scores file a.csv@sha256:{sha[:16]}", "scores:b": f"scores file b.csv@sha256:{sha[:16]}"}
    entry = json.loads((out / "score_files" / "manifest.json").read_text())[f"{sha}.csv"]
    assert {n: e["source"] for n, e in entry["by_name"].items()} == {"a": str(files[0]), "b": str(files[1])}


def test_a_kept_copy_that_changed_is_refused(tmp_path, monkeypatch):
    a = _dataset(tmp_path / "a.jsonl", {"x": "alpha " + W, "y": "beta " + W})
    f = tmp_path / "ext.csv"
    f.write_text("id,score,direction\nx,0.91,1\n")
    def tamper(cfg):
        copy = Path(cfg["score_files"]["ext"])
        copy.write_text("id,score,direction\nx,0.1,1\n")
        _scores(cfg)
    with pytest.raises(StealthEvalError, match=r"its SHA-256 is .*, not the .* read before the run: the run's copy of a scores file changed"):
        _run(tmp_path, monkeypatch, [a], [f"scores:{f}"], hooks={"20_detectors": tamper})


def test_the_users_file_is_opened_once_and_the_copy_only_by_the_stage_that_scores(tmp_path, monkeypatch):
    """Before: every stage read (and parsed) the whole file again, a 200 MB file five times. Now: the user's file is
    opened once, before the run; a stage registers the detector from the manifest, and only the stage that scores
    reads the kept copy (verified by its SHA-256)."""
    import builtins
    a = _dataset(tmp_path / "a.jsonl", {"x": "alpha " + W, "y": "beta " + W})
    f = tmp_path / "ext.csv"
    f.write_text("id,score,direction\nx,0.91,1\n")
    opened = []
    monkeypatch.setattr(sf, "open", lambda p, *a, **k: opened.append(Path(p).name) or builtins.open(p, *a, **k), raising=False)
    out, _ = _run(tmp_path, monkeypatch, [a], [f"scores:{f}"], hooks={"20_detectors": _scores})
    assert opened == ["ext.csv", f"{sha256_bytes(f.read_bytes())}.csv"], opened


def test_a_rerun_reads_the_raid_file_its_previous_run_wrote_into_the_same_folder(tmp_path, monkeypatch):
    """Before: the rerun's first step set the previous run's raid_predictions/ aside, and the scoring stage then failed on
    the file it had checked a moment before. Now: the bytes were read before, and the run scores from its copy."""
    a = _dataset(tmp_path / "a.jsonl", {"x": "alpha " + W, "y": "beta " + W})
    out, _ = _run(tmp_path, monkeypatch, [a], ["log_rank"])
    pred = out / "raid_predictions" / "a" / "d.json"
    pred.parent.mkdir(parents=True)
    pred.write_text(json.dumps([{"id": "x", "score": 0.91}, {"id": "y", "score": None}]))
    info = json.loads((out / "run_info.json").read_text())
    (out / "run_info.json").write_text(json.dumps({**info, "files": info["files"] + ["raid_predictions/a/d.json"]}))
    got = {}
    out, _ = _run(tmp_path, monkeypatch, [a], [f"raid:{pred}"], hooks={"20_detectors": lambda cfg: got.update(_scores(cfg, "scores:d"))})
    assert not pred.exists() and (out / ".previous_run" / "raid_predictions" / "a" / "d.json").is_file()
    assert got == {"alpha " + W: 0.91, "beta " + W: None}


# 3. refused before the run, not a late traceback

def test_a_symlink_loop_is_refused_in_one_line(tmp_path, monkeypatch):
    a = _dataset(tmp_path / "a.jsonl", {"x": "alpha " + W, "y": "beta " + W})
    loop = tmp_path / "loop.csv"
    loop.symlink_to(loop)
    for det in (f"scores:{loop}", f"raid:{loop}"):
        with pytest.raises(StealthEvalError, match=r"loop\.csv: cannot be resolved \(a symlink loop\)$"):
            _run(tmp_path, monkeypatch, [a], [det])
    with pytest.raises(StealthEvalError, match=r"score_files\.x: .*loop\.csv: cannot be resolved \(a symlink loop\)$"):
        _run(tmp_path, monkeypatch, [a], ["scores:x"], overrides={"score_files.x": str(loop)})
    assert not (tmp_path / "run" / "config.json").exists()


def test_a_symlink_loop_on_the_command_line_exits_2_in_one_line(tmp_path):
    "Before: a RuntimeError traceback and exit 1 (an internal error). Now: exit 2, one line."
    from conftest import run_cli
    loop = tmp_path / "loop.csv"
    loop.symlink_to(loop)
    p = run_cli("--profile", "tiny", "--detectors", f"scores:{loop}", "--out_dir", tmp_path / "run", check=False)
    assert p.returncode == 2, p.stderr[-2000:]
    assert p.stderr.strip().splitlines()[-1] == f"stealth-eval: error: --detectors scores:{loop}: {loop}: cannot be resolved (a symlink loop)"
    assert "Traceback" not in p.stderr


@pytest.mark.parametrize("detectors, overrides, says", [
    (lambda f: [f"scores:{f}", f"scores:{f}"], {}, "--detectors: scores:ext is named twice; name each scores file once"),
    (lambda f: [f"scores:{f}", "scores:again"], lambda f: {"score_files.again": str(f)},
     "the same scores file is named twice (scores:again and scores:ext); name it once"),
    (lambda f: [f"scores:{f}", f"raid:{f.parent / 'link.json'}"], {}, "the same scores file is named twice"),
])
def test_the_same_file_named_twice_is_refused(detectors, overrides, says, tmp_path, monkeypatch):
    "Before: its rows were in scores.parquet twice (two detectors, or one detector twice)."
    a = _dataset(tmp_path / "a.jsonl", {"x": "alpha " + W, "y": "beta " + W})
    f = tmp_path / "ext.json"
    f.write_text(json.dumps([{"id": "x", "score": 0.5, "direction": 1}]))
    (tmp_path / "link.json").symlink_to(f)
    ov = overrides(f) if callable(overrides) else overrides
    with pytest.raises(StealthEvalError) as e:
        _run(tmp_path, monkeypatch, [a], detectors(f), overrides=ov)
    assert says in str(e.value) and "\n" not in str(e.value)


# 4. one strict reader: numbers, columns and directions a strict reader refuses, in every format

def _parquet(path, cols: dict):
    import pyarrow as pa, pyarrow.parquet as pq
    pq.write_table(pa.table(cols), path)


LENIENT = {
    # name: (file name, content, the one line's end)
    "JSON NaN": ("f.json", '[{"id": "x", "score": NaN, "direction": 1}]', "item 1: score NaN is not JSON"),
    "JSON Infinity": ("f.jsonl", '{"id": "x", "score": Infinity, "direction": 1}\n', "line 1: score Infinity is not JSON"),
    "RAID NaN for null": ("raid.json", '[{"id": "x", "score": NaN}]', "item 1: score NaN is not JSON"),
    "RAID string": ("raid.json", '[{"id": "x", "score": "0.5"}]', "item 1: score '0.5' is a string, not a number"),
    "CSV '1e'": ("f.csv", "id,score,direction\nx,1e,1\n", "row 1: score '1e' is not a number as JSON writes one"),
    "CSV padded": ("f.csv", "id,score,direction\nx, 0.5 ,1\n", "row 1: score ' 0.5 ' is not a number"),
    "CSV hex": ("f.csv", "id,score,direction\nx,0x1p-2,1\n", "row 1: score '0x1p-2' is not a number"),
    "CSV underscore": ("f.csv", "id,score,direction\nx,1_000,1\n", "row 1: score '1_000' is not a number"),
    "CSV inf": ("f.csv", "id,score,direction\nx,inf,1\n", "row 1: score 'inf' is not a number"),
    "CSV overflow": ("f.csv", "id,score,direction\nx,1e400,1\n", "row 1: score '1e400' is not a finite number"),
    "JSON string score": ("f.jsonl", '{"id": "x", "score": "0.5", "direction": 1}\n', "line 1: score '0.5' is a string, not a number"),
    "Parquet string score": ("f.parquet", {"id": ["x"], "score": ["0.5"], "direction": [1]}, "row 1: score '0.5' is a string, not a number"),
    "Parquet NaN": ("f.parquet", {"id": ["x"], "score": [float("nan")], "direction": [1]}, "row 1: score nan is not a finite number"),
    "CSV repeated column": ("f.csv", "id,score,direction,score\nx,0.5,1,0.9\n", "column 'score' occurs twice in the header"),
    "JSON repeated key": ("f.json", '[{"id": "x", "score": 0.5, "score": 0.9, "direction": 1}]', "item 1: key 'score' occurs twice in one object"),
    "a row's direction against the file's": ("f.json", '{"direction": 1, "scores": [{"id": "x", "score": 0.5, "direction": -1}]}',
                                              "item 1: direction -1 contradicts the file's 'direction' (+1); one direction for the file"),
    "two directions in the column": ("f.csv", "id,score,direction\nx,0.5,1\ny,0.5,-1\n", "row 2: direction -1 contradicts row 1's direction (+1)"),
    "direction 1.0": ("f.csv", "id,score,direction\nx,0.5,1.0\n", "row 1: direction '1.0': must be +1 (higher = more AI) or -1 (higher = more human)"),
    "RAID direction -1": ("raid.json", '[{"id": "x", "score": 0.5, "direction": -1}]', "a RAID predictions file is higher = more machine (+1)"),
}


@pytest.mark.parametrize("kind", list(LENIENT))
def test_a_lenient_number_column_or_direction_is_refused_before_the_run(kind, tmp_path, monkeypatch):
    name, body, says = LENIENT[kind]
    f = tmp_path / name
    if isinstance(body, dict): _parquet(f, body)
    else: f.write_text(body)
    a = _dataset(tmp_path / "a.jsonl", {"x": "alpha " + W, "y": "beta " + W})
    with pytest.raises(StealthEvalError) as e:
        _run(tmp_path, monkeypatch, [a], [("raid:" if name.startswith("raid") else "scores:") + str(f)])
    assert str(e.value).startswith(f"{f}: ") and str(e.value).endswith(says) or says in str(e.value), str(e.value)
    assert "\n" not in str(e.value)
    assert not (tmp_path / "run" / "config.json").exists()


def test_strict_files_in_every_format_are_read_alike(tmp_path):
    "The same scores as JSON, JSONL, CSV and Parquet: one reader, one result."
    rows = [{"id": "x", "score": 0.5, "direction": 1}, {"id": "7", "score": -3, "direction": 1}, {"id": "y", "score": 1e-4, "direction": 1}]
    (tmp_path / "f.json").write_text(json.dumps(rows))
    (tmp_path / "f.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "f.csv").write_text("id,score,direction\nx,0.5,+1\n7,-3,1\ny,1e-4,1\n")
    _parquet(tmp_path / "f.parquet", {"id": ["x", "7", "y"], "score": [0.5, -3.0, 1e-4], "direction": [1, 1, 1]})
    got = {s: [r[2:] for r in sf.read_score_file(tmp_path / f"f{s}")["rows"]] for s in (".json", ".jsonl", ".csv", ".parquet")}
    assert all(v == [("x", None, 0.5), ("7", None, -3.0), ("y", None, 1e-4)] for v in got.values()), got


# 5. the benchmark readers of RAID-layout files (04_benchmarks: APT-Eval's CSVs, PADBen's and DetectRL's JSON)

def test_benchmark_readers_refuse_a_repeated_column_nan_and_ids_that_collide(tmp_path):
    """Before: pandas renamed a second 'model' column 'model.1' and the first was read; Python's json read NaN as a
    float; '007' passed as an id and became the original 7. Now each is refused in one line naming the file."""
    from stealth_eval.benchmarks import _apt_ids, _read_csv_rows, _read_json_rows
    c = tmp_path / "polished.csv"
    c.write_text("id,model,generation,model\n1,human,a,hybrid\n")
    with pytest.raises(StealthEvalError, match=r"polished\.csv: column\(s\) 'model' occur twice in the header; each column once$"):
        _read_csv_rows(c, ("id", "model"))
    j = tmp_path / "task2.json"
    j.write_text('[{"idx": 1, "sentence": "a", "label": 0}, {"idx": 2, "sentence": "b", "label": NaN}]')
    with pytest.raises(StealthEvalError, match=r"task2\.json: row 1: column 'label' holds NaN, which is not JSON"):
        _read_json_rows(j, ("idx", "sentence", "label"))
    with pytest.raises(StealthEvalError, match=r"polished\.csv: non-integer value\(s\) '007' in column 'id'"):
        _apt_ids(c, [{"id": "7"}, {"id": "007"}])


# 6. issue #50, item 5: ids a strict reader refuses

def test_ids_that_differ_only_by_white_space_around_them_are_refused_before_the_run(tmp_path):
    """Before: ' h0' and 'h0' were two ids; the run scored 'h0' with the second row's 0.6 and left the first row unused
    (an id is matched as written). Now the command line refuses the file in one line naming the rows, before any stage."""
    from conftest import one_error_line, run_cli
    a = _dataset(tmp_path / "a.jsonl", {"h0": "alpha " + W, "a0": "beta " + W})
    f = tmp_path / "ext.csv"
    f.write_text("id,score,direction\n h0,0.5,1\nh0,0.6,1\n")
    line = one_error_line(run_cli("--profile", "tiny", "--datasets", a, "--methods", "m0", "--detectors", f"scores:{f}",
                                  "--out_dir", tmp_path / "run", check=False, timeout=300))
    assert line.endswith(f"{f}: row 2: id 'h0' differs from row 1's id ' h0' only by white space around it; "
                         "an id is matched as written: give each text's id once, as its dataset writes it"), line
    assert not (tmp_path / "run" / "config.json").exists()


@pytest.mark.parametrize("file_id, run_id", [(" h0", "h0"), ("h0\t", "h0"), ("h0", " h0")])
def test_an_id_that_names_a_text_only_without_white_space_is_refused_after_the_data_stage(file_id, run_id, tmp_path, monkeypatch):
    "Before: the row named no text of the run and was left unused (an info line in run.log); the text had no score."
    a = _dataset(tmp_path / "a.jsonl", {run_id: "alpha " + W, "a0": "beta " + W})
    f = tmp_path / "ext.json"
    f.write_text(json.dumps([{"id": file_id, "score": 0.5, "direction": 1}, {"id": "a0", "score": 0.7, "direction": 1}]))
    with pytest.raises(StealthEvalError) as e:
        _run(tmp_path, monkeypatch, [a], [f"scores:{f}"])
    assert str(e.value) == (f"{f}: item 1: id {file_id!r} names no text of this run, but id {run_id!r} (dataset a) differs from it "
                            "only by white space around it; an id is matched as written"), str(e.value)


def test_an_id_with_white_space_that_the_dataset_writes_so_is_matched(tmp_path, monkeypatch):
    "An id is matched as written: a dataset's ' h0' is named by ' h0'; a row naming no text at all stays unused."
    a = _dataset(tmp_path / "a.jsonl", {" h0": "alpha " + W, "a0": "beta " + W})
    f = tmp_path / "ext.csv"
    f.write_text("id,score,direction\n h0,0.5,1\nzz,0.1,1\n")
    got = {}
    _run(tmp_path, monkeypatch, [a], [f"scores:{f}"], hooks={"20_detectors": lambda cfg: got.update(_scores(cfg))})
    assert got == {"alpha " + W: 0.5, "beta " + W: None}


def test_a_list_valued_parquet_id_is_refused_in_one_line(tmp_path):
    """A Parquet `id` column of lists: the row is refused (never the string "['h0']"), before any stage. (This held
    before issue #50 for scores files; the string "['h0']" came from a dataset file, 00_data's reader.)"""
    from conftest import one_error_line, run_cli
    a = _dataset(tmp_path / "a.jsonl", {"h0": "alpha " + W, "a0": "beta " + W})
    f = tmp_path / "ext.parquet"
    _parquet(f, {"id": [["h0"], ["a0"]], "score": [0.5, 0.7], "direction": [1, 1]})
    line = one_error_line(run_cli("--profile", "tiny", "--datasets", a, "--methods", "m0", "--detectors", f"scores:{f}",
                                  "--out_dir", tmp_path / "run", check=False, timeout=300))
    assert line.endswith(f"{f}: row 1: id [\"h0\"] is not a string or an integer (an id is written as one)"), line
    assert not (tmp_path / "run" / "config.json").exists()
