"""Hostile settings (issue #25, items 4 and 8): every setting fails at `--set` time or not at all, a partial `--set` of a
section changes only the keys it names, a cache folder that is a file is refused before the run, and the default
(embedded) configuration reaches for no hub."""
import json
import os
import socket
import subprocess
import sys

import pytest

from conftest import ROOT, one_error_line, run_cli
from stealth_eval.config import PROFILES, load_config, parse_set, resolve_config
from stealth_eval.core import StealthEvalError, write_json
from stealth_eval.schema import MAX_BOOTSTRAP, Settings


def refused(items, contains, profile="tiny"):
    "resolve_config refuses the `--set` items with a one-line message holding `contains`."
    with pytest.raises(StealthEvalError) as e:
        resolve_config(profile, overrides=parse_set(items))
    msg = str(e.value)
    assert contains in msg and "\n" not in msg, msg
    return msg


# ---- what a later stage needs, checked at --set time --------------------------------------------------------------

@pytest.mark.parametrize("key", ["fpr_targets", "homoglyph_rates", "m3_guides"])
def test_an_empty_list_that_a_stage_reads_is_refused(key):
    refused([f"{key}=[]"], f"--set {key}=[]: needs at least one value")


def test_an_empty_panel_or_dataset_list_in_a_config_file_is_refused():
    for k in ("detectors", "datasets", "n_candidates"):
        with pytest.raises(StealthEvalError, match=f"^{k}=\\[\\]: needs at least one value"):
            Settings.from_dict({k: []})


def test_a_sweep_with_no_value_at_all_is_refused():
    refused(['shield={"random_p": [], "swap_p": [], "rounds": []}'], "shield: random_p, swap_p and rounds are all empty")
    refused(['polish={"degrees": [], "percents": []}'], "polish: degrees and percents are both empty")
    resolve_config("tiny", overrides=parse_set(["shield.rounds=[]"]))   # one strategy off: allowed


@pytest.mark.parametrize("item,says", [
    ("score_windows.fast_detectgpt=abc", "'abc' is not allowed; use profile, model or a number of tokens"),
    ("score_windows.fast_detectgpt=2", "a window scores nothing below 3 tokens, got 2"),
    ("score_windows.fast_detectgpt=0", "a window scores nothing below 3 tokens, got 0"),
    ('score_windows={"log_rank": 1.5}', "expects an integer or a string under score_windows"),
    ("score_max_tokens=2", "score_max_tokens=2: a window scores nothing below 3 tokens"),
])
def test_a_window_that_is_not_a_number_or_leaves_nothing_to_score_is_refused(item, says):
    refused([item], says)


def test_windows_that_can_score_are_accepted():
    cfg = resolve_config("tiny", overrides=parse_set(["score_windows.fast_detectgpt=3", "score_windows.log_rank=model",
                                                      "score_windows.binoculars=profile", "score_max_tokens=3"]))
    assert cfg.score_windows == {"fast_detectgpt": 3, "log_rank": "model", "binoculars": "profile"}


def test_n_bootstrap_has_a_documented_upper_bound():
    msg = refused([f"n_bootstrap={MAX_BOOTSTRAP + 1}"], f"n_bootstrap={MAX_BOOTSTRAP + 1}: must be at most {MAX_BOOTSTRAP}")
    assert "GB" in msg                                   # says why: the memory it would take
    assert resolve_config("tiny", overrides={"n_bootstrap": MAX_BOOTSTRAP}).n_bootstrap == MAX_BOOTSTRAP
    assert str(MAX_BOOTSTRAP) in Settings.__dataclass_fields__["n_bootstrap"].metadata["doc"]


# ---- keys of the open sections and names in lists, against the registries -----------------------------------------

@pytest.mark.parametrize("item,says", [
    ("score_windows.fast_detectgtp=128", "score_windows: unknown detector 'fast_detectgtp'. Did you mean 'fast_detectgpt'?"),
    ("score_windows.detectgpt=128", "score_windows.detectgpt: detector detectgpt has no token window"),
    ("data_paths.padbne=/data/padben", "data_paths: unknown dataset 'padbne'. Did you mean 'padben'?"),
    ("data_paths.lee_news=/data/lee", "data_paths.lee_news: dataset lee_news is not read from a folder"),
    ('m3_guides=["roberta_opnai", "ensemble"]', "m3_guides: unknown detector 'roberta_opnai'. Did you mean 'roberta_openai'?"),
    ('m3_ensemble=["fast_detectgpt", "entropi"]', "m3_ensemble: unknown detector 'entropi'"),
    ('reward_detectors.m9=["log_rank"]', "reward_detectors: unknown method 'm9'"),
    ("acceptance.method=m22", "acceptance.method: unknown method 'm22'"),
    ('sanitize=["m55"]', "sanitize: unknown method 'm55'"),
])
def test_a_typo_inside_an_open_section_or_a_name_list_is_refused(item, says):
    refused([item], says)


def test_the_paper_profiles_names_and_the_known_ones_pass():
    cfg = resolve_config("tiny", overrides=parse_set(["data_paths.padben=/data/padben", "score_windows.binoculars=256",
                                                      'reward_detectors.m3=["fast_detectgpt"]', "acceptance.method=m3"]))
    assert cfg.data_paths == {"padben": "/data/padben"} and cfg.acceptance.method == "m3"
    assert "roberta_openai" in PROFILES["paper"].m3_guides     # hub guides stay in the paper profile


def test_a_rehearsal_section_with_an_unknown_key_is_refused():
    with pytest.raises(StealthEvalError, match="rehearsal.scal: unknown key"):
        Settings.from_dict({"rehearsal": {"scal": "layers"}})


def test_a_config_file_edited_by_hand_is_checked_the_same_way(tmp_path):
    cfg = resolve_config("tiny", out_dir=str(tmp_path))
    write_json(tmp_path / "config.json", {**cfg.to_dict(), "score_windows": {"fast_detectgtp": 128}})
    with pytest.raises(StealthEvalError, match="config.json: score_windows: unknown detector 'fast_detectgtp'"):
        load_config(tmp_path / "config.json")


# ---- a partial --set of a section changes only the keys it names ---------------------------------------------------

def test_a_partial_section_keeps_the_profiles_other_values():
    tiny = PROFILES["tiny"]
    cfg = resolve_config("tiny", overrides=parse_set(['data={"n_per_class": 5}', 'shield={"top_k": 3}',
                                                      'reward_detectors={"m2": ["log_rank"]}']))
    assert cfg.data.n_per_class == 5
    assert {k: v for k, v in cfg.data.items() if k != "n_per_class"} == {k: v for k, v in tiny.data.items() if k != "n_per_class"}
    assert cfg.data.max_tokens == 128 != Settings().data.max_tokens        # the profile's, not the library's
    assert cfg.shield.top_k == 3 and cfg.shield.random_p == tiny.shield.random_p == [0.1]
    assert cfg.reward_detectors == {**tiny.reward_detectors, "m2": ["log_rank"]}


def test_a_key_inside_a_section_value_is_checked_with_its_full_name():
    refused(['data={"n_per_clas": 5}'], "--set data.n_per_clas: unknown key")
    refused(['data={"n_per_class": -1}'], "--set data.n_per_class=-1: must be a positive count")
    refused(['data={"min_tokens": 200}'], "data.min_tokens=200: must not exceed data.max_tokens=128")


# ---- the cache folder ----------------------------------------------------------------------------------------------

def test_a_cache_folder_that_is_a_file_is_refused_before_the_run(tmp_path, monkeypatch):
    f = tmp_path / "cache_file"
    f.write_text("not a folder")
    for env in (f, f / "sub"):
        monkeypatch.setenv("STEALTH_EVAL_CACHE", str(env))
        with pytest.raises(StealthEvalError, match=f"STEALTH_EVAL_CACHE={env}: {f} is not a folder"):
            resolve_config("tiny")
    monkeypatch.setenv("STEALTH_EVAL_CACHE", str(tmp_path / "new" / "cache"))    # missing: created when needed
    resolve_config("tiny")


def test_the_command_line_refuses_a_cache_file_with_one_line(tmp_path):
    f = tmp_path / "cache_file"
    f.write_text("not a folder")
    env = {**os.environ, "STEALTH_EVAL_CACHE": str(f), "STEALTH_EVAL_PROGRESS": "0", "HF_HUB_OFFLINE": "1"}
    p = subprocess.run([sys.executable, "-m", "stealth_eval.run", "--profile", "tiny", "--out_dir", str(tmp_path / "run")],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 2, p.stderr[-3000:]
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and f"STEALTH_EVAL_CACHE={f}" in lines[0], p.stderr[-3000:]
    assert not (tmp_path / "run" / "notebooks").exists()           # nothing ran


# ---- item 8: the embedded profile's components are all embedded -----------------------------------------------------

@pytest.fixture
def no_network(monkeypatch, tmp_path):
    "Every connection attempt raises (and fails the test) and the hub cache is empty: only local models load."
    tried = []
    def refuse(self, address, *a, **k):
        tried.append(address)
        raise OSError(f"network disabled in this test: connect to {address}")
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)          # as `make run` on a fresh machine
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    import huggingface_hub.constants
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty_hub_cache"))   # a fresh machine's
    return tried


def test_the_default_configuration_needs_no_hub(no_network):
    from stealth_eval.components import DETECTORS, METHODS
    from stealth_eval.models import available_offline
    from stealth_eval.paraphrase import guide_detectors
    cfg = resolve_config()                                          # the default: embedded profile, default choices
    assert cfg.profile == "embedded"
    models = {k: cfg[k] for k in ("generator", "scoring_model", "quality_lm", "embedder")}
    for m in cfg.methods: models.update({k: cfg[k] for k in METHODS.get(m).model_keys if cfg.get(k)})
    assert {k: v for k, v in models.items() if not available_offline(v)} == {}
    for d in cfg.detectors:
        assert DETECTORS.get(d).unavailable(cfg) == "", d
    if "m3" in cfg.methods:
        dets, why, guides, members = guide_detectors(cfg)          # what M3 loads: each guide asked whether it can run
        assert why == {} and set(guides) - {"ensemble"} <= set(dets), why
        for g in dets.values(): assert g.unavailable(cfg) == ""
    assert no_network == []                                         # nothing tried to connect


# ---- issue #37: what would crash a run late is refused before its first stage ---------------------------------------

def test_a_device_this_machine_lacks_is_refused_before_any_stage(tmp_path):
    "`--set device=cuda:N` past this machine's devices (none on a CPU machine) failed in 20_detectors with exit 1."
    import torch
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0     # the first index this machine does not have
    line = one_error_line(run_cli("--profile", "tiny", "--set", f"device=cuda:{n}", "--out_dir", tmp_path / "run", check=False))
    assert line.startswith(f"stealth-eval: error: device=cuda:{n}: this machine has "), line
    assert not (tmp_path / "run").exists()                                  # refused before the run folder is made


@pytest.mark.parametrize("flag, names, says", [("--methods", ["m5", "m5"], "method 'm5' is given twice"),
                                               ("--detectors", ["lrr", "log_rank", "lrr"], "detector 'lrr' is given twice")])
def test_a_component_named_twice_is_refused_before_any_stage(tmp_path, flag, names, says):
    "`--methods m5 m5` crashed in 40_figures; a name given twice is refused (likely a slip for another name), not merged."
    line = one_error_line(run_cli("--profile", "tiny", flag, *names, "--out_dir", tmp_path / "run", check=False))
    assert says in line, line
    assert not (tmp_path / "run").exists()


# ---- issue #50, item 5: refused before the run, in one line (each CLI call takes about a second) --------------------

def test_the_synonym_attack_offline_without_its_pieces_is_refused_before_any_stage(tmp_path):
    """Before: `--offline` with `raid.attacks=["synonym"]` and its masked LM neither local nor cached started the run, and
    10_methods skipped the attack. Now one line names each setting and what it lacks, before the run folder is made."""
    vec = tmp_path / "cc.en.300.bin"
    p = run_cli("--profile", "tiny", "--offline", "--methods", "m0", "raid", "--set", 'raid.attacks=["synonym"]',
                "raid.synonym_mlm=no-such-org/no-such-mlm", f"raid.synonym_vectors={vec}", "--out_dir", tmp_path / "run",
                check=False, timeout=300)
    line = one_error_line(p)
    assert line.startswith("stealth-eval: error: --offline: raid.attacks lists synonym, which cannot run here: "
                           "raid.synonym_mlm='no-such-org/no-such-mlm' is neither a local folder nor in the hub cache; "
                           f"raid.synonym_vectors='{vec}' is no file"), line
    assert line.endswith("(give each a local copy, or leave synonym out of raid.attacks)"), line
    assert not (tmp_path / "run").exists()


def test_the_synonym_check_names_only_what_is_missing(tmp_path):
    """Listed beside other attacks, synonym is refused the same way (it is never a default: listing it asks for it); a
    local model folder and a vectors file that exists are not named; without raid, or without synonym, nothing is checked."""
    import importlib.util
    from stealth_eval.run import check_offline
    (tmp_path / "mlm").mkdir(); (tmp_path / "v.bin").write_bytes(b"")
    ov = {"raid.attacks": ["whitespace", "synonym"], "raid.synonym_mlm": "no-such-org/no-such-mlm", "raid.synonym_vectors": str(tmp_path / "v.bin")}
    with pytest.raises(StealthEvalError, match=r"^--offline: raid\.attacks lists synonym, which cannot run here: raid\.synonym_mlm='no-such-org/no-such-mlm' is neither"):
        check_offline(resolve_config("tiny", methods=["m0", "raid"], overrides=ov))
    ov["raid.synonym_mlm"] = str(tmp_path / "mlm")
    try:
        check_offline(resolve_config("tiny", methods=["m0", "raid"], overrides=ov))
        import nltk
        nltk.pos_tag(["a"]); nltk.corpus.stopwords.words("english")             # all four pieces are here
        assert importlib.util.find_spec("fasttext") is not None
    except StealthEvalError as e:
        assert "raid.synonym_mlm" not in str(e) and "raid.synonym_vectors" not in str(e), str(e)
        assert "the fasttext package is not installed" in str(e) or "NLTK's data lacks" in str(e), str(e)
    ov["raid.synonym_mlm"] = "no-such-org/no-such-mlm"
    check_offline(resolve_config("tiny", methods=["m0"], overrides=ov))                     # raid is not run
    check_offline(resolve_config("tiny", methods=["m0", "raid"], overrides={**ov, "raid.attacks": ["whitespace"]}))


@pytest.mark.parametrize("budget", ["paths=0", "build=-5", "notebooks=nan", "environment=inf", "paths=1e400"])
def test_a_preflight_budget_that_is_not_a_positive_finite_number_is_refused(budget, tmp_path):
    """Before: `--budget STEP=0` or a negative budget meant no limit at all, and nan or inf failed the step in the timer;
    the preflight ran for minutes. Now one line, exit 2, before the output folder is made."""
    p = run_cli("preflight", "--short", "--device", "cpu", "--out_dir", tmp_path / "pf", "--budget", budget, check=False, timeout=300)
    line = one_error_line(p, "preflight")
    assert line == f"stealth-eval preflight: error: --budget {budget}: a step's budget is a positive finite number of seconds", line
    assert not (tmp_path / "pf").exists()


@pytest.mark.parametrize("item, says", [
    ("api.timeout_s=1e12", "--set api.timeout_s=1000000000000.0: must be at most 3600 "),
    ("api.max_attempts=1000000", "--set api.max_attempts=1000000: must be at most 20 "),
    ("api.backoff_max_s=1e12", "--set api.backoff_max_s=1000000000000.0: must be at most 3600 "),
    ("api.retry_after_max_s=86400", "--set api.retry_after_max_s=86400: must be at most 3600 "),
])
def test_the_api_clients_waits_and_tries_are_bounded(item, says, tmp_path):
    """Before: a timeout or wait of 1e12 s passed the checks (a socket or a sleep that long overflows the platform's
    time_t: OverflowError inside the stage), a million tries per text too. Now each has a documented maximum."""
    line = one_error_line(run_cli("--profile", "tiny", "--set", item, "--out_dir", tmp_path / "run", check=False, timeout=300))
    assert line.startswith(f"stealth-eval: error: {says}"), line
    assert not (tmp_path / "run").exists()


def test_the_api_bounds_are_accepted_and_documented():
    from stealth_eval.schema import Api
    cfg = resolve_config("tiny", overrides=parse_set(["api.timeout_s=3600", "api.max_attempts=20", "api.backoff_s=3600",
                                                      "api.backoff_max_s=3600", "api.retry_after_max_s=3600"]))
    assert (cfg.api.timeout_s, cfg.api.max_attempts, cfg.api.backoff_max_s) == (3600, 20, 3600)
    for k, most in (("timeout_s", 3600), ("max_attempts", 20), ("backoff_s", 3600), ("backoff_max_s", 3600), ("retry_after_max_s", 3600)):
        f = Api.__dataclass_fields__[k]
        assert f.metadata["at_most"][0] == most and f"at most {most}" in f.metadata["doc"], k
