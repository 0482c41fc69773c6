"""The Ray engine (#15): the same artifacts as the local engine, a worker killed mid-stage costs nothing, and a missing
Ray fails before any stage. CPU only: the runner starts a local Ray instance (2 CPU workers on this machine)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, SMALL, same_artifacts
from stealth_eval.core import Cache, read_json, sha256_text

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install -e '.[ray]' (the dev extra installs it)")


def run_ray(*args, env_extra=None, timeout=2400):
    env = {**os.environ, "STEALTH_EVAL_PROGRESS": "0", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           **(env_extra or {})}
    env.pop("RAY_ADDRESS", None)
    return subprocess.run([sys.executable, "-m", "stealth_eval.run", *map(str, args)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_ray_run_with_a_worker_killed_during_scoring_writes_the_local_engines_artifacts(tmp_path, small_run_nocache):
    "Same seed, --engine ray with 2 workers, one actor killed in its first detector-scoring batch: byte-identical artifacts."
    out, marker = tmp_path / "ray_run", tmp_path / "killed-once"
    p = run_ray(*SMALL, "engine.workers=2",   # SMALL ends in --set: these two are more of its settings
                "engine.batch_size=8", "--out_dir", out, "--no_cache", "--engine", "ray",
                env_extra={"STEALTH_EVAL_RAY_FAULT": f"lm_panel:{marker}"})
    assert p.returncode == 0, p.stderr[-6000:]
    assert marker.exists(), "the fault hook never fired: no actor was killed"
    assert "engine ray" in p.stderr and "ray: joined" in p.stderr
    same_artifacts(out, small_run_nocache)
    cfg = read_json(out / "config.json")
    assert cfg["engine"]["name"] == "ray" and read_json(small_run_nocache / "config.json")["engine"]["name"] == "local"
    # every value was computed and stored by the driver once per key: the hit/miss counts equal the local run's
    for f in (small_run_nocache / "cache_stats").glob("*.json"):
        assert read_json(out / "cache_stats" / f.name) == read_json(f), f.name


def test_engine_ray_without_ray_fails_before_any_stage(tmp_path):
    "A `ray` that cannot be imported: one line naming the install command, exit 2, no stage started."
    fake = tmp_path / "fake"
    (fake / "ray").mkdir(parents=True)
    (fake / "ray" / "__init__.py").write_text("raise ImportError('No module named ray (hidden by the test)')\n")
    out = tmp_path / "run"
    p = run_ray("--profile", "tiny", "--out_dir", out, "--engine", "ray",
                env_extra={"PYTHONPATH": os.pathsep.join([str(fake), os.environ.get("PYTHONPATH", "")])}, timeout=300)
    assert p.returncode == 2, p.stderr[-3000:]
    err = [l for l in p.stderr.splitlines() if l.startswith("stealth-eval: error:")]
    assert len(err) == 1 and "needs Ray" in err[0] and 'pip install -e ".[ray]"' in err[0], p.stderr[-3000:]
    assert not (out / "notebooks").exists()


def test_engine_is_a_checked_setting():
    from stealth_eval.config import resolve_config
    from stealth_eval.schema import SettingsError
    cfg = resolve_config("tiny", overrides={"engine.name": "ray", "engine.workers": 3})
    assert cfg["engine"]["name"] == "ray" and cfg["engine"]["workers"] == 3
    with pytest.raises(SettingsError, match="engine.name=spark"):
        resolve_config("tiny", overrides={"engine.name": "spark"})


TEXTS = ["the police said the fire was under control and people were told they could return to their homes today",
         "a minister said two people were at the news today and it was the government that said it would help",
         "the government said the new year would be a year of more news for people in the town",
         "it was said that the fire had been under control"]


@pytest.fixture(scope="module")
def ray_engine():
    "A local Ray instance for this module; an engine with 2 workers and batches of 2 texts (several batches per call)."
    from stealth_eval.engine import RayEngine, connect
    from stealth_eval.schema import Engine
    os.environ.pop("RAY_ADDRESS", None)
    r = connect("")
    yield RayEngine(Engine(name="ray", workers=2, batch_size=2))
    r.shutdown()


def test_generation_and_perturbations_on_ray_equal_the_local_engine(tmp_path, ray_engine):
    "The paths the tiny profile does not reach (chat generation, perturbations): same values, stored once, from Ray."
    from stealth_eval import perturbation as pt
    from stealth_eval.models import chat_generate, make_tiny_lm
    from stealth_eval.paraphrase import make_tiny_chat_lm
    chat = str(make_tiny_chat_lm(tmp_path / "chat"))
    msgs, seeds = [f"Rewrite: {t}" for t in TEXTS] + ["Rewrite: the news"], [0, 1, 2, 3, 4]
    local = chat_generate(chat, msgs, seeds, Cache(tmp_path / "a"), max_new_tokens=12, device="cpu")
    c = Cache(tmp_path / "b", engine=ray_engine)
    assert chat_generate(chat, msgs, seeds, c, max_new_tokens=12, device="cpu") == local
    assert chat_generate(chat, msgs, seeds, c, max_new_tokens=12, device="cpu") == local   # read back, not recomputed
    assert c.stats()["chat_generate"] == {"hits": 5, "misses": 5}
    assert len({*local}) > 1                                                                 # real, distinct samples
    lm = str(make_tiny_lm(tmp_path / "lm", seed=3))
    cfg = {"device": "cpu", "trust_remote_code": False, "seed": 0,
           "perturbation": {"n_perturbations": 3, "infill_model": lm, "t5_model": lm}}
    a = pt.perturb_texts(TEXTS, "lminfill", cfg, Cache(tmp_path / "c"))
    c2 = Cache(tmp_path / "d", engine=ray_engine)
    assert pt.perturb_texts(TEXTS, "lminfill", cfg, c2) == a
    assert c2.stats()["perturbation"]["misses"] == 3 * len(TEXTS)
    assert any(t for v in a.values() for t in v["perturbed"])
    assert sorted(a) == sorted(sha256_text(t) for t in TEXTS)
