"""A run folder holds one run (issue #25.2): a rerun into the same `--out_dir` sets the earlier run's files aside.

Stand-in stage notebooks (`--nbs_dir`) make each run take seconds through the real runner, papermill and kernels:
the figures stage draws one file per dataset of the run, so a rerun with fewer datasets would, without the set-aside,
still show the earlier run's figure.
"""
import json
from pathlib import Path

from conftest import run_cli

STAGES = ["00_data", "10_methods", "20_detectors", "30_calibration_metrics", "40_figures"]


def _stand_in_stages(d: Path, crash_in: str | None = None) -> Path:
    "Five stage notebooks; 40_figures writes figures/<dataset>.png per dataset of the run; `crash_in` raises midway."
    import nbformat
    d.mkdir(parents=True, exist_ok=True)
    for nb in STAGES:
        cells = [nbformat.v4.new_code_cell("#| hide\nimport json\nfrom pathlib import Path"),
                 nbformat.v4.new_code_cell('config_path: str = ""  # the run', metadata={"tags": ["parameters"]}),
                 nbformat.v4.new_code_cell("#| notest\ncfg = json.loads(Path(config_path).read_text())\nout = Path(config_path).parent")]
        if nb == "00_data":
            cells.append(nbformat.v4.new_code_cell('#| notest\n(out / "data").mkdir(exist_ok=True)\n'
                                                   'for ds in cfg["datasets"]: (out / "data" / f"{ds[\'name\']}.jsonl").write_text("{}")'))
        if nb == crash_in:
            cells.append(nbformat.v4.new_code_cell('#| notest\n(out / "half_written.json").write_text("{}")\nraise ValueError("midway")'))
        if nb == "40_figures":
            cells.append(nbformat.v4.new_code_cell('#| notest\n(out / "figures").mkdir(exist_ok=True)\n'
                                                   'for ds in cfg["datasets"]: (out / "figures" / f"{ds[\'name\']}.png").write_text("png")\n'
                                                   '(out / "metrics.json").write_text("{}")'))
        nbformat.write(nbformat.v4.new_notebook(cells=cells, metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}),
                       str(d / f"{nb}.ipynb"))
    return d


def _names(folder: Path) -> list:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file() and "notebooks" not in p.relative_to(folder).parts)


def test_a_rerun_with_fewer_datasets_shows_only_its_own_files(tmp_path):
    nbs, out = _stand_in_stages(tmp_path / "nbs"), tmp_path / "run"
    out.mkdir()
    (out / "my_notes.txt").write_text("the user's")                 # there before any run: never moved
    (out / "rehearsal").mkdir()                                      # another run's folder nested inside
    (out / "rehearsal" / "run_info.json").write_text("{}")
    run_cli("--profile", "tiny", "--nbs_dir", nbs, "--no_cache", "--out_dir", out, "--datasets", "lee_news", "padben")
    assert {"figures/lee_news.png", "figures/padben.png", "data/padben.jsonl"} <= set(_names(out))
    p = run_cli("--profile", "tiny", "--nbs_dir", nbs, "--no_cache", "--out_dir", out, "--datasets", "lee_news")
    names = _names(out)
    assert "figures/padben.png" not in names and "data/padben.jsonl" not in names, names
    assert [n for n in names if not n.startswith((".previous_run/", "rehearsal/"))] == [
        "config.json", "data/lee_news.jsonl", "figures/lee_news.png", "metrics.json", "my_notes.txt", "run.log",
        "run_info.json"], names
    assert (out / ".previous_run" / "figures" / "padben.png").exists() and (out / "rehearsal" / "run_info.json").exists()
    assert "moved the previous run's" in p.stderr
    info = json.loads((out / "run_info.json").read_text())
    assert info["found"] == ["my_notes.txt"] and "my_notes.txt" not in info["files"]


def test_a_run_that_failed_midway_is_set_aside_whole(tmp_path):
    "A stage that fails after writing part of its output: the rerun still knows that file was the earlier run's."
    out = tmp_path / "run"
    p = run_cli("--profile", "tiny", "--nbs_dir", _stand_in_stages(tmp_path / "bad", crash_in="20_detectors"),
                "--no_cache", "--out_dir", out, "--datasets", "lee_news", "padben", check=False)
    assert p.returncode == 1, p.stderr[-3000:]
    assert (out / "half_written.json").exists()
    assert "half_written.json" in json.loads((out / "run_info.json").read_text())["files"]
    run_cli("--profile", "tiny", "--nbs_dir", _stand_in_stages(tmp_path / "good"), "--no_cache", "--out_dir", out,
            "--datasets", "lee_news")
    assert not (out / "half_written.json").exists() and (out / ".previous_run" / "half_written.json").exists()
    assert not (out / "data" / "padben.jsonl").exists()
