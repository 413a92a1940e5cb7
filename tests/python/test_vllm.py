"""m3sa.vllm: vLLM's five op signatures over numpy arrays, against the reference backend called
through the plain API on the same data (selections identical on integer-valued data, attention
within the C++ tests' bounds), plus the errors that stand for "m3sa cannot serve this call"."""
import math

import numpy as np
import pytest
from conftest import BLOCK, HEAD_DIM, random_bf16, small_ints

import m3sa
import m3sa.vllm as mv

BOUNDS = m3sa._core.testing_bounds()
SCALE = 1 / math.sqrt(HEAD_DIM)
HEADS, GQA, TOPK, INIT, LOCAL = 2, 4, 4, 1, 1


class VllmBatch:
    """vLLM's metadata for requests (q_len, seq_len), each block on its own shuffled page."""

    def __init__(self, seed, q_lens, seq_lens, index_dtype="bf16"):
        self.rng = rng = np.random.default_rng(seed)
        blocks = [-(-s // BLOCK) for s in seq_lens]
        self.width = max(blocks) + 2  # columns past a request's blocks stay unread
        self.num_pages = sum(blocks) + 3
        pages = rng.permutation(self.num_pages).astype(np.int32)
        self.block_table = np.zeros((len(seq_lens), self.width), np.int32)
        used = 0
        for r, n in enumerate(blocks):
            self.block_table[r, :n] = pages[used:used + n]
            used += n
        self.q_lens = np.array(q_lens, np.int32)
        self.cu_seqlens_q = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
        self.seq_lens = np.array(seq_lens, np.int32)
        self.prefix_lens = self.seq_lens - self.q_lens
        self.total_q = int(self.cu_seqlens_q[-1])
        self.max_seq_len = int(self.seq_lens.max())
        self.index_dtype = index_dtype
        self.idx_q = small_ints(rng, (self.total_q, HEADS, HEAD_DIM), index_dtype)
        self.index_kv_cache = small_ints(rng, (self.num_pages, BLOCK, HEAD_DIM), index_dtype)

    def batch(self, num_decode=0, decode_q_len=1):
        return m3sa.Batch(self.cu_seqlens_q, self.seq_lens, self.block_table, num_tokens=self.total_q,
                          num_decode_requests=num_decode, decode_q_len=decode_q_len)

    def plan(self, op, dtype=None, backend="reference", init=INIT, local=LOCAL):
        config = m3sa.Config(top_k=TOPK, init_blocks=init, local_blocks=local, num_index_heads=HEADS)
        caps = m3sa.Capacities(max_requests=len(self.seq_lens), max_tokens=max(self.total_q, 1),
                               max_blocks_per_request=self.width)
        return m3sa.make_plan(op, backend, config, caps, dtype or self.index_dtype)

    def reference_topk(self, init=INIT, local=LOCAL, **batch):
        plan = self.plan("index_topk", init=init, local=local)
        topk = np.full((HEADS, self.total_q, TOPK), -7, np.int32)
        m3sa.index_topk(plan, self.idx_q, self.index_kv_cache, self.batch(**batch), topk,
                        workspace=m3sa.allocate_workspace(plan))
        return topk

    def token_slots(self):
        """Each token's position (vLLM's prefix_lens + i; 0 for a padding request's token) and its
        KV cache slot (-1, none, for a padding request's token), as norm_rope_insert takes them."""
        owner = np.repeat(np.arange(len(self.q_lens)), self.q_lens)
        offsets = np.concatenate([np.arange(n) for n in self.q_lens])
        positions = np.maximum(self.prefix_lens[owner] + offsets, 0).astype(np.int64)
        slots = self.block_table[owner, positions // BLOCK].astype(np.int64) * BLOCK + positions % BLOCK
        slots[self.seq_lens[owner] == 0] = -1
        return positions, slots

    def kv_cache(self, kv_dtype):
        shape = (self.num_pages, HEADS, BLOCK, 2 * HEAD_DIM)  # vLLM's combined cache
        if kv_dtype == "bf16":
            return random_bf16(self.rng, shape)
        kv = self.rng.integers(0, 0x40, size=shape, dtype=np.uint8)  # e4m3 magnitudes below 2
        return kv | (self.rng.integers(0, 2, size=shape, dtype=np.uint8) << 7)

    def reference_attention(self, q, kv, topk, kv_dtype, k_scale, v_scale, **batch):
        plan = self.plan("sparse_attention", kv_dtype)
        out = np.zeros(q.shape, np.uint16)
        lse = np.zeros(q.shape[:2], np.float32)
        m3sa.sparse_attention(plan, q, np.ascontiguousarray(kv[..., :HEAD_DIM].transpose(0, 2, 1, 3)),
                              np.ascontiguousarray(kv[..., HEAD_DIM:].transpose(0, 2, 1, 3)), topk,
                              self.batch(**batch), out, lse=lse, k_scale=k_scale, v_scale=v_scale,
                              workspace=m3sa.allocate_workspace(plan))
        return out


PREFILL = dict(q_lens=(37, 5, 1), seq_lens=(300, 40, 700))
DECODE_SEQ_LENS = (700, 129, 0, 300)  # request 2 is vLLM's CUDA-graph padding (seq_len 0)


@pytest.fixture(autouse=True)
def fresh_caches():
    mv.clear_caches()
    yield
    mv.clear_caches()


def prefill_topk(b):
    score = mv.minimax_m3_index_score(b.idx_q, b.index_kv_cache, b.block_table, b.cu_seqlens_q,
                                      b.seq_lens, b.prefix_lens, int(b.q_lens.max()), b.max_seq_len,
                                      HEADS)
    return score, mv.minimax_m3_index_topk(score, b.cu_seqlens_q, b.prefix_lens, int(b.q_lens.max()),
                                           TOPK, INIT, LOCAL)


@pytest.mark.parametrize("index_dtype", ["bf16", "fp8_e4m3"])
def test_index_score_and_topk_match_reference(index_dtype):
    b = VllmBatch(1, **PREFILL, index_dtype=index_dtype)
    score, topk = prefill_topk(b)
    max_block = -(-b.max_seq_len // BLOCK)
    assert score.dtype == np.float32 and score.shape == (HEADS, b.total_q, -(-max_block // 16) * 16)
    plan = b.plan("score_blocks")
    want = np.zeros((HEADS, b.total_q, b.width), np.float32)
    m3sa.score_blocks(plan, b.idx_q, b.index_kv_cache, b.batch(), want,
                      workspace=m3sa.allocate_workspace(plan))
    np.testing.assert_array_equal(score[..., :max_block], want[..., :max_block])  # integer data: exact
    assert (score[..., max_block:] == -np.inf).all()  # vLLM leaves them unwritten
    assert topk.dtype == np.int32 and topk.shape == (HEADS, b.total_q, TOPK)
    np.testing.assert_array_equal(topk, b.reference_topk())


def uniform_decode_batch(seed, decode_query_len, index_dtype="bf16"):
    """vLLM's uniform decode batch over DECODE_SEQ_LENS: request-major, decode_query_len rows per
    request, the padding request (seq_len 0) included."""
    n = len(DECODE_SEQ_LENS)
    b = VllmBatch(seed, (decode_query_len,) * 2 + (0,) + (decode_query_len,), DECODE_SEQ_LENS, index_dtype)
    b.q_lens[:] = decode_query_len
    b.cu_seqlens_q = (np.arange(n + 1) * decode_query_len).astype(np.int32)
    b.total_q = n * decode_query_len
    b.idx_q = small_ints(b.rng, (b.total_q, HEADS, HEAD_DIM), index_dtype)
    return b


@pytest.mark.parametrize("index_dtype", ["bf16", "fp8_e4m3"])
@pytest.mark.parametrize("decode_query_len", [1, 2])
def test_index_decode_matches_reference(index_dtype, decode_query_len):
    n = len(DECODE_SEQ_LENS)
    b = uniform_decode_batch(2, decode_query_len, index_dtype)
    topk = mv.minimax_m3_index_decode(b.idx_q, b.index_kv_cache, b.block_table, b.seq_lens,
                                      b.max_seq_len, TOPK, INIT, LOCAL, HEADS, decode_query_len, 4)
    want = b.reference_topk(num_decode=n, decode_q_len=decode_query_len)
    np.testing.assert_array_equal(topk, want)
    pad = slice(2 * decode_query_len, 3 * decode_query_len)
    assert (topk[:, pad] == -1).all()  # the padding request selects nothing


def attention_close(got, want):
    got = m3sa.from_bf16_bits(got).astype(np.float64)
    want = m3sa.from_bf16_bits(want).astype(np.float64)
    return np.linalg.norm(got - want) / np.linalg.norm(want)


@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8_e4m3"])
def test_sparse_attn_matches_reference(kv_dtype, monkeypatch):
    b = VllmBatch(3, **PREFILL)
    _, topk = prefill_topk(b)
    kv = b.kv_cache(kv_dtype)
    q = random_bf16(b.rng, (b.total_q, HEADS * GQA, HEAD_DIM))
    k_scale, v_scale = np.array([0.5], np.float32), np.array([0.25], np.float32)
    want = b.reference_attention(q, kv, topk, kv_dtype, *(
        (0.5, 0.25) if kv_dtype == "fp8_e4m3" else (1.0, 1.0)))  # vLLM ignores scales on bf16

    def run():
        out = np.zeros_like(q)
        assert mv.minimax_m3_sparse_attn(q, kv, topk, b.block_table, b.cu_seqlens_q, b.seq_lens,
                                         b.prefix_lens, int(b.q_lens.max()), HEADS, SCALE, out,
                                         k_scale, v_scale) is None
        return out

    assert attention_close(run(), want) <= BOUNDS["attention_relative_l2"]
    monkeypatch.setattr(mv, "host_backend", "reference")  # the same call on the reference: same bits
    np.testing.assert_array_equal(run(), want)


@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8_e4m3"])
def test_sparse_attn_decode_matches_reference(kv_dtype):
    n = len(DECODE_SEQ_LENS)
    b = VllmBatch(4, (1,) * 2 + (0,) + (1,), DECODE_SEQ_LENS)
    b.q_lens[:] = 1
    b.cu_seqlens_q = np.arange(n + 1, dtype=np.int32)
    b.total_q = n
    b.idx_q = small_ints(b.rng, (n, HEADS, HEAD_DIM), "bf16")
    topk = mv.minimax_m3_index_decode(b.idx_q, b.index_kv_cache, b.block_table, b.seq_lens,
                                      b.max_seq_len, TOPK, INIT, LOCAL, HEADS, 1, 1)
    kv = b.kv_cache(kv_dtype)
    q = random_bf16(b.rng, (n, HEADS * GQA, HEAD_DIM))
    want = b.reference_attention(q, kv, topk, kv_dtype, 1.0, 1.0, num_decode=n, decode_q_len=1)
    out = np.full_like(q, 0x7FC0)  # NaN bits: every row is written
    mv.minimax_m3_sparse_attn_decode(q, kv, topk, b.block_table, b.seq_lens, HEADS, SCALE, out, 1)
    assert attention_close(out, want) <= BOUNDS["attention_relative_l2"]
    assert (out[2] == 0).all()  # the padding request's row: zeros


def test_sparse_attn_decode_ragged_matches_reference():
    b = VllmBatch(5, (1, 3, 2), (500, 260, 129))  # MTP-verify rows of different lengths
    _, topk = prefill_topk(b)
    kv = b.kv_cache("bf16")
    q = random_bf16(b.rng, (b.total_q, HEADS * GQA, HEAD_DIM))
    want = b.reference_attention(q, kv, topk, "bf16", 1.0, 1.0)
    out = np.zeros_like(q)
    owners = np.repeat(np.arange(3), b.q_lens).astype(np.int32)
    mv.minimax_m3_sparse_attn_decode(q, kv, topk, b.block_table, b.seq_lens, HEADS, SCALE, out, 1,
                                     query_start_loc=b.cu_seqlens_q, token_to_req_indices=owners)
    assert attention_close(out, want) <= BOUNDS["attention_relative_l2"]


def test_plans_and_workspaces_are_cached():
    b = VllmBatch(6, **PREFILL)
    first = prefill_topk(b)[1]
    cached = mv.plan_cache()
    plans = [mv._plans[key] for key in cached]
    assert sorted(key[0] for key in cached) == ["score_blocks", "select_topk_blocks"]
    smaller = VllmBatch(7, q_lens=(30, 4, 1), seq_lens=(290, 40, 690))  # within the same capacities
    prefill_topk(smaller)
    assert mv.plan_cache() == cached
    assert all(mv._plans[key] is plan for key, plan in zip(cached, plans))
    np.testing.assert_array_equal(prefill_topk(b)[1], first)


# --- what m3sa cannot serve: a clear error naming the argument ------------------------------------

@pytest.fixture
def attn_call():
    b = VllmBatch(8, **PREFILL)
    _, topk = prefill_topk(b)
    q = random_bf16(b.rng, (b.total_q, HEADS * GQA, HEAD_DIM))
    return dict(q=q, kv_cache=b.kv_cache("bf16"), topk_idx=topk, block_table=b.block_table,
                cu_seqlens_q=b.cu_seqlens_q, seq_lens=b.seq_lens, prefix_lens=b.prefix_lens,
                max_query_len=int(b.q_lens.max()), num_kv_heads=HEADS, sm_scale=SCALE,
                output=np.zeros_like(q))


def test_attention_call_is_valid_as_given(attn_call):
    mv.minimax_m3_sparse_attn(**attn_call)
    assert np.count_nonzero(attn_call["output"]) > 0


@pytest.mark.parametrize("change, match", [
    (dict(sm_scale=0.1), "sm_scale: expected 1/sqrt"),
    (dict(num_kv_heads=1), "num_kv_heads"),
])
def test_unsupported_parameters_raise(attn_call, change, match):
    with pytest.raises(ValueError, match=match):
        mv.minimax_m3_sparse_attn(**{**attn_call, **change})


def test_wrong_layouts_raise(attn_call):
    kv = attn_call["kv_cache"]
    with pytest.raises(ValueError, match="kv_cache: expected .num_blocks, num_kv_heads, 128, 256"):
        mv.minimax_m3_sparse_attn(**{**attn_call, "kv_cache": np.ascontiguousarray(kv.transpose(0, 2, 1, 3))})
    with pytest.raises(ValueError, match="q: expected .tokens, heads, 128"):
        mv.minimax_m3_sparse_attn(**{**attn_call, "q": attn_call["q"][..., :64]})
    with pytest.raises(ValueError, match="topk_idx"):  # token-major [T, Hkv, K] is not vLLM's layout
        mv.minimax_m3_sparse_attn(**{**attn_call, "topk_idx": attn_call["topk_idx"][:1]})
    unsorted = attn_call["topk_idx"][..., ::-1].copy()  # vLLM's own top-k order: not m3sa's format
    with pytest.raises(ValueError, match="topk"):
        mv.minimax_m3_sparse_attn(**{**attn_call, "topk_idx": unsorted})


def test_inconsistent_prefix_lens_raise(attn_call):
    with pytest.raises(ValueError, match="seq_lens: expected prefix_lens \\+ query lengths"):
        mv.minimax_m3_sparse_attn(**{**attn_call, "prefix_lens": attn_call["prefix_lens"] - 1})


def test_kv_scales(attn_call):
    kv8 = (attn_call["kv_cache"] >> 8).astype(np.uint8) & 0xBF  # fp8 bits of moderate magnitude
    per_token = np.ones((HEADS, 4096), np.float32)
    with pytest.raises(ValueError, match="k_scale: expected a per-tensor scale"):
        mv.minimax_m3_sparse_attn(**{**attn_call, "kv_cache": kv8}, k_scale=per_token, v_scale=per_token)
    with pytest.raises(ValueError, match="both provided or both None"):
        mv.minimax_m3_sparse_attn(**{**attn_call, "kv_cache": kv8}, k_scale=np.ones(1, np.float32))
    with pytest.raises(TypeError, match="kv_cache: dtype float16"):
        mv.minimax_m3_sparse_attn(**{**attn_call, "kv_cache": attn_call["kv_cache"].view(np.float16)})


# --- the uniform decode ops in one call (m3sa.vllm's hot path) ------------------------------------

def uniform_decode(seed, kv_dtype="bf16"):
    """The arguments of vLLM's uniform decode (padding request included): the index decode's, then
    the attention's on its selection."""
    n = len(DECODE_SEQ_LENS)
    b = VllmBatch(seed, (1,) * n, DECODE_SEQ_LENS)
    index = (b.idx_q, b.index_kv_cache, b.block_table, b.seq_lens, b.max_seq_len, TOPK, INIT, LOCAL,
             HEADS, 1, 1)
    topk = mv.minimax_m3_index_decode(*index)
    scales = (np.array([0.5], np.float32), np.array([0.25], np.float32))
    attention = dict(q=random_bf16(b.rng, (n, HEADS * GQA, HEAD_DIM)), kv_cache=b.kv_cache(kv_dtype),
                     topk_idx=topk, block_table=b.block_table, seq_lens=b.seq_lens,
                     num_kv_heads=HEADS, sm_scale=SCALE, output=np.full((n, HEADS * GQA, HEAD_DIM),
                                                                       0x7FC0, np.uint16),
                     decode_query_len=1, k_scale=scales[0], v_scale=scales[1])
    return index, attention


def fail_if_called(name):
    def called(*args, **kwargs):
        raise AssertionError(f"the one-call path called {name}")
    return called


@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8_e4m3"])
def test_uniform_decode_runs_in_one_call_as_the_general_path(kv_dtype, monkeypatch):
    index, attention = uniform_decode(12, kv_dtype)
    with monkeypatch.context() as m:  # what the general path builds in Python
        for name in ("_batch", "_check_attention", "_attention", "_run"):
            m.setattr(mv, name, fail_if_called(name))
        topk = mv.minimax_m3_index_decode(*index)
        mv.minimax_m3_sparse_attn_decode(**attention)
        out = attention["output"].copy()
    plans = mv.plan_cache()
    assert len(plans) == 2
    monkeypatch.setattr(mv, "_index_decode_in_one_call", lambda *args: None)
    monkeypatch.setattr(mv, "_attention_decode_in_one_call", lambda *args: False)
    np.testing.assert_array_equal(mv.minimax_m3_index_decode(*index), topk)
    attention["output"][:] = 0x7FC0
    mv.minimax_m3_sparse_attn_decode(**attention)
    np.testing.assert_array_equal(attention["output"], out)  # the same op on the same plans
    assert mv.plan_cache() == plans
    assert (out[2] == 0).all() and not np.isnan(m3sa.from_bf16_bits(out)).any()


@pytest.mark.parametrize("change, error, match", [
    (dict(sm_scale=0.1), ValueError, "sm_scale: expected 1/sqrt"),
    (dict(num_kv_heads=1), ValueError, "num_kv_heads"),
    (dict(output=np.zeros((4, HEADS * GQA, 64), np.uint16)), ValueError, "output: expected q's shape"),
    (dict(q=np.zeros((3, HEADS * GQA, HEAD_DIM), np.uint16),
          output=np.zeros((3, HEADS * GQA, HEAD_DIM), np.uint16)), ValueError,
     "q: expected num_reqs x decode_query_len"),
    (dict(decode_query_len=2), ValueError, "q: expected num_reqs x decode_query_len"),
    ("fp8 kv_cache without k_scale", ValueError, "both provided or both None"),
    ("transposed kv_cache", ValueError, "kv_cache: expected .num_blocks, num_kv_heads, 128, 256"),
    ("token-major topk_idx", ValueError, "topk_idx"),
    ("descending topk_idx", ValueError, "topk"),
    ("float16 kv_cache", TypeError, "kv_cache: dtype float16"),
])
def test_uniform_decode_attention_errors_name_vllms_arguments(change, error, match):
    _, attention = uniform_decode(13)
    if change == "transposed kv_cache":
        change = dict(kv_cache=np.ascontiguousarray(attention["kv_cache"].transpose(0, 2, 1, 3)))
    elif change == "token-major topk_idx":
        change = dict(topk_idx=np.ascontiguousarray(attention["topk_idx"].transpose(1, 0, 2)))
    elif change == "descending topk_idx":  # vLLM's own top-k order is not m3sa's format
        change = dict(topk_idx=attention["topk_idx"][..., ::-1].copy())
    elif change == "fp8 kv_cache without k_scale":
        change = dict(kv_cache=uniform_decode(13, "fp8_e4m3")[1]["kv_cache"], k_scale=None)
    elif change == "float16 kv_cache":
        change = dict(kv_cache=attention["kv_cache"].view(np.float16))
    with pytest.raises(error, match=match):
        mv.minimax_m3_sparse_attn_decode(**{**attention, **change})


def test_index_errors():
    b = VllmBatch(9, **PREFILL)
    with pytest.raises(ValueError, match="num_kv_heads"):
        mv.minimax_m3_index_score(b.idx_q, b.index_kv_cache, b.block_table, b.cu_seqlens_q, b.seq_lens,
                                  b.prefix_lens, 37, b.max_seq_len, HEADS + 1)
    with pytest.raises(ValueError, match="decode_query_len"):
        mv.minimax_m3_index_decode(b.idx_q, b.index_kv_cache, b.block_table, b.seq_lens, b.max_seq_len,
                                   TOPK, INIT, LOCAL, HEADS, 2, 1)
    with pytest.raises(ValueError, match="idx_q: expected num_reqs x decode_query_len"):
        mv.minimax_m3_index_decode(b.idx_q, b.index_kv_cache, b.block_table, b.seq_lens, b.max_seq_len,
                                   TOPK, INIT, LOCAL, HEADS, 1, 1)
    with pytest.raises(ValueError, match="config.top_k"):
        score, _ = prefill_topk(b)
        mv.minimax_m3_index_topk(score, b.cu_seqlens_q, b.prefix_lens, 37, 64, INIT, LOCAL)


class FakeCudaArray:
    """Stands for a CUDA tensor of a framework other than torch (e.g. cupy)."""

    def __init__(self, array):
        self.shape, self.dtype = array.shape, array.dtype

    def __dlpack_device__(self):
        return (2, 0)


def test_cuda_arrays_without_torch_raise():
    pytest.importorskip("numpy")
    try:
        import torch  # noqa: F401
        pytest.skip("torch is installed")
    except ImportError:
        pass
    b = VllmBatch(10, **PREFILL)
    with pytest.raises(m3sa.UnsupportedError, match="torch is not installed"):
        mv.minimax_m3_index_decode(FakeCudaArray(b.idx_q[:3]), b.index_kv_cache, b.block_table, b.seq_lens,
                                   b.max_seq_len, TOPK, INIT, LOCAL, HEADS, 1, 1)


def vllm_signatures():
    """Parameter names and defaults of vLLM's functions, read from its sources beside the repo."""
    import ast
    import pathlib

    import os

    named = os.environ.get("M3SA_PEER_DIR")
    folder = pathlib.Path(named) if named else pathlib.Path(__file__).resolve().parents[3] / "shared" / "peer"
    peer = folder / "vllm_m3"
    if not peer.is_dir():
        pytest.skip(f"vLLM's op sources are not at {peer}")
    signatures = {}
    for name in ("index_topk.py", "sparse_attn.py"):
        for node in ast.parse((peer / name).read_text()).body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("minimax_m3_"):
                args = node.args.args
                defaults = [None] * (len(args) - len(node.args.defaults)) + [
                    ast.literal_eval(d) for d in node.args.defaults]
                signatures[node.name] = [(a.arg, d) for a, d in zip(args, defaults)]
    return signatures


def test_signatures_are_vllms():
    import inspect

    want = vllm_signatures()
    assert sorted(want) == sorted(name for name in mv.__all__ if name.startswith("minimax_m3_"))
    for name, params in want.items():
        got = inspect.signature(getattr(mv, name)).parameters.values()
        assert [(p.name, None if p.default is p.empty else p.default) for p in got] == params, name
        assert all(p.kind is p.POSITIONAL_OR_KEYWORD for p in got), name


# norm_rope_insert's four RMSNorm weights, and m3sa.vllm's argument names that the plain API spells
# otherwise.
NORM_WEIGHTS = ("q_norm_weight", "k_norm_weight", "idx_q_norm_weight", "idx_k_norm_weight")
PLAIN_NORM_ROPE_NAMES = {"idx_q": "index_q", "idx_k": "index_k", "idx_q_norm_weight": "index_q_norm_weight",
                         "idx_k_norm_weight": "index_k_norm_weight",
                         "idx_slot_mapping": "index_slot_mapping", "idx_q_out": "index_q_out",
                         "index_kv_cache": "index_k_cache"}


def norm_rope_inputs(b, weight):
    """m3sa.vllm.norm_rope_insert's inputs for b's tokens, in its argument order (random bf16
    activations, then weight() for each norm weight)."""
    positions, slots = b.token_slots()  # a padding request's token: position 0, no slot
    t = b.total_q
    return dict(q=random_bf16(b.rng, (t, HEADS * GQA, HEAD_DIM)), k=random_bf16(b.rng, (t, HEADS, HEAD_DIM)),
                v=random_bf16(b.rng, (t, HEADS, HEAD_DIM)), idx_q=random_bf16(b.rng, (t, HEADS, HEAD_DIM)),
                idx_k=random_bf16(b.rng, (t, HEAD_DIM)), positions=positions,
                **{n: weight() for n in NORM_WEIGHTS}, slot_mapping=slots, idx_slot_mapping=slots)


def plain_norm_rope_insert(inputs, caches, **scales):
    """The plain API's norm_rope_insert (CPU backend) on m3sa.vllm's arguments, into `caches`."""
    plan = m3sa.make_plan("norm_rope_insert", "cpu", m3sa.Config(num_index_heads=HEADS),
                          m3sa.Capacities(max_requests=1, max_tokens=len(inputs["positions"]),
                                          max_blocks_per_request=1))
    m3sa.norm_rope_insert(plan, **{PLAIN_NORM_ROPE_NAMES.get(n, n): a for n, a in {**inputs, **caches}.items()},
                          **scales, workspace=m3sa.allocate_workspace(plan))

def test_m3sa_layout_ops_equal_the_plain_api():
    """m3sa.vllm.norm_rope_insert and sparse_attention (m3sa's cache layout) = the plain API."""
    b = VllmBatch(11, **PREFILL)
    t, hq = b.total_q, HEADS * GQA
    inputs = norm_rope_inputs(b, lambda: (1 + 0.1 * b.rng.standard_normal(HEAD_DIM)).astype(np.float32))

    def caches():
        return dict(q_out=np.zeros((t, hq, HEAD_DIM), np.uint16),
                    k_cache=np.zeros((b.num_pages, BLOCK, HEADS, HEAD_DIM), np.uint16),
                    v_cache=np.zeros((b.num_pages, BLOCK, HEADS, HEAD_DIM), np.uint16),
                    idx_q_out=np.zeros((t, HEADS, HEAD_DIM), np.uint16),
                    index_kv_cache=np.zeros((b.num_pages, BLOCK, HEAD_DIM), np.uint16))

    got = caches()
    mv.norm_rope_insert(**inputs, **got)
    want = caches()
    plain_norm_rope_insert(inputs, want)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
        assert np.count_nonzero(got[name]) > 0, name

    topk = b.reference_topk()
    out, lse = np.zeros((t, hq, HEAD_DIM), np.uint16), np.zeros((t, hq), np.float32)
    mv.sparse_attention(got["q_out"], got["k_cache"], got["v_cache"], topk, b.cu_seqlens_q, b.seq_lens,
                        b.block_table, out, lse=lse)
    plan = b.plan("sparse_attention", "bf16", backend="cpu")
    want_out, want_lse = np.zeros_like(out), np.zeros_like(lse)
    m3sa.sparse_attention(plan, got["q_out"], got["k_cache"], got["v_cache"], topk, b.batch(), want_out,
                          lse=want_lse, workspace=m3sa.allocate_workspace(plan))
    np.testing.assert_array_equal(out, want_out)
    np.testing.assert_array_equal(lse, want_lse)


def test_workspace_buffer():
    b = VllmBatch(12, **PREFILL)
    want = prefill_topk(b)[1]
    buffer = np.zeros(1 << 22, np.uint8)
    mv.set_workspace_buffer(buffer)
    try:
        np.testing.assert_array_equal(prefill_topk(b)[1], want)
        plans = list(mv._plans.values())
        assert len(plans) == 2
        for plan, workspace in plans:
            start = workspace.ctypes.data - buffer.ctypes.data
            assert 0 <= start and start + plan.workspace_bytes <= buffer.size and workspace.ctypes.data % 64 == 0
        mv.set_workspace_buffer(buffer[:64])
        with pytest.raises(ValueError, match="workspace buffer: expected at least"):
            prefill_topk(b)
        with pytest.raises(ValueError, match="workspace buffer: expected a 1-D uint8 array"):
            mv.set_workspace_buffer(buffer.view(np.uint16))
    finally:
        mv.set_workspace_buffer(None)


# --- argument checks, metadata, plans and workspaces that scripts/python_mutation_check.py found
# untested (docs/testing.md, "Python mutation check") ---------------------------------------------

def test_sm_scale_is_one_over_sqrt_128_to_within_rounding(attn_call):
    mv.minimax_m3_sparse_attn(**{**attn_call, "sm_scale": float(np.float32(SCALE))})  # fp32's rounding
    _, attention = uniform_decode(20)
    for wrong in (1 / math.sqrt(127), SCALE * 1.001, SCALE * 0.995):  # 0.4 %, 0.1 %, 0.5 % off
        with pytest.raises(ValueError, match=r"sm_scale: expected 1/sqrt\(128\)"):
            mv.minimax_m3_sparse_attn(**{**attn_call, "sm_scale": wrong})
        with pytest.raises(ValueError, match=r"sm_scale: expected 1/sqrt\(128\)"):
            mv.minimax_m3_sparse_attn_decode(**{**attention, "sm_scale": wrong})


def test_num_kv_heads_errors_name_the_rule_broken(attn_call):
    # num_kv_heads agrees with topk_idx but not with the cache
    with pytest.raises(ValueError, match=r"num_kv_heads: expected kv_cache's heads \(2\), got 1"):
        mv.minimax_m3_sparse_attn(**{**attn_call, "num_kv_heads": 1, "topk_idx": attn_call["topk_idx"][:1]})
    q = np.ascontiguousarray(attn_call["q"][:, :7])  # 7 query heads over 2 KV heads
    with pytest.raises(ValueError, match=r"num_kv_heads: expected a divisor of q's heads \(7\), got 2"):
        mv.minimax_m3_sparse_attn(**{**attn_call, "q": q, "output": np.zeros_like(q)})


class FakeDeviceArray(FakeCudaArray):
    """An array on another DLPack device (10: ROCm), which m3sa has no backend for."""

    def __dlpack_device__(self):
        return (10, 0)


def test_arrays_on_other_devices_raise(attn_call):
    with pytest.raises(ValueError, match="q: expected an array on the CPU or a CUDA device, got DLPack "
                                         "device type 10"):
        mv.minimax_m3_sparse_attn(**{**attn_call, "q": FakeDeviceArray(attn_call["q"])})


def test_index_score_checks_seq_lens():
    b = VllmBatch(21, **PREFILL)
    with pytest.raises(ValueError, match=r"seq_lens: expected prefix_lens \+ query lengths"):
        mv.minimax_m3_index_score(b.idx_q, b.index_kv_cache, b.block_table, b.cu_seqlens_q, b.seq_lens + 1,
                                  b.prefix_lens, int(b.q_lens.max()), b.max_seq_len, HEADS)


def test_block_table_as_wide_as_the_models_context():
    """vLLM's block table has a column for each block of the longest context the model serves, far
    more than the score's round_up(cdiv(max_seq_len, 128), 16) columns; the unused ones hold 0."""
    b = VllmBatch(22, **PREFILL)
    want_score, want_topk = prefill_topk(b)
    wide = np.zeros((len(b.seq_lens), 1024), np.int32)  # 128 K tokens
    wide[:, :b.width] = b.block_table
    b.block_table = wide
    score, topk = prefill_topk(b)
    np.testing.assert_array_equal(score, want_score)
    np.testing.assert_array_equal(topk, want_topk)


@pytest.mark.parametrize("init_blocks, local_blocks", [(2, 0), (0, 3)])
def test_init_and_local_blocks_reach_the_selection(init_blocks, local_blocks):
    """The other tests force INIT = LOCAL = 1, where swapping the two changes nothing."""
    b = VllmBatch(23, **PREFILL)
    want = b.reference_topk(init=init_blocks, local=local_blocks)
    assert not np.array_equal(want, b.reference_topk(init=local_blocks, local=init_blocks))
    score = mv.minimax_m3_index_score(b.idx_q, b.index_kv_cache, b.block_table, b.cu_seqlens_q, b.seq_lens,
                                      b.prefix_lens, int(b.q_lens.max()), b.max_seq_len, HEADS)
    np.testing.assert_array_equal(mv.minimax_m3_index_topk(score, b.cu_seqlens_q, b.prefix_lens,
                                                           int(b.q_lens.max()), TOPK, init_blocks,
                                                           local_blocks), want)
    d = uniform_decode_batch(24, 1)
    want = d.reference_topk(init=init_blocks, local=local_blocks, num_decode=len(DECODE_SEQ_LENS))
    assert not np.array_equal(want, d.reference_topk(init=local_blocks, local=init_blocks,
                                                     num_decode=len(DECODE_SEQ_LENS)))
    np.testing.assert_array_equal(mv.minimax_m3_index_decode(
        d.idx_q, d.index_kv_cache, d.block_table, d.seq_lens, d.max_seq_len, TOPK, init_blocks,
        local_blocks, HEADS, 1, 1), want)


def test_index_decode_rejects_decode_query_len_past_its_maximum():
    b = uniform_decode_batch(25, 2)  # the shapes agree with decode_query_len 2
    with pytest.raises(ValueError, match=r"decode_query_len: expected <= max_decode_query_len \(1\), got 2"):
        mv.minimax_m3_index_decode(b.idx_q, b.index_kv_cache, b.block_table, b.seq_lens, b.max_seq_len,
                                   TOPK, INIT, LOCAL, HEADS, 2, 1)


def test_index_decode_errors_name_vllms_arguments():
    """The one-call path hands what m3sa rejects to the general path, which names idx_q as vLLM does
    (m3sa's own message calls it index_q)."""
    b = uniform_decode_batch(26, 1)
    with pytest.raises(ValueError, match=r"m3sa.vllm: idx_q: expected \[tokens, heads, 128\]"):
        mv.minimax_m3_index_decode(np.ascontiguousarray(b.idx_q[..., :64]), b.index_kv_cache, b.block_table,
                                   b.seq_lens, b.max_seq_len, TOPK, INIT, LOCAL, HEADS, 1, 1)


def test_general_decode_path_serves_mtp_as_the_one_call_path(monkeypatch):
    """decode_query_len 2 (MTP) through the general path, which runs where the one-call path
    declines (the one-call tests above use decode_query_len 1)."""
    n = len(DECODE_SEQ_LENS)
    b = uniform_decode_batch(27, 2)
    index = (b.idx_q, b.index_kv_cache, b.block_table, b.seq_lens, b.max_seq_len, TOPK, INIT, LOCAL, HEADS,
             2, 2)
    topk = mv.minimax_m3_index_decode(*index)
    np.testing.assert_array_equal(topk, b.reference_topk(num_decode=n, decode_q_len=2))
    kv = b.kv_cache("bf16")
    q = random_bf16(b.rng, (b.total_q, HEADS * GQA, HEAD_DIM))
    attention = (q, kv, topk, b.block_table, b.seq_lens, HEADS, SCALE)
    out = np.full_like(q, 0x7FC0)
    mv.minimax_m3_sparse_attn_decode(*attention, out, 2)
    monkeypatch.setattr(mv, "_index_decode_in_one_call", lambda *args: None)
    monkeypatch.setattr(mv, "_attention_decode_in_one_call", lambda *args: False)
    np.testing.assert_array_equal(mv.minimax_m3_index_decode(*index), topk)
    general = np.full_like(q, 0x7FC0)
    mv.minimax_m3_sparse_attn_decode(*attention, general, 2)
    np.testing.assert_array_equal(general, out)
    want = b.reference_attention(q, kv, topk, "bf16", 1.0, 1.0, num_decode=n, decode_q_len=2)
    assert attention_close(out, want) <= BOUNDS["attention_relative_l2"]


def test_decode_cu_q_lens_are_cached_per_decode_query_len():
    """The cached cu_q_lens (what a captured CUDA graph keeps reading) of 4 requests of 1, then of 2
    rows: the cache is not cleared between the calls, as in an engine switching to MTP."""
    for seed, decode_query_len in ((28, 1), (29, 2), (30, 1)):
        b = uniform_decode_batch(seed, decode_query_len)
        topk = mv.minimax_m3_index_decode(b.idx_q, b.index_kv_cache, b.block_table, b.seq_lens, b.max_seq_len,
                                          TOPK, INIT, LOCAL, HEADS, decode_query_len, 2)
        np.testing.assert_array_equal(topk, b.reference_topk(num_decode=len(DECODE_SEQ_LENS),
                                                             decode_q_len=decode_query_len))


def test_ragged_decode_checks_its_metadata():
    b = VllmBatch(31, (1, 3, 2), (500, 260, 129))
    _, topk = prefill_topk(b)
    q = random_bf16(b.rng, (b.total_q, HEADS * GQA, HEAD_DIM))
    call = (q, b.kv_cache("bf16"), topk, b.block_table, b.seq_lens, HEADS, SCALE, np.zeros_like(q), 1)
    owners = np.array([0, 1, 1, 1, 2, 2], np.int32)
    mv.minimax_m3_sparse_attn_decode(*call, query_start_loc=b.cu_seqlens_q, token_to_req_indices=owners)
    with pytest.raises(ValueError, match=r"token_to_req_indices: expected the request of each token as "
                                         r"query_start_loc says, got \[0, 0, 1, 1, 2, 2\]"):
        mv.minimax_m3_sparse_attn_decode(*call, query_start_loc=b.cu_seqlens_q,
                                         token_to_req_indices=np.array([0, 0, 1, 1, 2, 2], np.int32))
    with pytest.raises(ValueError,
                       match=r"query_start_loc: expected \[num_reqs \+ 1 = 4\], got shape \(5,\)"):
        mv.minimax_m3_sparse_attn_decode(*call, query_start_loc=np.append(b.cu_seqlens_q, b.total_q),
                                         token_to_req_indices=owners)
    with pytest.raises(ValueError, match="token_to_req_indices: expected an array with query_start_loc"):
        mv.minimax_m3_sparse_attn_decode(*call, query_start_loc=b.cu_seqlens_q)


def test_plan_cache_keys_hold_the_host_backend_the_smallest_capacities_and_the_dtype():
    b = VllmBatch(32, **PREFILL)  # 3 requests, 43 tokens, block table of 8 columns, score of 16
    _, topk = prefill_topk(b)
    caps = {key[0]: key[4] for key in mv.plan_cache()}
    assert caps == {"score_blocks": (4, 64, 8), "select_topk_blocks": (4, 64, 16)}
    assert {key[1] for key in mv.plan_cache()} == {"cpu"}  # host_backend's default: the fast one
    # bf16, then fp8 attention on the same shapes, without clearing: one plan each
    q = random_bf16(b.rng, (b.total_q, HEADS * GQA, HEAD_DIM))
    for kv_dtype in ("bf16", "fp8_e4m3", "bf16"):
        kv = b.kv_cache(kv_dtype)
        out = np.zeros_like(q)
        mv.minimax_m3_sparse_attn(q, kv, topk, b.block_table, b.cu_seqlens_q, b.seq_lens, b.prefix_lens,
                                  int(b.q_lens.max()), HEADS, SCALE, out, 1.0, 1.0)
        want = b.reference_attention(q, kv, topk, kv_dtype, 1.0, 1.0)
        assert attention_close(out, want) <= BOUNDS["attention_relative_l2"], kv_dtype
    assert sorted(key[5] for key in mv.plan_cache() if key[0] == "sparse_attention") == ["bf16", "fp8_e4m3"]


def test_workspace_buffer_slices_are_aligned_disjoint_and_rewound():
    b = VllmBatch(33, **PREFILL)
    want = prefill_topk(b)[1]
    mv.clear_caches()
    raw = np.zeros((1 << 22) + 64, np.uint8)
    buffer = raw[(1 - raw.ctypes.data) % 64:][:1 << 22]  # starts one byte past a 64-byte line
    mv.set_workspace_buffer(buffer)
    try:
        np.testing.assert_array_equal(prefill_topk(b)[1], want)
        spans = sorted((workspace.ctypes.data, workspace.ctypes.data + plan.workspace_bytes)
                       for plan, workspace in mv._plans.values())
        assert len(spans) == 2 and all(end > start for start, end in spans)
        assert all(start % 64 == 0 for start, _ in spans)
        assert spans[0][1] <= spans[1][0]  # disjoint
        used = spans[1][1] - buffer.ctypes.data
        # clear_caches rewinds: a buffer of exactly what the plans used serves them again after it
        mv.set_workspace_buffer(buffer[:used])
        np.testing.assert_array_equal(prefill_topk(b)[1], want)
        mv.clear_caches()
        np.testing.assert_array_equal(prefill_topk(b)[1], want)
    finally:
        mv.set_workspace_buffer(None)


def test_m3sa_layout_ops_pass_scales_and_decode_requests():
    """norm_rope_insert and sparse_attention with k_scale != v_scale, and sparse_attention over
    decode requests first, one of them vLLM's CUDA-graph padding (seq_len 0), against the plain
    API."""
    b = VllmBatch(34, (1, 1, 1, 37, 5), (700, 129, 0, 300, 40))
    t, hq = b.total_q, HEADS * GQA
    inputs = norm_rope_inputs(b, lambda: np.ones(HEAD_DIM, np.float32))
    caches = dict(q_out=np.zeros((t, hq, HEAD_DIM), np.uint16),
                  k_cache=random_bf16(b.rng, (b.num_pages, BLOCK, HEADS, HEAD_DIM)),
                  v_cache=random_bf16(b.rng, (b.num_pages, BLOCK, HEADS, HEAD_DIM)),
                  idx_q_out=np.zeros((t, HEADS, HEAD_DIM), np.uint16),
                  index_kv_cache=np.zeros((b.num_pages, BLOCK, HEAD_DIM), np.uint16))
    want = {name: array.copy() for name, array in caches.items()}
    mv.norm_rope_insert(**inputs, **caches, k_scale=0.5, v_scale=2.0)
    plain_norm_rope_insert(inputs, want, k_scale=0.5, v_scale=2.0)
    for name in want:
        np.testing.assert_array_equal(caches[name], want[name], err_msg=name)

    num_decode = 3
    topk = b.reference_topk(num_decode=num_decode)
    out, lse = np.zeros((t, hq, HEAD_DIM), np.uint16), np.zeros((t, hq), np.float32)
    mv.sparse_attention(caches["q_out"], caches["k_cache"], caches["v_cache"], topk, b.cu_seqlens_q,
                        b.seq_lens, b.block_table, out, num_decode_requests=num_decode, lse=lse,
                        k_scale=0.5, v_scale=2.0)
    plan = b.plan("sparse_attention", "bf16", backend="cpu")
    want_out, want_lse = np.zeros_like(out), np.zeros_like(lse)
    m3sa.sparse_attention(plan, caches["q_out"], caches["k_cache"], caches["v_cache"], topk,
                          b.batch(num_decode=num_decode), want_out, lse=want_lse, k_scale=0.5, v_scale=2.0,
                          workspace=m3sa.allocate_workspace(plan))
    np.testing.assert_array_equal(out, want_out)
    np.testing.assert_array_equal(lse, want_lse)
    assert (out[2] == 0).all() and np.count_nonzero(out) > 0  # the padding request's row: zeros
    # The decode requests reach m3sa: on the CPU they compute what prefill requests of the same
    # q_len would, so only m3sa's check that each has decode_query_len rows tells (on CUDA, the
    # decode kernels run them).
    with pytest.raises(ValueError, match=r"q_len == decode_q_len \(2\) for every decode request"):
        mv.sparse_attention(caches["q_out"], caches["k_cache"], caches["v_cache"], topk, b.cu_seqlens_q,
                            b.seq_lens, b.block_table, out, num_decode_requests=num_decode,
                            decode_query_len=2)
