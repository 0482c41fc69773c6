"""T5 fills out of GPU memory: one line naming the settings to lower, never a traceback, and no batch split by memory."""
import pytest
import torch

import stealth_eval.models as M
from stealth_eval.core import StealthEvalError
from stealth_eval.perturbation import MASK, iter_t5_fill


class _Tok:   # what iter_t5_fill asks of a tokenizer before the first batch
    def __call__(self, text): return type("E", (), {"input_ids": [1, 2, 3]})()
    def convert_tokens_to_ids(self, t): return 7


def test_t5_fills_out_of_memory_is_one_line_naming_the_settings(monkeypatch):
    def oom(*a, **k):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
        yield
    monkeypatch.setattr(M, "iter_seq2seq_sample", oom)
    with pytest.raises(StealthEvalError) as e:
        list(iter_t5_fill((None, _Tok(), "t5", "cuda"), [["a", MASK, "b"]], [0], max_length=8, batch_tokens=262144, max_rows=512))
    msg = str(e.value)
    assert "out of memory on cuda at a batch of up to 512 rows and 262144 source tokens" in msg
    assert "perturbation.fill_batch_tokens" in msg and "perturbation.batch_size" in msg and "\n" not in msg
