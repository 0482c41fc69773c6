"""A run folder holds one run (issue #25.2): a rerun into the same `--out_dir` sets the earlier run's files aside;
one run at a time (issue #37.1): a second run into a folder in use is refused, naming the first's pid; a user's file is
never overwritten (#37.2): one named like an artifact is refused before the run; a relative `--out_dir` is taken from
the current folder (#37.4).

Stand-in stage notebooks (`--nbs_dir`) make each run take seconds through the real runner, papermill and kernels:
the figures stage draws one file per dataset of the run, so a rerun with fewer datasets would, without the set-aside,
still show the earlier run's figure. The refusals come before any stage: no run is made for them.
"""
import json
import subprocess
import sys
import time
from pathlib import Path

from conftest import ROOT, cli_env, one_error_line, run_cli

from stealth_eval.run import RUN_LOCK

STAGES = ["00_data", "10_methods", "20_detectors", "30_calibration_metrics", "40_figures"]


def _stand_in_stages(d: Path, crash_in: str | None = None, hold_in: str | None = None, until: Path | None = None) -> Path:
    """Five stage notebooks; 40_figures writes figures/<dataset>.png per dataset of the run; `crash_in` raises midway;
    `hold_in` waits there until the file `until` exists (two minutes at most)."""
    import nbformat
    d.mkdir(parents=True, exist_ok=True)
    for nb in STAGES:
        cells = [nbformat.v4.new_code_cell("#| hide\nimport json\nfrom pathlib import Path"),
                 nbformat.v4.new_code_cell('config_path: str = ""  # the run', metadata={"tags": ["parameters"]}),
                 nbformat.v4.new_code_cell("#| notest\ncfg = json.loads(Path(config_path).read_text())\nout = Path(config_path).parent")]
        if nb == "00_data":
            cells.append(nbformat.v4.new_code_cell('#| notest\n(out / "data").mkdir(exist_ok=True)\n'
                                                   'for ds in cfg["datasets"]: (out / "data" / f"{ds[\'name\']}.jsonl").write_text("{}")'))
        if nb == hold_in:
            cells.append(nbformat.v4.new_code_cell(f'#| notest\nimport time\nt0 = time.time()\n'
                                                   f'while not Path({str(until)!r}).exists() and time.time() - t0 < 120: time.sleep(0.1)'))
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
        f"{RUN_LOCK}.lock", "config.json", "data/lee_news.jsonl", "figures/lee_news.png", "metrics.json", "my_notes.txt",
        "run.log", "run_info.json"], names
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


def test_a_second_run_into_a_folder_in_use_is_refused_naming_the_first(tmp_path):
    """Two runs into one --out_dir: the second moved the first's files into .previous_run/ and the first died in its
    next stage. Now the second is refused in one line naming the first's pid, and the first finishes untouched."""
    go, out = tmp_path / "go", tmp_path / "run"
    nbs = _stand_in_stages(tmp_path / "nbs", hold_in="10_methods", until=go)
    args = ["--profile", "tiny", "--nbs_dir", nbs, "--no_cache", "--out_dir", out, "--datasets", "lee_news"]
    first = subprocess.Popen([sys.executable, "-m", "stealth_eval.run", *map(str, args)], cwd=ROOT, env=cli_env(),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline, stage = time.time() + 300, None
        while time.time() < deadline and first.poll() is None and stage != "ok":   # the first is inside 10_methods
            try: stage = json.loads((out / "run_info.json").read_text())["stages"].get("00_data", {}).get("status")
            except (OSError, ValueError): pass
            time.sleep(0.2)
        assert stage == "ok", "the first run did not reach its second stage"
        line = one_error_line(run_cli(*args, check=False))
        assert line == (f"stealth-eval: error: --out_dir {out}: another run is writing into this folder (pid {first.pid}, "
                        f"since {json.loads((out / f'{RUN_LOCK}.holder').read_text())['since']}); wait for it to end or "
                        f"choose another --out_dir"), line
        assert (out / "data" / "lee_news.jsonl").exists() and not (out / ".previous_run").exists()
    finally:
        go.write_text("go")
        _, err = first.communicate(timeout=300)
    assert first.returncode == 0, err[-3000:]
    info = json.loads((out / "run_info.json").read_text())
    assert info["finished"] and "figures/lee_news.png" in info["files"]
    assert not (out / f"{RUN_LOCK}.holder").exists()                  # released: the next run may start


def test_the_lock_of_a_killed_run_blocks_nothing(tmp_path):
    """A run killed with SIGKILL leaves its lock file and holder record behind: the kernel dropped the lock with the
    process, so the next run takes it (and here goes on to its next check, which refuses a user's file)."""
    out = tmp_path / "run"
    out.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom pathlib import Path\nfrom stealth_eval.run import run_lock\n"
                               "with run_lock(Path(sys.argv[1])):\n    print('held', flush=True); time.sleep(600)", str(out)],
                              cwd=ROOT, env=cli_env(), stdout=subprocess.PIPE, text=True)
    try: assert holder.stdout.readline() == "held\n"
    finally: holder.kill(); holder.wait()
    assert (out / f"{RUN_LOCK}.lock").exists() and json.loads((out / f"{RUN_LOCK}.holder").read_text())["pid"] == holder.pid
    (out / "metrics.json").write_text("{}")                             # checked only once the lock is held
    line = one_error_line(run_cli("--profile", "tiny", "--out_dir", out, check=False))
    assert "'metrics.json' is named like a file a run writes" in line and "another run" not in line, line


def test_a_users_files_named_like_artifacts_are_refused_before_the_run(tmp_path):
    """A user's metrics.json and tables/table_main_<dataset>.md in an empty --out_dir were overwritten by the first run
    and, after a rerun with another dataset, the old table stayed outside .previous_run/. Now: refused, naming them."""
    out = tmp_path / "run"
    mine = {"metrics.json": '{"mine": true}', "tables/table_main_lee_news.md": "| my | table |", "my_notes.txt": "notes"}
    for rel, text in mine.items(): (out / rel).parent.mkdir(parents=True, exist_ok=True); (out / rel).write_text(text)
    line = one_error_line(run_cli("--profile", "tiny", "--out_dir", out, check=False))
    assert f"--out_dir {out}: 'metrics.json', 'tables/table_main_lee_news.md' are named like files a run writes" in line, line
    assert "my_notes.txt" not in line
    assert {p.relative_to(out).as_posix(): p.read_text() for p in out.rglob("*") if p.is_file() and RUN_LOCK not in p.name} == mine


def test_a_relative_out_dir_is_taken_from_the_current_folder(tmp_path):
    "`--out_dir rel` from another folder named rel/ under the project root; it is the current folder's rel/."
    (tmp_path / "rel").mkdir()
    (tmp_path / "rel" / "metrics.json").write_text("{}")                # refused there: the run stops before any stage
    p = subprocess.run([sys.executable, "-m", "stealth_eval.run", "--profile", "tiny", "--out_dir", "rel"], cwd=tmp_path,
                       env=cli_env(), capture_output=True, text=True, timeout=300)
    assert one_error_line(p).startswith(f"stealth-eval: error: --out_dir {tmp_path / 'rel'}: 'metrics.json' is named like"), p.stderr
    assert not (ROOT / "rel").exists()
