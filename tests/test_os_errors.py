"""Operating-system errors are the user's machine, not a bug (issue #50.6): a run-folder lock path that is a folder, a
`preflight --out_dir` naming a file, a name over 255 bytes, a disk that fills up after two stages. Each is one line
naming the path and the problem, exit 2, never "internal error (a bug)"; the executed notebook is written whole or not
at all (a temporary file renamed into place), and what finished is kept. A refused run leaves no lock file behind.

The refusals come before any stage (a second or two each). The full disk is a run of stand-in stages (`--nbs_dir`,
seconds) whose third stage meets it: in the runner, through a `sitecustomize` on PYTHONPATH that fills the disk halfway
through the second write of that stage's notebook (every later write under the run folder fails too); in the stage's
own kernel, as the `OSError` a full disk raises there.
"""
import json
import os
import re
import textwrap
from pathlib import Path

import nbformat
import pytest

from conftest import ROOT, cli_env, one_error_line, run_cli
from test_run_folder import _stand_in_stages

from stealth_eval.run import RUN_LOCK

LONG = "é" * 130   # 130 characters, 260 bytes in UTF-8: over the 255 bytes a name may have


def test_a_lock_path_that_is_a_folder_is_one_line(tmp_path):
    out = tmp_path / "run"
    (out / f"{RUN_LOCK}.lock").mkdir(parents=True)
    line = one_error_line(run_cli("--profile", "tiny", "--out_dir", out, check=False))
    assert line == (f"stealth-eval: error: --out_dir {out}: cannot take the run folder's lock: {out / RUN_LOCK}.lock: "
                    f"Is a directory, where a file is expected; move it away or choose another --out_dir"), line


def test_preflight_out_dir_naming_a_file_is_one_line(tmp_path):
    mine = tmp_path / "notes.txt"
    mine.write_text("mine")
    line = one_error_line(run_cli("preflight", "--out_dir", mine, check=False), "preflight")
    assert line == f"stealth-eval preflight: error: --out_dir {mine}: exists and is not a folder", line
    assert mine.read_text() == "mine"


@pytest.mark.parametrize("flag", ["--out_dir", "--cache_dir", "--datasets"])
def test_a_name_over_255_bytes_is_one_line(tmp_path, flag):
    long = tmp_path / LONG
    given = {"--out_dir": tmp_path / "run", "--cache_dir": tmp_path / "store", flag: long}
    if flag == "--datasets": long = given[flag] = tmp_path / f"{LONG}.jsonl"
    line = one_error_line(run_cli("--profile", "tiny", *[x for k, v in given.items() for x in (k, v)], check=False))
    words = (f"File name too long: the name '{LONG[:24]}…' is {len(os.fsencode(long.name))} bytes, over this file "
             f"system's limit of 255 bytes for a name")
    want = {"--datasets": f"stealth-eval: error: {long}: {words}"}.get(flag, f"stealth-eval: error: {flag} {long}: {words}")
    assert line == want, line
    assert not (tmp_path / "run").exists()                              # refused before the run folder was made


def test_a_subcommand_meets_a_name_over_255_bytes_in_one_line(tmp_path):
    line = one_error_line(run_cli("cache", "verify", "--cache_dir", tmp_path / LONG, check=False), "cache")
    assert line.startswith(f"stealth-eval cache: error: {tmp_path / LONG}: File name too long: the name "), line


def test_a_refused_run_leaves_no_lock_file(tmp_path):
    "A user's file named like an artifact: refused under the lock, which the refused run took and now removes."
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.json").write_text('{"mine": true}')
    one_error_line(run_cli("--profile", "tiny", "--out_dir", out, check=False))
    assert sorted(p.name for p in out.iterdir()) == ["metrics.json"]
    p = run_cli("--profile", "tiny", "--out_dir", tmp_path / "bad", "--set", "validity.min_words=many", check=False)
    assert p.returncode == 2 and not (tmp_path / "bad").exists(), p.stderr[-2000:]   # a bad setting: no folder at all


FULL_DISK = textwrap.dedent('''
    """A disk that fills up in the run's runner process: halfway through the SE_FULL_AT-th write of the notebook
    SE_FULL_NB under SE_FULL_OUT, and for every write under SE_FULL_OUT after it (a write raises ENOSPC)."""
    import builtins, errno, os
    _OUT = os.path.realpath(os.environ["SE_FULL_OUT"]) + os.sep
    _NB, _AT = os.environ["SE_FULL_NB"], int(os.environ["SE_FULL_AT"])
    _state = {"writes": 0, "full": False}

    class _Full:
        def __init__(self, f): self._f = f
        def write(self, data):
            self._f.write(data[: len(data) // 2]); self._f.flush()
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        def __enter__(self): return self
        def __exit__(self, *exc): self._f.close()
        def __getattr__(self, name): return getattr(self._f, name)

    def _fills(path, mode) -> bool:
        if not any(m in mode for m in "wax+"): return False
        path = os.path.realpath(path)
        if not path.startswith(_OUT): return False
        name = os.path.basename(path)
        if name == _NB or (name.startswith("." + _NB + ".") and name.endswith(".tmp")):
            _state["writes"] += 1
            _state["full"] = _state["full"] or _state["writes"] >= _AT
        return _state["full"]

    _open, _fdopen = builtins.open, os.fdopen
    def _open_full(file, mode="r", *a, **k):
        f = _open(file, mode, *a, **k)
        return _Full(f) if isinstance(file, (str, os.PathLike)) and _fills(os.fspath(file), mode) else f
    def _fdopen_full(fd, mode="r", *a, **k):
        f = _fdopen(fd, mode, *a, **k)
        try: path = os.readlink(f"/proc/self/fd/{fd}")
        except OSError: return f
        return _Full(f) if _fills(path, mode) else f
    builtins.open, os.fdopen = _open_full, _fdopen_full
''')


def _stand_in_run(tmp_path, nbs, env=None):
    import subprocess, sys
    out = tmp_path / "run"
    p = subprocess.run([sys.executable, "-m", "stealth_eval.run", "--profile", "tiny", "--nbs_dir", str(nbs), "--no_cache",
                        "--out_dir", str(out), "--datasets", "lee_news"], cwd=ROOT, env={**cli_env(), **(env or {})},
                       capture_output=True, text=True, timeout=600)
    return p, out


LOG_LINE = re.compile(r"^\d\d:\d\d:\d\d (DEBUG|INFO|WARNING) ")   # the runner's and the stages' log lines


def _the_line(p) -> str:
    "Exit 2 and exactly one line besides the log, no traceback: that line."
    extra = [l for l in p.stderr.splitlines() if l.strip() and not LOG_LINE.match(l)]
    assert p.returncode == 2 and len(extra) == 1 and "Traceback" not in p.stderr, (p.returncode, p.stderr[-3000:])
    return extra[0]


def _kept(out: Path):
    "The first two stages finished: their notebooks whole, their files there, run_info.json saying so; no torn file."
    for nb in ("00_data", "10_methods"):
        assert nbformat.read(str(out / "notebooks" / f"{nb}.ipynb"), as_version=4).cells
    assert (out / "data" / "lee_news.jsonl").read_text() == "{}"
    stages = json.loads((out / "run_info.json").read_text())["stages"]
    assert [stages[s]["status"] for s in ("00_data", "10_methods")] == ["ok", "ok"], stages
    assert not [p for p in out.rglob("*.tmp")]
    if (out / "notebooks" / "20_detectors.ipynb").exists():              # the last whole version, never a torn one
        nbformat.read(str(out / "notebooks" / "20_detectors.ipynb"), as_version=4)


def test_a_disk_full_while_the_runner_writes_a_notebook(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(FULL_DISK)
    env = {"PYTHONPATH": os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])]),
           "SE_FULL_OUT": str(tmp_path / "run"), "SE_FULL_NB": "20_detectors.ipynb", "SE_FULL_AT": "2"}
    p, out = _stand_in_run(tmp_path, _stand_in_stages(tmp_path / "nbs"), env)
    line = _the_line(p)
    nb = out / "notebooks" / "20_detectors.ipynb"
    m = re.fullmatch(rf"stealth-eval: error: stage 20_detectors failed: {re.escape(str(nb))}: No space left on device "
                     rf"\((\d+(?:\.\d)?) (bytes|KiB) to write, \d+(\.\d)? (bytes|KiB|MiB|GiB|TiB) free there\); free some space "
                     rf"or write elsewhere, then run the same command again; the stages before it finished and their files "
                     rf"are kept in {re.escape(str(out))}", line)
    assert m, line
    _kept(out)


def test_a_disk_full_inside_a_stage_is_one_line(tmp_path):
    "The stage's own write fails (the kernel's OSError, as pyarrow words it): one line, exit 2, naming the stage."
    nbs = _stand_in_stages(tmp_path / "nbs")
    path = nbs / "20_detectors.ipynb"
    nb = nbformat.read(str(path), as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell('#| notest\nimport errno, os\n(out / "scores.parquet").write_text("")\n'
                                              'raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(out / "scores.parquet"))'))
    nbformat.write(nb, str(path))
    p, out = _stand_in_run(tmp_path, nbs)
    line = _the_line(p)
    assert re.fullmatch(rf"stealth-eval: error: stage 20_detectors failed: {re.escape(str(out / 'scores.parquet'))}: No space "
                        rf"left on device \(\d+(\.\d)? (bytes|KiB|MiB|GiB|TiB) free there\); free some space or write "
                        rf"elsewhere, then run the same command again; the stages before it finished and their files are "
                        rf"kept in {re.escape(str(out))} \(the executed notebook: {re.escape(str(out / 'notebooks' / '20_detectors.ipynb'))}\)",
                        line), line
    _kept(out)
    assert json.loads((out / "run_info.json").read_text())["stages"]["20_detectors"]["status"] == "failed"
