"""Every op through the Python API on numpy arrays: the CPU backend against the reference, within
the C++ tests' bounds (src/testing/compare.h, exported as m3sa._core.testing_bounds())."""
import importlib.metadata

import numpy as np
import pytest
from conftest import BLOCK, HEAD_DIM, make_case, plan_for, random_bf16, run_index_topk

import m3sa

BOUNDS = m3sa._core.testing_bounds()
HOST_BACKENDS = ["reference", "cpu"]


def run_all(run):
    """run(backend) for the reference and the CPU backend."""
    return [run(backend) for backend in HOST_BACKENDS]


def test_registry_answers():
    # the wheel's version (read from CMakeLists.txt) is the library's
    assert m3sa.__version__ == importlib.metadata.version("m3sa")
    assert {"reference", "cpu"} <= set(m3sa.backends())
    names = {impl.name for impl in m3sa.implementations()}
    assert {"reference.index_topk", "cpu.sparse_attention"} <= names
    assert m3sa.supports("cpu", "index_topk")
    assert m3sa.supports("cpu")
    if not m3sa.cuda_backend_built():
        support = m3sa.supports("cuda", "sparse_attention")
        assert not support and "built without" in support.reason


def test_supports_refuses_a_cache_dtype_outside_bf16_and_e4m3():
    # as make_plan does: the caller's error, named, for each host backend (it used to answer yes)
    for backend in ("reference", "cpu"):
        support = m3sa.supports(backend, "index_topk", cache_dtype="f32")
        assert not support
        assert "cache_dtype: expected bf16 or fp8_e4m3, got f32" in support.reason
        assert not m3sa.supports(backend, cache_dtype="i32")
        assert m3sa.supports(backend, "sparse_attention", cache_dtype="fp8_e4m3")


def test_insert_index_k_matches_reference(case):
    index_k = case.rng.standard_normal((case.num_tokens, HEAD_DIM)).astype(np.float32)
    dtype = np.uint8 if case.index_dtype == "fp8_e4m3" else np.uint16

    def run(backend):
        plan = plan_for(case, "insert_index_k", backend)
        cache = np.zeros((case.num_pages, BLOCK, HEAD_DIM), dtype)
        m3sa.insert_index_k(plan, index_k, case.slots, cache, workspace=m3sa.allocate_workspace(plan))
        return cache

    want, got = run_all(run)
    np.testing.assert_array_equal(got, want)  # one rounding from fp32 on both
    assert np.count_nonzero(got) > 0


def test_score_and_select_match_reference(case):
    width = case.capacities.max_blocks_per_request
    heads = case.config.num_index_heads

    def scores_of(backend):
        plan = plan_for(case, "score_blocks", backend)
        scores = np.zeros((heads, case.num_tokens, width), np.float32)
        m3sa.score_blocks(plan, case.index_q, case.index_k_cache, case.batch, scores,
                          workspace=m3sa.allocate_workspace(plan))
        return scores

    want_scores, got_scores = run_all(scores_of)
    np.testing.assert_array_equal(got_scores, want_scores)  # integer data: exact in fp32

    def select(backend):
        plan = plan_for(case, "select_topk_blocks", backend, cache_dtype="bf16")
        topk = np.zeros((heads, case.num_tokens, case.config.top_k), np.int32)
        m3sa.select_topk_blocks(plan, want_scores, case.batch, topk,
                                workspace=m3sa.allocate_workspace(plan))
        return topk

    want, got = run_all(select)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got, run_index_topk(case, "reference"))  # the fused op agrees


def test_index_topk_matches_reference_and_honours_strides(case):
    want, got = run_all(lambda backend: run_index_topk(case, backend))
    np.testing.assert_array_equal(got, want)
    assert (got[:, :, 0] >= 0).all()  # every token selects at least its own block
    # topk as a [T, H, K] array seen through an [H, T, K] view (ops.h: strides are free)
    plan = plan_for(case, "index_topk", "cpu")
    heads, k = case.config.num_index_heads, case.config.top_k
    token_major = np.full((case.num_tokens, heads, k), -7, np.int32)
    m3sa.index_topk(plan, case.index_q, case.index_k_cache, case.batch, token_major.transpose(1, 0, 2),
                    workspace=m3sa.allocate_workspace(plan))
    np.testing.assert_array_equal(token_major.transpose(1, 0, 2), want)


def test_plan_and_workspace_are_reused():
    first, second = make_case(seed=1), make_case(seed=2)
    plan = plan_for(first, "index_topk", "cpu")
    workspace = m3sa.allocate_workspace(plan)
    for case in (first, second, first):
        np.testing.assert_array_equal(run_index_topk(case, "cpu", plan, workspace),
                                      run_index_topk(case, "reference"))


def attention_errors(want_out, got_out, want_lse, got_lse):
    """compare_attention (src/testing/compare.h): relative L2 of the outputs, max lse error."""
    want = m3sa.from_bf16_bits(want_out).astype(np.float64)
    got = m3sa.from_bf16_bits(got_out).astype(np.float64)
    relative_l2 = np.linalg.norm(got - want) / np.linalg.norm(want)
    finite = np.isfinite(want_lse)
    assert (np.isfinite(got_lse) == finite).all() and (got_lse[~finite] == want_lse[~finite]).all()
    return relative_l2, float(np.max(np.abs(got_lse[finite] - want_lse[finite]), initial=0))


@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8_e4m3"])
def test_sparse_attention_matches_reference(kv_dtype):
    case = make_case(seed=5)
    topk = run_index_topk(case, "reference")
    # vLLM's combined cache [pages, Hkv, 128, 2 x 128]: K and V are strided views of it.
    shape = (case.num_pages, case.kv_heads, BLOCK, 2 * HEAD_DIM)
    if kv_dtype == "fp8_e4m3":
        kv = case.rng.integers(0, 0x40, size=shape, dtype=np.uint8)  # magnitudes below 2, as scaled K/V
        kv |= case.rng.integers(0, 2, size=shape, dtype=np.uint8) << 7
    else:
        kv = random_bf16(case.rng, shape)
    k_cache = kv[..., :HEAD_DIM].transpose(0, 2, 1, 3)
    v_cache = kv[..., HEAD_DIM:].transpose(0, 2, 1, 3)
    q = random_bf16(case.rng, (case.num_tokens, case.q_heads, HEAD_DIM))

    def run(backend, k=k_cache, v=v_cache):
        plan = plan_for(case, "sparse_attention", backend, cache_dtype=kv_dtype)
        out = np.zeros((case.num_tokens, case.q_heads, HEAD_DIM), np.uint16)
        lse = np.zeros((case.num_tokens, case.q_heads), np.float32)
        m3sa.sparse_attention(plan, q, k, v, topk, case.batch, out, lse=lse, k_scale=0.5,
                              v_scale=0.25, workspace=m3sa.allocate_workspace(plan))
        return out, lse

    (want_out, want_lse), (got_out, got_lse) = run_all(run)
    relative_l2, lse_error = attention_errors(want_out, got_out, want_lse, got_lse)
    assert relative_l2 <= BOUNDS["attention_relative_l2"]
    assert lse_error <= BOUNDS["attention_lse"]
    # the same caches made contiguous: the same bits (the views were read through their strides)
    dense_out, dense_lse = run("cpu", np.ascontiguousarray(k_cache), np.ascontiguousarray(v_cache))
    np.testing.assert_array_equal(dense_out, got_out)
    np.testing.assert_array_equal(dense_lse, got_lse)


def bf16_ulps_apart(a, b):
    """Distance in bf16 ulps of same-signed values (bit patterns are monotonic per sign)."""
    return np.abs(a.astype(np.int32) - b.astype(np.int32))


def test_norm_rope_insert_within_one_ulp_of_reference():
    case = make_case(seed=7)
    tokens, heads, hq, hkv = case.num_tokens, case.config.num_index_heads, case.q_heads, case.kv_heads
    inputs = dict(
        q=random_bf16(case.rng, (tokens, hq, HEAD_DIM)), k=random_bf16(case.rng, (tokens, hkv, HEAD_DIM)),
        v=random_bf16(case.rng, (tokens, hkv, HEAD_DIM)),
        index_q=random_bf16(case.rng, (tokens, heads, HEAD_DIM)),
        index_k=random_bf16(case.rng, (tokens, HEAD_DIM)), positions=case.positions,
        slot_mapping=case.slots, index_slot_mapping=case.slots,
        **{name: (1 + 0.1 * case.rng.standard_normal(HEAD_DIM)).astype(np.float32)
           for name in ("q_norm_weight", "k_norm_weight", "index_q_norm_weight", "index_k_norm_weight")})

    def run(backend):
        plan = plan_for(case, "norm_rope_insert", backend, cache_dtype="bf16")
        outputs = dict(q_out=np.zeros((tokens, hq, HEAD_DIM), np.uint16),
                       k_cache=np.zeros((case.num_pages, BLOCK, hkv, HEAD_DIM), np.uint16),
                       v_cache=np.zeros((case.num_pages, BLOCK, hkv, HEAD_DIM), np.uint16),
                       index_q_out=np.zeros((tokens, heads, HEAD_DIM), np.uint16),
                       index_k_cache=np.zeros((case.num_pages, BLOCK, HEAD_DIM), np.uint16))
        m3sa.norm_rope_insert(plan, **inputs, **outputs, workspace=m3sa.allocate_workspace(plan))
        return outputs

    want, got = run_all(run)
    for name in want:  # tests/unit/norm_rope_test.cpp: within one ulp, rarely off by one
        assert bf16_ulps_apart(want[name], got[name]).max() <= 1, name
        assert np.mean(want[name] != got[name]) < 1e-3, name
    np.testing.assert_array_equal(got["v_cache"], want["v_cache"])  # v is stored as is


def test_bf16_bits_round_to_nearest_even_and_keep_infinities_and_nan():
    """m3sa.to_bf16_bits against hand-computed bit patterns: every test's bf16 inputs come from it,
    and its reference answers too, so only fixed patterns catch a wrong rounding."""
    cases = {  # float32 bits -> bf16 bits
        0x3F800000: 0x3F80,  # 1.0
        0x3F808000: 0x3F80,  # 1 + 2^-8: a tie, to the even 1.0
        0x3F818000: 0x3F82,  # 1 + 3 x 2^-8: a tie, to the even 1 + 2^-6
        0x3F808001: 0x3F81,  # just past the tie: up
        0x3F807FFF: 0x3F80,  # just below it: down
        0xBF808000: 0xBF80,  # -(1 + 2^-8): a tie, to the even -1.0
        0x7F7FFFFF: 0x7F80,  # the largest float32 rounds to infinity
        0x7F800000: 0x7F80, 0xFF800000: 0xFF80,  # infinities stay infinities
        0x7F800001: 0x7FC0,  # a NaN whose payload is in the dropped bits: still NaN (quiet)
        0xFFFFFFFF: 0xFFFF, 0x7FC00000: 0x7FC0,
        0x00000000: 0x0000, 0x80000000: 0x8000, 0x00008000: 0x0000,  # zeros; a subnormal tie to 0
    }
    bits = np.array(list(cases), np.uint32)
    np.testing.assert_array_equal(m3sa.to_bf16_bits(bits.view(np.float32)),
                                  np.array(list(cases.values()), np.uint16))
    back = m3sa.from_bf16_bits(np.array([0x3F80, 0x3F82, 0xFF80, 0x8000], np.uint16))
    np.testing.assert_array_equal(back.view(np.uint32), [0x3F800000, 0x3F820000, 0xFF800000, 0x80000000])
