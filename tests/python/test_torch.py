"""m3sa.torch: torch.ops.m3sa.* on CPU tensors (opcheck; the same results as m3sa.vllm on numpy).
Where torch is not installed these skip, and importing m3sa.torch must say why."""
import importlib.util
import math

import numpy as np
import pytest
from conftest import BLOCK, HEAD_DIM, random_bf16
from test_vllm import GQA, HEADS, INIT, LOCAL, PREFILL, TOPK, VllmBatch, norm_rope_inputs, prefill_topk

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


def fresh_outputs(torch, args, *positions):
    """args with a zero tensor like each output at these positions, for opcheck: its schema check
    sees an undeclared write only where the write changes the tensor, so outputs that already hold
    the op's result (from the call before) would hide one."""
    return tuple(torch.zeros_like(a) if i in positions else a for i, a in enumerate(args))


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
    torch.library.opcheck(ops.sparse_attn.default, fresh_outputs(torch, attn_args, 10))


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
    torch.library.opcheck(ops.sparse_attn_decode.default, fresh_outputs(torch, attn_args, 7))


def test_ragged_sparse_attn_decode_matches_m3sa_vllm(torch):
    """sparse_attn_decode with query_start_loc (MTP-verify rows of different lengths)."""
    import m3sa.torch  # noqa: F401

    b = VllmBatch(4, (1, 3, 2), (500, 260, 129))
    _, topk = prefill_topk(b)
    kv = b.kv_cache("bf16")
    q = random_bf16(b.rng, (b.total_q, HEADS * GQA, HEAD_DIM))
    owners = np.repeat(np.arange(3), b.q_lens).astype(np.int32)
    want = np.zeros_like(q)
    mv.minimax_m3_sparse_attn_decode(q, kv, topk, b.block_table, b.seq_lens, HEADS, 1 / math.sqrt(HEAD_DIM),
                                     want, 1, query_start_loc=b.cu_seqlens_q, token_to_req_indices=owners)
    out = torch.zeros((b.total_q, HEADS * GQA, HEAD_DIM), dtype=torch.bfloat16)
    args = (as_torch(torch, q, torch.bfloat16), as_torch(torch, kv, torch.bfloat16), as_torch(torch, topk),
            as_torch(torch, b.block_table), as_torch(torch, b.seq_lens), HEADS, 1 / math.sqrt(HEAD_DIM),
            out, 1, None, None, as_torch(torch, b.cu_seqlens_q), as_torch(torch, owners))
    torch.ops.m3sa.sparse_attn_decode(*args)
    np.testing.assert_array_equal(out.view(torch.int16).numpy().view(np.uint16), want)
    assert np.count_nonzero(want) > 0
    torch.library.opcheck(torch.ops.m3sa.sparse_attn_decode.default, fresh_outputs(torch, args, 7))


def test_m3sa_layout_ops_match_m3sa_vllm_and_pass_opcheck(torch):
    """torch.ops.m3sa.norm_rope_insert and sparse_attention (m3sa's cache layout; test_gpu.py runs
    them on CUDA) on CPU tensors: the same bits as m3sa.vllm's on numpy, with k_scale != v_scale
    and decode requests first, one of them vLLM's CUDA-graph padding (seq_len 0)."""
    import m3sa.torch  # noqa: F401

    ops = torch.ops.m3sa
    b = VllmBatch(5, (1, 1, 1, 37, 5), (700, 129, 0, 300, 40))
    t, hq, num_decode = b.total_q, HEADS * GQA, 3
    inputs = list(norm_rope_inputs(b, lambda: (1 + 0.1 * b.rng.standard_normal(HEAD_DIM)).astype(np.float32))
                  .values())

    def outputs():
        kv_cache = (b.num_pages, BLOCK, HEADS, HEAD_DIM)
        return [np.zeros((t, hq, HEAD_DIM), np.uint16), np.zeros(kv_cache, np.uint16),
                np.zeros(kv_cache, np.uint16), np.zeros((t, HEADS, HEAD_DIM), np.uint16),
                np.zeros((b.num_pages, BLOCK, HEAD_DIM), np.uint16)]

    def as_tensor(array):
        return as_torch(torch, array, torch.bfloat16 if array.dtype == np.uint16 else None)

    want = outputs()
    mv.norm_rope_insert(*inputs, *want, None, 1e-6, 5e6, 0.5, 2.0)
    got = [as_tensor(array) for array in outputs()]
    args = (*[as_tensor(array) for array in inputs], *got, None, 1e-6, 5e6, 0.5, 2.0)
    ops.norm_rope_insert(*args)
    for tensor, array in zip(got, want):
        np.testing.assert_array_equal(tensor.view(torch.int16).numpy().view(np.uint16), array)
        assert np.count_nonzero(array) > 0
    torch.library.opcheck(ops.norm_rope_insert.default, fresh_outputs(torch, args, *range(12, 17)))

    topk = b.reference_topk(num_decode=num_decode)
    q, k_cache, v_cache = want[0], want[1], want[2]
    expected = np.zeros((t, hq, HEAD_DIM), np.uint16)
    mv.sparse_attention(q, k_cache, v_cache, topk, b.cu_seqlens_q, b.seq_lens, b.block_table, expected,
                        num_decode_requests=num_decode, k_scale=0.5, v_scale=2.0)
    out = torch.zeros((t, hq, HEAD_DIM), dtype=torch.bfloat16)
    args = (as_tensor(q), as_tensor(k_cache), as_tensor(v_cache), as_tensor(topk), as_tensor(b.cu_seqlens_q),
            as_tensor(b.seq_lens), as_tensor(b.block_table), out, num_decode, 1, 0.5, 2.0)
    ops.sparse_attention(*args)
    np.testing.assert_array_equal(out.view(torch.int16).numpy().view(np.uint16), expected)
    assert (expected[2] == 0).all() and np.count_nonzero(expected) > 0  # the padding row: zeros
    torch.library.opcheck(ops.sparse_attention.default, fresh_outputs(torch, args, 7))
