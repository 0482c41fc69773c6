"""One embedder loader, the convention read from the model itself: a sentence-transformers folder or hub repo is encoded
as `SentenceTransformer(model).encode` encodes it (no E5 prefix, its own pooling / max_seq_length / prompt), an E5 model
(a local folder without modules.json, or an intfloat/e5-* hub id) with "query: " and 512 tokens, as before. Tiny random
models built here; hub repos through a hub cache laid out by hand (offline, no network)."""
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from stealth_eval import models
from stealth_eval.core import StealthEvalError

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "query", ":", "the", "fire", "police", "said", "was", "under",
         "control", "by", "night", "a", "new", "report"]
TEXTS = ["the fire was under control by night", "the police said the fire", "a new report", "fire",
         "the police said the fire was under control by night the police said a new report"]   # past max_seq_length 12


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    "A tiny random BERT and its lowercasing WordPiece tokenizer, saved as a plain transformers folder."
    from transformers import BertConfig, BertModel, BertTokenizerFast
    d = tmp_path_factory.mktemp("emb") / "bert"
    d.mkdir()
    (d / "vocab.txt").write_text("\n".join(WORDS))
    tok = BertTokenizerFast(vocab=str(d / "vocab.txt"))      # (transformers 5 reads no vocab from vocab_file= here)
    assert tok("the fire").input_ids == [2, 7, 8, 3]
    tok.save_pretrained(d)
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=len(WORDS), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=32, max_position_embeddings=64)).save_pretrained(d)
    return d


def _st(bert, out, pooling="mean", normalize=True, max_seq_length=12, **kw):
    "Save `bert` wrapped as a sentence-transformers model (Transformer, Pooling, optionally Normalize)."
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer import modules as stm
    word = stm.Transformer(str(bert), max_seq_length=max_seq_length)
    mods = [word, stm.Pooling(word.get_embedding_dimension(), pooling)] + ([stm.Normalize()] if normalize else [])
    SentenceTransformer(modules=mods, device="cpu", **kw).save(str(out))
    return out


def _reference(folder, texts, **kw):
    "What sentence-transformers itself computes, as unit vectors (the run's similarity is the cosine)."
    from sentence_transformers import SentenceTransformer
    return SentenceTransformer(str(folder), device="cpu").encode(texts, normalize_embeddings=True, **kw).astype(np.float64)


@pytest.fixture(autouse=True)
def _fresh():
    models.load_embedder.cache_clear(); yield; models.load_embedder.cache_clear()


def test_a_sentence_transformers_folder_is_encoded_as_the_library_encodes_it(bert, tmp_path):
    st = _st(bert, tmp_path / "tiny-st")
    emb = models.load_embedder(str(st), device="cpu")
    got = emb.encode(TEXTS)
    assert np.abs(got - _reference(st, TEXTS)).max() <= 1e-5          # before: "query: " prepended, 512 tokens
    assert emb.identity == models.embedder_identity(str(st)) and emb.identity.endswith("/st-mean-pool-max12")
    assert models.embedder_convention(str(st)) == models.EmbedConvention("sentence-transformers", "", 12, False)
    # batched at the GPU's shapes: the same vectors
    models.load_embedder.cache_clear()
    batched = models.load_embedder(str(st), device="cpu", batch_tokens=256, bucket_tokens=8).encode(TEXTS)
    assert np.abs(batched - got).max() <= 1e-6


def test_a_default_prompt_no_normalize_module_and_the_legacy_files_are_read_as_the_library_reads_them(bert, tmp_path):
    # a default prompt: prepended by the library's encode, so here too; another convention, another identity
    st = _st(bert, tmp_path / "prompted", prompts={"sym": "query: "}, default_prompt_name="sym")
    assert np.abs(models.load_embedder(str(st), device="cpu").encode(TEXTS) - _reference(st, TEXTS)).max() <= 1e-5
    conv = models.embedder_convention(str(st))
    assert conv.prefix == "query: " and "-prompt" in conv.tag
    # prompts declared but no default one: the library's encode prepends none
    st2 = _st(bert, tmp_path / "undeclared", prompts={"query": "query: ", "document": "passage: "})
    assert models.embedder_convention(str(st2)).prefix == ""
    # all-mpnet-base-v2's files as the hub holds them: legacy pooling keys, max_seq_length and do_lower_case in
    # sentence_bert_config.json (here with a tokenizer that does not lowercase), no Normalize module
    st3 = _st(bert, tmp_path / "legacy", normalize=False, max_seq_length=None)
    (st3 / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": 16, "pooling_mode_cls_token": False, "pooling_mode_mean_tokens": True,
         "pooling_mode_max_tokens": False, "pooling_mode_mean_sqrt_len_tokens": False}))
    (st3 / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 10, "do_lower_case": False}))
    tc = json.loads((st3 / "tokenizer_config.json").read_text())
    (st3 / "tokenizer_config.json").write_text(json.dumps({**tc, "do_lower_case": False}))
    upper = [t.upper() for t in TEXTS]
    assert np.abs(_reference(st3, upper) - _reference(st3, TEXTS)).max() > 1e-3   # the tokenizer itself keeps the case
    (st3 / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 10, "do_lower_case": True}))
    got = models.load_embedder(str(st3), device="cpu").encode(upper)
    assert np.abs(got - _reference(st3, upper)).max() <= 1e-5
    assert np.abs(got - _reference(st3, TEXTS)).max() <= 1e-5          # lowercased, as the library does: the same vectors
    assert models.embedder_identity(str(st3)).endswith("/st-mean-pool-max10-lower")


def test_pooling_other_than_mean_and_other_modules_are_refused_in_one_line(bert, tmp_path):
    st = _st(bert, tmp_path / "cls-st", pooling="cls")
    for call in (lambda: models.load_embedder(str(st), device="cpu"), lambda: models.embedder_identity(str(st))):
        with pytest.raises(StealthEvalError, match=r"^embedder '.*cls-st': pools by 'cls'; [^\n]*$"):
            call()
    assert models.LOADS["embedder", str(st), "cpu", "float32"] == 0         # refused before any weights load
    mods = json.loads((st / "modules.json").read_text())
    (st / "modules.json").write_text(json.dumps(mods + [{"idx": 2, "name": "2", "path": "2_Dense",
                                                          "type": "sentence_transformers.models.Dense"}]))
    with pytest.raises(StealthEvalError, match="modules are .*Dense"):
        models.embedder_identity(str(st))


def _e5_reference(folder, texts):
    "E5 written out: 'query: ' + text, at most 512 tokens, attention-masked mean of the last hidden states, unit length."
    from transformers import AutoModel, AutoTokenizer
    tok, m = AutoTokenizer.from_pretrained(folder), AutoModel.from_pretrained(folder).eval()
    out = []
    for t in texts:
        ids = tok("query: " + t, truncation=True, max_length=512, return_tensors="pt")
        with torch.no_grad(): h = m(**ids).last_hidden_state[0].double()
        e = h.mean(0).numpy()
        out.append(e / np.linalg.norm(e))
    return np.array(out)


def test_a_folder_without_modules_json_is_read_as_e5_as_before(bert, tmp_path):
    emb = models.load_embedder(str(bert), device="cpu")
    assert np.abs(emb.encode(TEXTS) - _e5_reference(bert, TEXTS)).max() <= 1e-5
    assert models.embedder_convention(str(bert)) == models.E5_CONVENTION
    assert emb.identity.endswith(f"/{models.ENCODE_VERSION}/e5-query-mean-512")
    # the same weights as a sentence-transformers folder: another convention, other vectors, another identity
    st = _st(bert, tmp_path / "bert", max_seq_length=64)
    assert models.embedder_identity(str(st)).split("/")[-1] == "st-mean-pool-max64"
    assert np.abs(models.load_embedder(str(st), device="cpu").encode(TEXTS) - emb.encode(TEXTS)).max() > 1e-3


def test_the_embedded_minilm_alias_is_its_own_sentence_transformers_folder():
    conv = models.embedder_convention("all-minilm-l6-v2")
    assert conv == models.EmbedConvention("sentence-transformers", "", 256, False)
    assert models.embedder_identity("all-minilm-l6-v2").startswith("all-minilm-l6-v2@local:")


def _hub_cache(root, repo, files: dict, absent=()):
    "A hub cache laid out as huggingface_hub lays it out: refs/main -> commit, snapshots/<commit>/<files>, .no_exist."
    commit = "0123456789abcdef0123456789abcdef01234567"
    d = root / f"models--{repo.replace('/', '--')}"
    (d / "refs").mkdir(parents=True, exist_ok=True)
    (d / "refs" / "main").write_text(commit)
    for name, src in files.items():
        (d / "snapshots" / commit / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(src, d / "snapshots" / commit / name)
    for name in absent:
        (d / ".no_exist" / commit).mkdir(parents=True, exist_ok=True)
        (d / ".no_exist" / commit / name).touch()
    return commit


def test_hub_repos_are_read_from_the_hub_cache_offline(bert, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    st = _st(bert, tmp_path / "st", pooling="mean")
    cache = tmp_path / "hub"
    files = {p.relative_to(st).as_posix(): p for p in st.rglob("*.json")}
    commit = _hub_cache(cache, "sentence-transformers/tiny-mpnet", files)
    base, where, rev, conv = models.embedder_source("sentence-transformers/tiny-mpnet", cache_dir=cache)
    assert base == f"sentence-transformers/tiny-mpnet@{commit}" and rev == commit and conv.tag == "st-mean-pool-max12"
    # an E5 hub id is E5 whatever files it ships (intfloat/e5-base-v2 ships a modules.json too)
    _hub_cache(cache, "intfloat/e5-base-v2", files)
    assert models.embedder_convention("intfloat/e5-base-v2", cache_dir=cache) == models.E5_CONVENTION
    # a hub repo with a CLS pooling: refused; one with no modules.json and no E5 name: refused, not guessed
    cls = _st(bert, tmp_path / "cls", pooling="cls")
    _hub_cache(cache, "someone/cls-model", {p.relative_to(cls).as_posix(): p for p in cls.rglob("*.json")})
    with pytest.raises(StealthEvalError, match="pools by 'cls'"):
        models.embedder_convention("someone/cls-model", cache_dir=cache)
    _hub_cache(cache, "someone/plain-bert", {"config.json": bert / "config.json"}, absent=["modules.json"])
    with pytest.raises(StealthEvalError, match="neither a sentence-transformers model"):
        models.embedder_convention("someone/plain-bert", cache_dir=cache)


def test_an_embedder_in_bfloat16_has_its_own_identity_and_pools_in_float32(bert, tmp_path):
    """ProxiHuman's embedder may run in bf16 (`perturbation.proxihuman_embed_dtype`, a GPU run's default): its identity
    says so (a bf16 embedding never answers for a float32 one in the store), float32's identity is unchanged, the
    weights are bf16, and the vectors (pooled in float32) stay close to float32's."""
    st = _st(bert, tmp_path / "tiny-st")
    f32 = models.load_embedder(str(st), device="cpu")
    b16 = models.load_embedder(str(st), device="cpu", dtype="bfloat16")
    assert f32.identity == models.embedder_identity(str(st)) == models.embedder_identity(str(st), dtype="float32")
    assert b16.identity == models.embedder_identity(str(st), dtype="bfloat16") == f32.identity + "#bfloat16"
    got, ref = b16.encode(TEXTS), f32.encode(TEXTS)
    assert got.dtype == np.float32 and not np.array_equal(got, ref)
    assert np.abs(got - ref).max() < 0.05 and (got * ref).sum(1).min() > 0.995   # unit vectors: cosine to float32's
    with pytest.raises(ValueError, match="float32, bfloat16 or float16"):
        models.embedder_identity(str(st), dtype="int8")
