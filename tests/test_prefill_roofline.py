"""Issue 51 item 4 on the CPU: the output head's precision as a setting (`head_dtype`), the share of executed rows that
are real on the paper workload (`rehearsal.rows_real`), fused attention on every prefill path and host
synchronisations per scoring batch. Tiny models built here (real architectures, random weights)."""
import pytest

torch = pytest.importorskip("torch")

from stealth_eval.core import Cache, sha256_text
from stealth_eval import models as M
from stealth_eval import stream as S

PKG = str(__import__("pathlib").Path(M.__file__).resolve().parent)
WORDS = "the police said the fire was under control and the minister said two people were at the news today".split()
TEXTS = [" ".join(WORDS[(3 * i) % 7:][: 4 + 3 * i] * 2) for i in range(6)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(M.make_tiny_lm(tmp_path_factory.mktemp("tiny") / "lm", seed=5))


def _cfg(path, **kw):
    return {"device": "cpu", "trust_remote_code": False, "score_max_tokens": 64, "score_batch_tokens": 256,
            "score_bucket_tokens": 8, "scoring_model": path, **kw}


def test_head_dtype_is_a_device_setting_resolved_into_the_config_float32_by_default():
    from stealth_eval.config import resolve_config
    from stealth_eval.schema import DEVICE_PROFILES
    assert DEVICE_PROFILES["cpu"]["head_dtype"] == DEVICE_PROFILES["gpu"]["head_dtype"] == "float32"
    assert resolve_config("embedded", overrides={"device": "cpu"}).to_dict()["head_dtype"] == "float32"
    assert resolve_config("embedded", overrides={"device": "cpu", "device_profile": "gpu", "head_dtype": "tf32"}).to_dict()["head_dtype"] == "tf32"


def test_a_lower_precision_head_has_keys_of_its_own_and_its_values_are_its_rounded_product(tiny, tmp_path):
    "The panel under each head_dtype: float32's values are today's; bf16's differ, under keys of their own, and equal a float64 product of the rounded head."
    from stealth_eval.detectors import score_texts_windows
    got = {h: score_texts_windows(TEXTS, tiny, _cfg(tiny, head_dtype=h), Cache(tmp_path / "c"), [64])[64]
           for h in ("float32", "bfloat16", "tf32")}
    again = score_texts_windows(TEXTS, tiny, _cfg(tiny), Cache(tmp_path / "fresh"), [64])[64]
    h0 = sha256_text(TEXTS[3])
    assert got["float32"][h0]["ll"] == again[h0]["ll"]
    assert got["bfloat16"][h0]["ll"] != got["float32"][h0]["ll"]
    lm = M.load_causal_lm(tiny, device="cpu")
    ids = torch.tensor([lm.tokenizer(TEXTS[3]).input_ids])
    with torch.no_grad(): hid = lm.model.base_model(input_ids=ids).last_hidden_state[0].double()
    w = lm.model.get_output_embeddings().weight.detach()
    for h, rnd in (("bfloat16", lambda x: x.float().bfloat16().double()), ("tf32", lambda x: M.round_tf32(x.float()).double())):
        z = rnd(hid)[:-1] @ rnd(w).T
        ll = torch.log_softmax(z, -1).gather(1, ids[0, 1:, None])[:, 0].mean().item()
        assert got[h][h0]["ll"] == pytest.approx(ll, rel=1e-6, abs=1e-6)


def test_rows_real_on_the_paper_workload_is_above_90_percent_and_reported():
    from stealth_eval.config import PROFILES
    from stealth_eval.rehearsal import cost_section, paper_rows_real, rows_real, rows_real_overall
    from stealth_eval.models import plan_batches
    lengths = [100 + (400 * i) // 37 for i in range(37)]   # rows_real counts what plan_batches executes
    plan = plan_batches(lengths, 8192, 16)
    assert rows_real(37, 300, 8192, 16) == pytest.approx(37 / sum(R for R, _, _ in plan), rel=0.05)
    paper = PROFILES["paper"].to_dict()
    rr = paper_rows_real(paper)
    assert min(s for _, s in rr) >= 0.9 and rows_real_overall(paper) >= 0.99
    assert {w["what"] for w, _ in rr} >= {"likelihood panel (one pass)", "perturbed texts scored", "T5 fills: encoder", "similarity"}
    assert any(l.startswith("Executed rows real: 99.8%") for l in cost_section({}, [], paper=paper))
    from stealth_eval.preflight import preflight_report, STEPS
    rep = {"device": "cpu", "scale": "layers", "started": "now", "ok": True, "seconds": 1.0,
           "steps": {s: {"status": "ok", "seconds": 0.0, "budget_s": 1.0} for s in STEPS}}
    assert "(99.8% of its batched prefills' executed rows" in preflight_report(rep)


def test_every_prefill_path_uses_fused_attention_on_the_gpu_profile(tiny, tmp_path):
    "The stream's LMs take the profile's sdpa; RoBERTa / BERT (E5, MiniLM) / Llama (RADAR) encoders get sdpa from transformers."
    import transformers as T
    from stealth_eval.schema import DEVICE_PROFILES
    assert DEVICE_PROFILES["gpu"]["attn_implementation"] == "sdpa"
    lm = M.load_causal_lm(tiny, device="cpu", attn_implementation=DEVICE_PROFILES["gpu"]["attn_implementation"])
    assert lm.model.config._attn_implementation == "sdpa"
    small = dict(vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
    for name, conf in {"roberta": T.RobertaConfig(**small, max_position_embeddings=40), "bert": T.BertConfig(**small),
                       "llama": T.LlamaConfig(**small, pad_token_id=0)}.items():
        T.AutoModel.from_config(conf).save_pretrained(tmp_path / name)
        assert T.AutoModel.from_pretrained(tmp_path / name).config._attn_implementation == "sdpa", name
        assert T.AutoModelForSequenceClassification.from_pretrained(tmp_path / name).config._attn_implementation == "sdpa", name


class HostReads:
    "Counts host reads of device values asked by stealth_eval's code; a read of a tensor `.cpu()` already copied is free."
    def __init__(self, monkeypatch):
        import sys
        self.n = 0
        for name in ("item", "tolist", "cpu", "numpy", "__float__", "__int__", "__bool__"):
            orig = getattr(torch.Tensor, name)
            def read(t, *a, _orig=orig, _name=name, **k):
                if sys._getframe(1).f_code.co_filename.startswith(PKG) and not getattr(t, "_on_host", False): self.n += 1
                out = _orig(t, *a, **k)
                if _name == "cpu": out._on_host = True
                return out
            monkeypatch.setattr(torch.Tensor, name, read)


def test_a_scoring_batch_reads_the_host_once_per_reader(tiny, tmp_path, monkeypatch):
    "The panel's pass over 6 texts in several padded batches: the stream itself reads nothing; the panel reads once a batch."
    from stealth_eval.detectors import panel_use
    cfg = _cfg(tiny)
    use, _ = panel_use(TEXTS, tiny, cfg, Cache(tmp_path / "c"), [64])
    batches = []
    real_fb = S.forward_batches
    def counting(*a, **k):
        for r in real_fb(*a, **k): batches.append(1); yield r
    monkeypatch.setattr(S, "forward_batches", counting)
    reads = HostReads(monkeypatch)
    S.fetch_lm_uses(tiny, cfg, Cache(tmp_path / "c"), [use])
    assert len(batches) >= 2
    assert reads.n == len(batches), (reads.n, len(batches))
