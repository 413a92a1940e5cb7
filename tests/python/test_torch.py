"""m3sa.torch: torch.ops.m3sa.* on CPU tensors (opcheck; the same results as m3sa.vllm on numpy).
Where torch is not installed these skip, and importing m3sa.torch must say why."""
import importlib.util
import math

import numpy as np
import pytest
from conftest import HEAD_DIM, random_bf16
from test_vllm import GQA, HEADS, INIT, LOCAL, PREFILL, TOPK, VllmBatch

import m3sa.vllm as mv

HAVE_TORCH = importlib.util.find_spec("torch") is not None


@pytest.fixture
def torch():
    return pytest.importorskip("torch", reason="torch is not installed")


@pytest.mark.skipif(HAVE_TORCH, reason="torch is installed")
def test_import_without_torch_says_why():
    with pytest.raises(ImportError, match="m3sa.torch needs PyTorch .*torch is not installed"):
        import m3sa.torch  # noqa: F401


def as_torch(torch, array, dtype=None):
    tensor = torch.from_numpy(np.ascontiguousarray(array))
    return tensor.view(dtype) if dtype is not None else tensor


def prefill_args(torch, b):
    return (as_torch(torch, b.idx_q, torch.bfloat16), as_torch(torch, b.index_kv_cache, torch.bfloat16),
            as_torch(torch, b.block_table), as_torch(torch, b.cu_seqlens_q), as_torch(torch, b.seq_lens),
            as_torch(torch, b.prefix_lens), int(b.q_lens.max()), b.max_seq_len, HEADS)


def test_ops_match_m3sa_vllm_and_pass_opcheck(torch):
    import m3sa.torch  # noqa: F401  (registers torch.ops.m3sa)

    ops = torch.ops.m3sa
    b = VllmBatch(1, **PREFILL)
    args = prefill_args(torch, b)
    want_score = mv.minimax_m3_index_score(b.idx_q, b.index_kv_cache, b.block_table, b.cu_seqlens_q,
                                           b.seq_lens, b.prefix_lens, *args[6:])
    score = ops.index_score(*args)
    np.testing.assert_array_equal(score.numpy(), want_score)
    torch.library.opcheck(ops.index_score.default, args)

    topk_args = (score, args[3], args[5], args[6], TOPK, INIT, LOCAL)
    topk = ops.index_topk(*topk_args)
    np.testing.assert_array_equal(topk.numpy(), mv.minimax_m3_index_topk(
        want_score, b.cu_seqlens_q, b.prefix_lens, args[6], TOPK, INIT, LOCAL))
    torch.library.opcheck(ops.index_topk.default, topk_args)

    kv = b.kv_cache("bf16")
    q = random_bf16(b.rng, (b.total_q, HEADS * GQA, HEAD_DIM))
    want = np.zeros_like(q)
    mv.minimax_m3_sparse_attn(q, kv, topk.numpy(), b.block_table, b.cu_seqlens_q, b.seq_lens,
                              b.prefix_lens, args[6], HEADS, 1 / math.sqrt(HEAD_DIM), want)
    out = torch.zeros((b.total_q, HEADS * GQA, HEAD_DIM), dtype=torch.bfloat16)
    attn_args = (as_torch(torch, q, torch.bfloat16), as_torch(torch, kv, torch.bfloat16), topk, args[2],
                 args[3], args[4], args[5], args[6], HEADS, 1 / math.sqrt(HEAD_DIM), out)
    ops.sparse_attn(*attn_args)
    np.testing.assert_array_equal(out.view(torch.int16).numpy().view(np.uint16), want)
    torch.library.opcheck(ops.sparse_attn.default, attn_args)


def test_decode_ops_pass_opcheck(torch):
    import m3sa.torch  # noqa: F401

    ops = torch.ops.m3sa
    n = 3
    b = VllmBatch(2, (1, 1, 1), (700, 129, 300))
    args = prefill_args(torch, b)
    decode_args = (args[0], args[1], args[2], args[4], b.max_seq_len, TOPK, INIT, LOCAL, HEADS, 1, 1)
    topk = ops.index_decode(*decode_args)
    np.testing.assert_array_equal(topk.numpy(), mv.minimax_m3_index_decode(
        b.idx_q, b.index_kv_cache, b.block_table, b.seq_lens, b.max_seq_len, TOPK, INIT, LOCAL, HEADS, 1, 1))
    torch.library.opcheck(ops.index_decode.default, decode_args)
    kv = as_torch(torch, b.kv_cache("bf16"), torch.bfloat16)
    q = as_torch(torch, random_bf16(b.rng, (n, HEADS * GQA, HEAD_DIM)), torch.bfloat16)
    out = torch.zeros_like(q)
    attn_args = (q, kv, topk, args[2], args[4], HEADS, 1 / math.sqrt(HEAD_DIM), out, 1)
    ops.sparse_attn_decode(*attn_args)
    assert out.abs().sum() > 0
    torch.library.opcheck(ops.sparse_attn_decode.default, attn_args)
