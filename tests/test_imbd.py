"""ImBD and DetectAnyLLM (nbs/29_imbd): the losses against the reference repositories' code re-stated here on the same
logits, one training step (direction, determinism), the checkpointed training (a killed run resumes to the same
adapter), the content cache (a second run loads no model), the criterion of the tuned model (Fast-DetectGPT's, from the
definitions, on the saved adapter loaded by peft), the settings and `--list`.

Reference code read: Jiaqi-Chen-00/ImBD spo/spo.py (get_sampling_discrepancy_analytic, ComputeScore.forward_SPO),
spo/utils_spo.py (calculate_SPO_loss); fjc2005/DetectAnyLLM core/model.py (get_sampling_discrepancy_analytic with the
attention mask and 1e-8), core/loss.py (calculate_DDL_loss), core/trainer.py (the call order of the losses' arguments).
"""
import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")
import torch.nn.functional as F

import stealth_eval.imbd as imbd
from stealth_eval.core import Cache, StealthEvalError, read_json, sha256_text, write_jsonl
from stealth_eval.detectors import DETECTORS, panel_reference
from stealth_eval.models import LOADS, load_causal_lm, make_tiny_lm

WORDS = ("the police said the fire was under control and the minister said two people were at the news today "
         "a year after the government had been new to this").split()


# ---- the references' code, re-stated (float32 in, as they run; the same argument order as their callers) -----------
def ref_criterion_imbd(logits_ref, logits_score, labels):
    "ImBD spo/spo.py get_sampling_discrepancy_analytic: (discrepancy, log_likelihood.sum(-1))."
    labels = labels.unsqueeze(-1) if labels.ndim == logits_score.ndim - 1 else labels
    lprobs_score = torch.log_softmax(logits_score, dim=-1)
    probs_ref = torch.softmax(logits_ref, dim=-1)
    log_likelihood = lprobs_score.gather(dim=-1, index=labels).squeeze(-1)
    mean_ref = (probs_ref * lprobs_score).sum(dim=-1)
    var_ref = (probs_ref * torch.square(lprobs_score)).sum(dim=-1) - torch.square(mean_ref)
    discrepancy = (log_likelihood.sum(dim=-1) - mean_ref.sum(dim=-1)) / var_ref.sum(dim=-1).sqrt()
    return discrepancy, log_likelihood.sum(dim=-1)


def ref_criterion_ddl(reference_logits, scoring_logits, labels, attention_mask):
    "DetectAnyLLM core/model.py DiscrepancyEstimator.get_sampling_discrepancy_analytic (padding masked, + 1e-8)."
    labels = labels.unsqueeze(-1) if labels.ndim == scoring_logits.ndim - 1 else labels
    lprobs_score = torch.log_softmax(scoring_logits, dim=-1)
    probs_ref = torch.softmax(reference_logits, dim=-1)
    log_likelihood = lprobs_score.gather(dim=-1, index=labels).squeeze(-1)
    mean_ref = (probs_ref * lprobs_score).sum(dim=-1)
    var_ref = (probs_ref * torch.square(lprobs_score)).sum(dim=-1) - torch.square(mean_ref)
    mask = attention_mask[:, 1:].float()
    log_likelihood_sum = (log_likelihood * mask).sum(dim=-1)
    mean_ref_sum = (mean_ref * mask).sum(dim=-1)
    var_ref_sum = (var_ref * mask).sum(dim=-1)
    return (log_likelihood_sum - mean_ref_sum) / (var_ref_sum.sqrt() + 1e-8), log_likelihood_sum


def ref_spo_loss(model_prefered_logprob, model_disprefered_logprob, ref_prefered_logprob, ref_disprefered_logprob, beta=0.5):
    "ImBD spo/utils_spo.py calculate_SPO_loss (DetectAnyLLM core/loss.py calculate_DPO_loss is the same): the loss only."
    prefered_relative_logprob = model_prefered_logprob - ref_prefered_logprob
    disprefered_relative_logprob = model_disprefered_logprob - ref_disprefered_logprob
    return -F.logsigmoid(beta * (prefered_relative_logprob - disprefered_relative_logprob)).mean(dim=-1)


def ref_ddl_loss(original_crit, rewritten_crit, target_original_crit=0, target_rewritten_crit=100):
    "DetectAnyLLM core/loss.py calculate_DDL_loss."
    return torch.abs(target_original_crit - original_crit).mean(dim=-1) + torch.abs(target_rewritten_crit - rewritten_crit).mean(dim=-1)


def close(a, b, tol=1e-6):
    return abs(float(a) - float(b)) <= tol * max(1.0, abs(float(b)))


# ---- the losses on the same logits ----------------------------------------------------------------------------------
def test_losses_equal_the_reference_code_on_random_logits():
    g = torch.Generator().manual_seed(1)
    V, B, T = 50, 3, 9
    zh, zm = torch.randn(B, T, V, generator=g) * 4, torch.randn(B, T, V, generator=g) * 4
    rh, rm = torch.randn(B, T, V, generator=g) * 4, torch.randn(B, T, V, generator=g) * 4
    yh, ym = torch.randint(0, V, (B, T), generator=g), torch.randint(0, V, (B, T), generator=g)
    # ImBD: the criterion and the summed log-likelihood, then SPO with the machine text preferred
    for z, y in ((zh, yh), (zm, ym)):
        for got, want in zip(imbd.analytic_criterion(z, z, y), ref_criterion_imbd(z, z, y)):
            assert all(close(a, b) for a, b in zip(got, want))
    th, tm = imbd.analytic_criterion(zh, zh, yh)[1], imbd.analytic_criterion(zm, zm, ym)[1]
    fh, fm = ref_criterion_imbd(rh, rh, yh)[1], ref_criterion_imbd(rm, rm, ym)[1]
    for beta in (0.05, 0.5):
        assert close(imbd.spo_loss(tm, th, fm, fh, beta), ref_spo_loss(tm, th, fm, fh, beta))
    # DetectAnyLLM: right-padded rows of 9, 6 and 4 labels (attention masks over T + 1 input tokens), + 1e-8
    att = torch.ones(B, T + 1)
    att[1, 7:] = 0; att[2, 5:] = 0
    ch, _ = imbd.analytic_criterion(zh, zh, yh, mask=att[:, 1:], eps=1e-8)
    cm, _ = imbd.analytic_criterion(zm, zm, ym, mask=att[:, 1:], eps=1e-8)
    rch, rcm = ref_criterion_ddl(zh, zh, yh, att)[0], ref_criterion_ddl(zm, zm, ym, att)[0]
    assert all(close(a, b) for a, b in zip(ch, rch)) and all(close(a, b) for a, b in zip(cm, rcm))
    assert close(imbd.ddl_loss(ch, cm), ref_ddl_loss(rch, rcm))
    assert close(imbd.ddl_loss(ch, cm, 1.0, 7.0), ref_ddl_loss(rch, rcm, 1.0, 7.0))
    # the gradient flows through the reference distribution as well (DDL's logits are both): same gradient as the reference's
    z1, z2 = zh.clone().requires_grad_(), zh.clone().requires_grad_()
    imbd.ddl_loss(imbd.analytic_criterion(z1, z1, yh, att[:, 1:], 1e-8)[0], torch.zeros(B)).backward()
    ref_ddl_loss(ref_criterion_ddl(z2, z2, yh, att)[0], torch.zeros(B)).backward()
    assert torch.allclose(z1.grad, z2.grad, rtol=1e-5, atol=1e-8)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("imbd")
    path = str(make_tiny_lm(d / "lm"))
    tok = load_causal_lm(path, device="cpu").tokenizer
    pairs = [(tok(" ".join(WORDS[i:i + 9 + i])).input_ids, tok(" ".join(WORDS[::-1][i:i + 12])).input_ids) for i in range(4)]
    return {"path": path, "tok": tok, "pairs": pairs, "dir": d}


def _prm(tiny, method, **kw):
    return {**imbd.tuned_params({"scoring_model": tiny["path"]}, method, local=True), **kw}


def _fresh(tiny, prm, seed=0):
    return imbd.add_lora(load_causal_lm.__wrapped__(tiny["path"], device="cpu"), prm, seed)


def _perturb(lm, seed=3):
    "Give the LoRA's B random values, so the tuned model differs from the frozen one."
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in imbd.lora_weights(lm).items():
            if "lora_B" in n: p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return lm


@pytest.mark.parametrize("method", ["imbd", "detectanyllm"])
def test_pair_loss_through_a_tiny_lm_equals_the_reference_forward(tiny, method):
    "The loss of a (human, AI) pair: ImBD's forward_SPO / DetectAnyLLM's forward + Trainer.train on the model's own logits."
    prm = _prm(tiny, method)
    base = load_causal_lm(tiny["path"], device="cpu")                       # the frozen model: a LoRA with B = 0 is exactly it
    lm = _perturb(_fresh(tiny, prm))
    h, a = tiny["pairs"][1]
    ref = imbd.summed_loglik(base, [h, a])
    loss, ch, ca = imbd.pair_loss(lm, h, a, prm, ref)
    with torch.no_grad():
        out = {}
        for name, ids in (("h", h), ("a", a)):
            x = torch.tensor([ids])
            zt = lm.model(x).logits[:, :-1]                                  # the references read model(...).logits
            zr = base.model(x).logits[:, :-1]
            out[name] = (ref_criterion_imbd(zt, zt, x[:, 1:]), ref_criterion_imbd(zr, zr, x[:, 1:]),
                         ref_criterion_ddl(zt, zt, x[:, 1:], torch.ones_like(x)))
    if method == "imbd":   # calculate_SPO_loss(train_prefered = rewritten, train_disprefered = original, ref_prefered, ref_disprefered)
        want = ref_spo_loss(out["a"][0][1], out["h"][0][1], out["a"][1][1], out["h"][1][1], beta=0.05)
        assert close(ch, out["h"][0][0]) and close(ca, out["a"][0][0])
    else:                  # calculate_DDL_loss(scoring_original_discrepancy, scoring_rewritten_discrepancy, 0, 100)
        want = ref_ddl_loss(out["h"][2][0], out["a"][2][0], 0.0, 100.0)
        assert close(ch, out["h"][2][0]) and close(ca, out["a"][2][0])
    assert close(loss, want), (float(loss), float(want))


# ---- training ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("method", ["imbd", "detectanyllm"])
def test_one_step_lowers_the_loss_and_is_deterministic(tiny, method):
    # ImBD steps its cosine schedule before the optimiser: a one-step schedule runs at lr 0 (its last step always does),
    # so ImBD's first step is taken from a two-step schedule (its second, at lr 0, changes nothing)
    prm = _prm(tiny, method, learning_rate=5e-3, max_steps=2 if method == "imbd" else 1)
    runs = {}
    for tag, seed in (("a", 0), ("b", 0), ("c", 1)):
        first = tiny["pairs"][imbd.epoch_order(len(tiny["pairs"]), seed, 0)[0]]   # the pair the first step trains on
        lm = _fresh(tiny, prm, seed)
        ref = imbd.summed_loglik(lm, list(first)) if method == "imbd" else None
        before = float(imbd.pair_loss(lm, *first, prm, ref)[0])
        fit = imbd.train_lora(lm, tiny["pairs"], prm, seed)
        after = float(imbd.pair_loss(lm, *first, prm, ref)[0])
        runs[tag] = (fit, before, after)
    for fit, before, after in runs.values():   # the step's own loss is the untrained one (B = 0: dropout changes nothing)
        assert after < before and fit["steps"] == prm["max_steps"] and math.isclose(fit["losses"][0], before, rel_tol=1e-6)
    if method == "imbd": assert math.isclose(runs["a"][1], math.log(2), rel_tol=1e-6)   # untrained: tuned = frozen, -log sigmoid(0)
    assert runs["a"][0]["adapter_sha256"] == runs["b"][0]["adapter_sha256"] and runs["a"][0]["losses"] == runs["b"][0]["losses"]
    assert runs["a"][0]["adapter_sha256"] != runs["c"][0]["adapter_sha256"]                 # the seed draws the LoRA's A


class Killed(Exception):
    pass


@pytest.mark.parametrize("method,every", [("imbd", 100), ("detectanyllm", 100), ("detectanyllm", 3)])
def test_a_killed_training_resumes_to_the_adapter_of_one_straight_run(tiny, tmp_path, method, every, monkeypatch):
    "Two epochs of four pairs; killed right after the first checkpoint (epoch 1's end, or step 3), started again."
    prm = _prm(tiny, method, learning_rate=5e-3, epochs=2, max_steps=None, checkpoint_steps=every)
    straight = imbd.train_lora(_fresh(tiny, prm), tiny["pairs"], prm, 7, Cache(tmp_path / "a"), "imbd_ckpt/x")
    cache = Cache(tmp_path / "b")
    put = cache.put
    def put_then_die(key, value):
        put(key, value)
        if "state" in value: raise Killed(value["step"])
    monkeypatch.setattr(cache, "put", put_then_die)
    with pytest.raises(Killed) as e:
        imbd.train_lora(_fresh(tiny, prm), tiny["pairs"], prm, 7, cache, "imbd_ckpt/x")
    stopped = int(str(e.value))
    assert stopped == (4 if every == 100 else 3)
    monkeypatch.setattr(cache, "put", put)
    calls = []
    real = imbd.pair_loss
    monkeypatch.setattr(imbd, "pair_loss", lambda *a, **k: calls.append(1) or real(*a, **k))
    resumed = imbd.train_lora(_fresh(tiny, prm), tiny["pairs"], prm, 7, cache, "imbd_ckpt/x")
    assert len(calls) == 8 - stopped                                        # only the steps after the checkpoint ran
    assert resumed["adapter_sha256"] == straight["adapter_sha256"] and resumed["losses"] == straight["losses"]
    assert cache.get("imbd_ckpt/x") == {"done": True, "step": 8}           # the checkpoint's weights are dropped


def _run(tiny, tmp_path, n=6, **sections):
    run = tmp_path / "run"
    write_jsonl(run / "data" / "toy.train.jsonl",
                [{"id": f"{lab}{i}", "label": lab, "text": " ".join((WORDS if lab == "human" else WORDS[::-1])[i:i + 12 + i % 3]),
                  "domain": "toy", "generator": "toy", "source_id": f"s{i}"} for lab in ("human", "ai") for i in range(n)])
    return {"scoring_model": tiny["path"], "device": "cpu", "trust_remote_code": False, "seed": 0, "out_dir": str(run),
            "datasets": [{"name": "toy", "path": None}], "data": {"n_train_per_class": n}, "score_batch_tokens": 256,
            "score_bucket_tokens": 32, **sections}


def test_second_run_is_a_cache_hit_and_loads_no_model(tiny, tmp_path):
    cfg = _run(tiny, tmp_path, imbd={"local_steps": 3})
    det, cache = DETECTORS.get("imbd_local"), Cache(tmp_path / "store")
    texts = [" ".join(WORDS[2:20]), " ".join(WORDS[5:30])]
    first = det.compute(texts, cfg, cache)
    n = sum(LOADS.values())
    second = det.compute(texts, cfg, cache)
    assert second == first and sum(LOADS.values()) == n
    st = cache.stats()
    assert st["imbd_fit"] == {"hits": 1, "misses": 1} and st["tuned_criterion"] == {"hits": 2, "misses": 2}
    card = read_json(Path(cfg["out_dir"]) / "models" / "imbd_local.card.json")
    assert card["training"]["n_pairs"] == 6 and card["training"]["n_pairs_same_source"] == 6 and card["steps"] == 3
    # another hyper-parameter is another training; the checkpoint interval is not
    assert det.compute(texts, {**cfg, "imbd": {"local_steps": 3, "checkpoint_steps": 1}}, cache) == first
    other = det.compute(texts, {**cfg, "imbd": {"local_steps": 3, "beta": 0.5}}, cache)
    assert cache.stats()["imbd_fit"]["misses"] == 2 and other != first


@pytest.mark.parametrize("name", ["imbd_local", "detectanyllm_local"])
def test_criterion_is_fast_detectgpt_of_the_tuned_model_loaded_from_the_saved_adapter(tiny, tmp_path, name):
    "The detector's scores (padded batches) = Fast-DetectGPT's criterion from the definitions (float64) on the peft-loaded adapter."
    from peft import PeftModel
    method = name.split("_")[0]
    cfg = _run(tiny, tmp_path, **{method: {"local_steps": 4, "learning_rate": 5e-2}})
    det = DETECTORS.get(name)
    texts = [" ".join(WORDS[i:i + k]) for i, k in ((0, 10), (3, 17), (1, 24), (4, 30))]
    got = det.compute(texts, cfg, Cache(tmp_path / "store"))
    base = load_causal_lm.__wrapped__(tiny["path"], device="cpu")
    peft_model = PeftModel.from_pretrained(base.model, str(Path(cfg["out_dir"]) / "models" / name)).eval()
    tuned = replace(base, model=peft_model)
    plain = load_causal_lm(tiny["path"], device="cpu")
    for t in texts:
        want = panel_reference(tuned, t)["fdg"]
        assert close(got[sha256_text(t)]["crit"], want), (got[sha256_text(t)]["crit"], want)
        assert abs(want - panel_reference(plain, t)["fdg"]) > 1e-4          # the training moved the criterion
    assert det.model(cfg).startswith(plain.identity + "+lora:")


# ---- the optimisers ------------------------------------------------------------------------------------------------
def transformers_adamw_step(p, m, v, step, lr, eps, wd, b1=0.9, b2=0.999):
    "transformers.AdamW.step (v4, correct_bias=True) for one parameter, as ImBD's spo/engine.py imports it."
    g = p.grad
    m.mul_(b1).add_(g, alpha=1.0 - b1)
    v.mul_(b2).addcmul_(g, g, value=1.0 - b2)
    denom = v.sqrt().add_(eps)
    step_size = lr * math.sqrt(1.0 - b2 ** step) / (1.0 - b1 ** step)
    p.data.addcdiv_(m, denom, value=-step_size)
    if wd > 0.0: p.data.add_(p.data, alpha=-lr * wd)


def test_adamw_variants_equal_torch_and_transformers():
    g = torch.Generator().manual_seed(2)
    x0 = torch.randn(4, 6, generator=g)
    for variant, wd, eps in (("torch", 0.01, 1e-8), ("transformers", 0.0, 1e-6), ("transformers", 0.1, 1e-6)):
        a, b = torch.nn.Parameter(x0.clone()), torch.nn.Parameter(x0.clone())
        st, mb, vb = [(torch.zeros_like(a), torch.zeros_like(a))], torch.zeros_like(b), torch.zeros_like(b)
        opt = torch.optim.AdamW([b], lr=3e-3, weight_decay=wd, eps=eps, foreach=False) if variant == "torch" else None
        for k in range(1, 5):
            lr = imbd.cosine_lr(3e-3, k - 1, 4, 1)
            for p in (a, b): p.grad = None; (p.sin() * p).sum().backward()
            imbd.adamw_step([a], st, k, lr, eps, wd, variant)
            if opt: opt.param_groups[0]["lr"] = lr; opt.step()
            else: transformers_adamw_step(b, mb, vb, k, lr, eps, wd)
        assert torch.allclose(a.detach(), b.detach(), rtol=0, atol=1e-7), variant


# ---- settings, availability, --list -------------------------------------------------------------------------------
def test_settings_availability_and_training_split(tiny, tmp_path, monkeypatch):
    from stealth_eval.config import resolve_config
    from stealth_eval.data import needs_train_split
    from stealth_eval.schema import SettingsError
    cfg = resolve_config("embedded", detectors=["imbd_local", "detectanyllm_local"], overrides={"imbd.beta": 0.1})
    assert needs_train_split(cfg)                                           # the data stage writes the split they train on
    assert DETECTORS.get("imbd_local").params(cfg)["beta"] == 0.1 and DETECTORS.get("imbd").params(cfg)["model"] == "EleutherAI/gpt-neo-2.7B"
    assert DETECTORS.get("detectanyllm").params(cfg)["epochs"] == 5
    for bad in ({"imbd.lora_dropout": 1.5}, {"detectanyllm.epochs": 0}, {"imbd.local_max_tokens": 2}, {"imbd.optimizer": "sgd"}):
        with pytest.raises((SettingsError, StealthEvalError)):
            resolve_config("embedded", detectors=["imbd_local"], overrides=bad)
    run = _run(tiny, tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert "EleutherAI/gpt-neo-2.7B" in DETECTORS.get("imbd").unavailable(run) and DETECTORS.get("imbd_local").unavailable(run) == ""
    assert "no training split" in DETECTORS.get("detectanyllm_local").unavailable({**run, "out_dir": str(tmp_path / "empty")})


def test_cli_lists_them_with_references_models_training_data_and_licence():
    exe = Path(sys.executable).parent / "stealth-eval"
    out = subprocess.run([str(exe), "--list"], capture_output=True, text=True, timeout=300).stdout
    rows = {l.split()[0]: l for l in out.splitlines() if l.strip().startswith(("imbd", "detectanyllm"))}
    assert set(rows) == {"imbd", "detectanyllm", "imbd_local", "detectanyllm_local"}
    for n, r in rows.items():
        assert "curvature" in r and "higher = AI" in r and " yes " in r and "training split" in r and "Model:" in r
        assert ("Jiaqi-Chen-00/ImBD" in r) if n.startswith("imbd") else ("fjc2005/DetectAnyLLM" in r and "NON-COMMERCIAL" in r)
    assert "gpt-neo-2.7B" in rows["imbd"] and "gpt-neo-2.7B" in rows["detectanyllm"]
    assert "imbd_local *" in out and "stands in for: imbd" in rows["imbd_local"] and "scoring_model" in rows["detectanyllm_local"]
