"""m3sa on a CUDA device through torch (issue 14's GPU tests; bench/python_gpu_check.sh runs them on
the GPU machine). Each skips, with its reason, where torch is not installed, torch sees no CUDA
device, or m3sa was built without its CUDA backend; the comparison with vLLM's Triton ops skips
where they cannot be imported (M3SA_PEER_DIR names the peer folder; when it is set, a failed import
fails the test instead).

- every torch.ops.m3sa op through torch.library.opcheck on CUDA tensors;
- CUDA graph capture and replay with the inputs rewritten in place, against eager runs;
- torch.compile(fullgraph=True) over a decode layer (norm_rope_insert -> index_decode ->
  sparse_attn_decode), against eager;
- m3sa.vllm on CUDA against m3sa.vllm on the CPU backend (same data), and against vLLM's Triton
  functions: selections identical up to near-ties (bf16 index caches: src/testing/compare.h's
  kNearTieRelative; fp8: 2e-3 of the row's largest score, since Hopper's fp8 MMA accumulates with
  fewer bits on both sides: see NEAR_TIE), attention within kGpuAttentionRelativeL2 (1e-3)
  relative L2 and 1e-2 max abs (the issue's bound), lse within kGpuAttentionLse (1e-4);
- DLPack: the raw API on torch CUDA tensors and cupy arrays, on a non-default stream;
- bad arguments (a CPU tensor for a CUDA plan, wrong dtypes, bad page ids on the device): errors.

Where M3SA_GPU_REPORT names a file, each comparison appends one JSON line of its measurements.
"""
import importlib.util
import json
import math
import os
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import BLOCK, HEAD_DIM

import m3sa
import m3sa.vllm as mv

BOUNDS = m3sa._core.testing_bounds()
SCALE = 1 / math.sqrt(HEAD_DIM)
HEADS, GQA, TOPK, INIT, LOCAL = 4, 16, 16, 1, 1  # M3 at TP1: 4 index / KV heads, 64 query heads
# Near-ties between m3sa's and vLLM's selections, relative to max(|row scores|, 1). fp8 caches run on
# Hopper's fp8 tensor cores in both, whose accumulation is not full fp32: each side's scores may
# be off the exact ones by up to ~1e-3 of the row's scale (the peer's own near-tie measure, and
# m3sa's C++ bound for its fp8 wgmma scorer), so two sides may exchange blocks twice that close.
FP8_TENSOR_CORE = 1e-3
NEAR_TIE = {"bf16": BOUNDS["near_tie_relative"], "fp8_e4m3": 2 * FP8_TENSOR_CORE}
ATTENTION_MAX_ABS = 1e-2  # issue 14's bound against vLLM
GPU_ATTENTION_L2 = BOUNDS["gpu_attention_relative_l2"]  # 1e-3, src/testing/compare.h
GPU_LSE = BOUNDS["gpu_attention_lse"]  # 1e-4
# m3sa's fp32 block scores against float64, relative to max(|row scores|, 1)
SCORE_RELATIVE = {"bf16": 1e-4, "fp8_e4m3": FP8_TENSOR_CORE}


def _skip_reason():
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed"
    import torch

    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    if not m3sa.cuda_backend_built():
        return "m3sa was built without the CUDA backend (M3SA_ENABLE_CUDA=ON pip install .)"
    return None


SKIP_REASON = _skip_reason()
pytestmark = pytest.mark.skipif(SKIP_REASON is not None, reason=SKIP_REASON or "")


@pytest.fixture
def torch():
    import torch

    return torch


@pytest.fixture(autouse=True)
def fresh_caches():
    mv.clear_caches()
    mv.set_workspace_buffer(None)
    yield
    if SKIP_REASON is None:
        assert mv.device_errors() == {}, "a CUDA plan's device error flag was set"
    mv.set_workspace_buffer(None)
    mv.clear_caches()


def record(name, **metrics):
    path = os.environ.get("M3SA_GPU_REPORT")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"test": name, **metrics},
                               default=lambda o: o.item() if hasattr(o, "item") else str(o)) + "\n")


# --- data ----------------------------------------------------------------------------------------

class Batch:
    """A vLLM batch on the GPU: requests (q_len, seq_len), each block on its own shuffled page,
    random normal data (bf16, or e4m3 rounded from it), torch tensors in vLLM's layouts."""

    def __init__(self, torch, seed, q_lens, seq_lens, index_dtype="bf16", kv_dtype="bf16",
                 heads=HEADS, gqa=GQA, decode=False, integer_data=False):
        self.torch = torch
        g = self.gen = torch.Generator(device="cuda").manual_seed(seed)
        dev = "cuda"
        blocks = [-(-s // BLOCK) for s in seq_lens]
        self.width = max(blocks) + 2
        self.num_pages = sum(blocks) + 3
        pages = torch.randperm(self.num_pages, generator=g, device=dev).to(torch.int32)
        self.block_table = torch.zeros((len(seq_lens), self.width), dtype=torch.int32, device=dev)
        used = 0
        for r, n in enumerate(blocks):
            self.block_table[r, :n] = pages[used:used + n]
            used += n
        self.q_lens = torch.tensor(q_lens, dtype=torch.int32, device=dev)
        self.seq_lens = torch.tensor(seq_lens, dtype=torch.int32, device=dev)
        self.cu_seqlens_q = torch.zeros(len(q_lens) + 1, dtype=torch.int32, device=dev)
        self.cu_seqlens_q[1:] = torch.cumsum(self.q_lens, 0)
        self.prefix_lens = self.seq_lens - self.q_lens
        self.total_q = int(sum(q_lens))
        self.max_query_len = int(max(q_lens))
        self.max_seq_len = int(max(seq_lens))
        self.positions = torch.cat([torch.arange(s - q, s, device=dev) for q, s in zip(q_lens, seq_lens)])
        self.request_of_token = torch.repeat_interleave(
            torch.arange(len(q_lens), device=dev), torch.tensor(q_lens, device=dev))
        self.heads, self.q_heads = heads, heads * gqa
        self.index_dtype, self.kv_dtype = index_dtype, kv_dtype
        self.integer_data = integer_data
        self.idx_q = self.random((self.total_q, heads, HEAD_DIM), index_dtype)
        self.index_kv_cache = self.random((self.num_pages, BLOCK, HEAD_DIM), index_dtype)
        self.kv_cache = self.random((self.num_pages, heads, BLOCK, 2 * HEAD_DIM), kv_dtype)
        self.q = self.random((self.total_q, self.q_heads, HEAD_DIM), "bf16")
        self.scales = (torch.tensor([0.5], device=dev), torch.tensor([0.25], device=dev))

    def torch_dtype(self, name):
        return self.torch.bfloat16 if name == "bf16" else self.torch.float8_e4m3fn

    def random(self, shape, dtype):
        torch = self.torch
        if self.integer_data:  # exact scores in any summation order: selections must be identical
            x = torch.randint(-3, 4, shape, generator=self.gen, device="cuda").to(torch.bfloat16)
        else:
            x = torch.randn(shape, generator=self.gen, device="cuda", dtype=torch.bfloat16)
        return x.to(self.torch_dtype(dtype))

    def cpu(self, x):
        return x.cpu() if hasattr(x, "cpu") else x

    def index_args(self):
        return (self.idx_q, self.index_kv_cache, self.block_table, self.cu_seqlens_q, self.seq_lens,
                self.prefix_lens, self.max_query_len, self.max_seq_len, self.heads)

    def kv_scales(self):
        return self.scales if self.kv_dtype == "fp8_e4m3" else (None, None)

    def reference_scores(self):
        """[H, T, N] float64 block scores max_{j in block, j <= pos} q.k (-inf past the causal
        blocks), from the data as stored, for the near-tie check."""
        torch = self.torch
        n = -(-self.max_seq_len // BLOCK)
        out = torch.full((self.heads, self.total_q, n), float("-inf"), dtype=torch.float64, device="cuda")
        cache = self.index_kv_cache.to(torch.float64)
        for t, (r, pos) in enumerate(zip(self.request_of_token.tolist(), self.positions.tolist())):
            nb = pos // BLOCK + 1
            keys = cache[self.block_table[r, :nb].long()].reshape(nb * BLOCK, HEAD_DIM)
            s = self.idx_q[t].to(torch.float64) @ keys.T  # [H, nb * 128]
            s[:, pos + 1:] = float("-inf")
            out[:, t, :nb] = s.view(self.heads, nb, BLOCK).amax(-1)
        return out


def selection_check(got, want, scores, rel_tol):
    """Rows of got and want ([H, T, K], any order, -1 padded) as sets: identical, or differing only by
    exchanges of blocks whose reference scores are within rel_tol of max(|row scores|, 1)."""
    got, want = np.sort(got.cpu().numpy(), -1), np.sort(want.cpu().numpy(), -1)
    scores = scores.cpu().numpy()
    differing = np.argwhere((got != want).any(-1))
    near, bad, worst = 0, [], 0.0
    for h, t in differing:
        a, b = set(got[h, t][got[h, t] >= 0]), set(want[h, t][want[h, t] >= 0])
        row = scores[h, t]
        finite = row[np.isfinite(row)]
        scale = max(float(np.abs(finite).max()) if finite.size else 1.0, 1.0)
        only_a, only_b = sorted(a - b), sorted(b - a)
        if len(a) != len(b) or any(x >= row.size or y >= row.size for x, y in zip(only_a, only_b)):
            bad.append((int(h), int(t), sorted(a), sorted(b)))
            continue
        gap = float(np.max(np.abs(np.sort(row[only_a]) - np.sort(row[only_b])))) / scale
        worst = max(worst, gap)
        if gap <= rel_tol:
            near += 1
        else:
            bad.append((int(h), int(t), sorted(a), sorted(b), gap))
    return {"rows": int(got.shape[0] * got.shape[1]), "differing_rows": int(len(differing)),
            "near_tie_rows": near, "mismatched_rows": len(bad), "largest_near_tie_gap": worst,
            "first_mismatches": bad[:3]}


def attention_errors(got, want):
    got, want = got.double(), want.double()
    return {"relative_l2": float((got - want).norm() / want.norm()),
            "max_abs": float((got - want).abs().max())}


def vllm_batch(torch, decode=False, **kw):
    if decode:
        return Batch(torch, 11, (1,) * 6, (4000, 129, 700, 6000, 1, 2300), **kw)
    return Batch(torch, 12, (300, 77, 1), (4000, 2100, 5000), **kw)


# --- the registry and the raw API ----------------------------------------------------------------

def test_cuda_backend_serves_every_op():
    assert m3sa.cuda_device_count() >= 1
    ops = ["insert_index_k", "score_blocks", "select_topk_blocks", "index_topk", "sparse_attention",
           "norm_rope_insert"]
    for op in ops:
        assert m3sa.supports("cuda", op), op
    caps = m3sa.Capacities(max_requests=4, max_tokens=64, max_blocks_per_request=64)
    for op in ops:
        plan = m3sa.make_plan(op, "cuda", m3sa.Config(), caps)
        assert plan.implementation.startswith(f"cuda.{op}"), plan.implementation
    record("registry", implementations=[i.name for i in m3sa.implementations() if i.backend == "cuda"])


def raw_index_topk_inputs(torch, b):
    config = m3sa.Config(top_k=TOPK, init_blocks=INIT, local_blocks=LOCAL, num_index_heads=b.heads)
    caps = m3sa.Capacities(max_requests=len(b.seq_lens), max_tokens=b.total_q,
                           max_blocks_per_request=b.width)
    batch_arrays = (b.cu_seqlens_q, b.seq_lens, b.block_table)
    return config, caps, batch_arrays


def host_index_topk(b, config, caps):
    plan = m3sa.make_plan("index_topk", "cpu", config, caps, b.index_dtype)
    bits = np.uint16 if b.index_dtype == "bf16" else np.uint8
    as_bits = lambda x: x.cpu().view(b.torch.int16 if bits is np.uint16 else b.torch.uint8).numpy().view(bits)
    topk = np.full((b.heads, b.total_q, TOPK), -7, np.int32)
    m3sa.index_topk(plan, as_bits(b.idx_q), as_bits(b.index_kv_cache),
                    m3sa.Batch(b.cu_seqlens_q.cpu().numpy(), b.seq_lens.cpu().numpy(),
                               b.block_table.cpu().numpy(), num_tokens=b.total_q),
                    topk, workspace=m3sa.allocate_workspace(plan))
    return topk


def test_dlpack_torch_tensors_on_a_side_stream(torch):
    b = Batch(torch, 1, (37, 5, 1), (3000, 400, 1300), integer_data=True)
    config, caps, (cu, seq, table) = raw_index_topk_inputs(torch, b)
    plan = m3sa.make_plan("index_topk", "cuda", config, caps, "bf16")
    stream = torch.cuda.Stream()
    torch.cuda.current_stream().synchronize()  # the inputs were written on the default stream
    with torch.cuda.stream(stream):
        workspace = torch.empty(plan.workspace_bytes, dtype=torch.uint8, device="cuda")
        m3sa.prepare_workspace(plan, workspace, stream=stream.cuda_stream)
        topk = torch.full((b.heads, b.total_q, TOPK), -7, dtype=torch.int32, device="cuda")
        m3sa.index_topk(plan, b.idx_q, b.index_kv_cache,
                        m3sa.Batch(cu, seq, table, num_tokens=b.total_q), topk,
                        workspace=workspace, stream=stream.cuda_stream)
    stream.synchronize()
    np.testing.assert_array_equal(topk.cpu().numpy(), host_index_topk(b, config, caps))
    assert m3sa.read_device_errors(plan, workspace, stream=stream.cuda_stream) == 0


def test_dlpack_attention_with_strided_caches_and_lse(torch):
    """The raw sparse_attention on strided K/V views of vLLM's combined cache, out and lse against
    the CPU backend on the same data (kGpuAttentionRelativeL2, kGpuAttentionLse)."""
    b = Batch(torch, 2, (37, 5, 1), (3000, 400, 1300), integer_data=True)
    config, caps, (cu, seq, table) = raw_index_topk_inputs(torch, b)
    topk = torch.from_numpy(host_index_topk(b, config, caps)).cuda()
    k_view = b.kv_cache[..., :HEAD_DIM].permute(0, 2, 1, 3)
    v_view = b.kv_cache[..., HEAD_DIM:].permute(0, 2, 1, 3)
    q = torch.randn((b.total_q, b.q_heads, HEAD_DIM), generator=b.gen, device="cuda").to(torch.bfloat16)

    def run(backend, device):
        plan = m3sa.make_plan("sparse_attention", backend, config, caps, "bf16")
        out = torch.zeros_like(q, device=device)
        lse = torch.zeros((b.total_q, b.q_heads), dtype=torch.float32, device=device)
        workspace = torch.empty(plan.workspace_bytes + 64, dtype=torch.uint8, device=device)
        workspace = workspace[-workspace.data_ptr() % 64:][:plan.workspace_bytes]
        m3sa.prepare_workspace(plan, workspace, stream=torch.cuda.current_stream().cuda_stream
                               if device == "cuda" else 0)
        to = (lambda x: x.to(device))
        m3sa.sparse_attention(plan, to(q), to(k_view), to(v_view), to(topk),
                              m3sa.Batch(to(cu), to(seq), to(table), num_tokens=b.total_q),
                              out, lse=lse, workspace=workspace,
                              stream=torch.cuda.current_stream().cuda_stream if device == "cuda" else 0)
        return out, lse

    out, lse = run("cuda", "cuda")
    want_out, want_lse = run("cpu", "cpu")
    errors = attention_errors(out.cpu(), want_out)
    lse_error = float((lse.cpu() - want_lse).abs().max())
    record("raw_attention_vs_cpu", **errors, lse_max_abs=lse_error)
    assert errors["relative_l2"] <= GPU_ATTENTION_L2 and lse_error <= GPU_LSE, (errors, lse_error)


def test_dlpack_cupy_arrays_on_a_non_default_stream(torch):
    cupy = pytest.importorskip("cupy", reason="cupy is not installed")
    b = Batch(torch, 3, (37, 5, 1), (3000, 400, 1300), integer_data=True)
    config, caps, _ = raw_index_topk_inputs(torch, b)
    want = host_index_topk(b, config, caps)
    torch.cuda.synchronize()
    bits = lambda x: cupy.asarray(x.view(torch.int16).cpu().numpy().view(np.uint16))  # bf16 bits
    plan = m3sa.make_plan("index_topk", "cuda", config, caps, "bf16")
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        idx_q, cache = bits(b.idx_q), bits(b.index_kv_cache)
        cu, seq, table = (cupy.asarray(x.cpu().numpy()) for x in (b.cu_seqlens_q, b.seq_lens, b.block_table))
        workspace = cupy.empty(plan.workspace_bytes, dtype=cupy.uint8)
        topk = cupy.full((b.heads, b.total_q, TOPK), -7, dtype=cupy.int32)
        m3sa.prepare_workspace(plan, workspace, stream=stream.ptr)
        m3sa.index_topk(plan, idx_q, cache, m3sa.Batch(cu, seq, table, num_tokens=b.total_q), topk,
                        workspace=workspace, stream=stream.ptr)
    stream.synchronize()
    np.testing.assert_array_equal(cupy.asnumpy(topk), want)


# --- bad arguments ---------------------------------------------------------------------------------

def test_bad_arguments_raise_clear_errors(torch):
    b = Batch(torch, 4, (1, 1), (700, 300))
    config, caps, (cu, seq, table) = raw_index_topk_inputs(torch, b)
    plan = m3sa.make_plan("index_topk", "cuda", config, caps, "bf16")
    workspace = torch.empty(plan.workspace_bytes, dtype=torch.uint8, device="cuda")
    m3sa.prepare_workspace(plan, workspace, stream=torch.cuda.current_stream().cuda_stream)
    topk = torch.zeros((b.heads, b.total_q, TOPK), dtype=torch.int32, device="cuda")
    call = dict(plan=plan, index_q=b.idx_q, index_k_cache=b.index_kv_cache,
                batch=m3sa.Batch(cu, seq, table, num_tokens=b.total_q), topk=topk,
                workspace=workspace, stream=torch.cuda.current_stream().cuda_stream)
    m3sa.index_topk(**call)  # valid as given
    with pytest.raises(ValueError, match="index_q"):  # a CPU tensor for a CUDA plan
        m3sa.index_topk(**{**call, "index_q": b.idx_q.cpu()})
    with pytest.raises(ValueError, match="workspace: expected memory on the CUDA device"):
        m3sa.index_topk(**{**call, "workspace": workspace.cpu()})
    with pytest.raises(TypeError, match="index_q: dtype .* no m3sa equivalent"):
        m3sa.index_topk(**{**call, "index_q": b.idx_q.to(torch.float16)})
    with pytest.raises(ValueError, match="index_q"):
        m3sa.index_topk(**{**call, "index_q": b.idx_q.float()})
    with pytest.raises(ValueError, match="topk"):
        m3sa.index_topk(**{**call, "topk": topk.long()})
    # m3sa.vllm: arrays on two devices, and the device-side validation of data it cannot read
    with pytest.raises(ValueError, match="index_k_cache"):
        mv.minimax_m3_index_decode(b.idx_q, b.index_kv_cache.cpu(), b.block_table, b.seq_lens,
                                   b.max_seq_len, TOPK, INIT, LOCAL, b.heads, 1, 1)
    with pytest.raises(ValueError, match="sm_scale"):
        mv.minimax_m3_sparse_attn_decode(b.q, b.kv_cache, topk, b.block_table, b.seq_lens, b.heads,
                                         0.1, torch.empty_like(b.q), 1)
    bad_table = b.block_table.clone()
    bad_table[0, 0] = 1 << 20  # a page past the cache: the kernel skips it and flags bit 1
    mv.minimax_m3_index_decode(b.idx_q, b.index_kv_cache, bad_table, b.seq_lens, b.max_seq_len, TOPK,
                               INIT, LOCAL, b.heads, 1, 1)
    errors = mv.device_errors()
    assert len(errors) == 1 and list(errors.values())[0] & 1, errors
    assert mv.device_errors() == {}  # reading clears them


# --- m3sa.vllm on CUDA vs the CPU backend ----------------------------------------------------------

def run_vllm_ops(b, decode, on_cpu=False, ops=None):
    """The five functions on b (index -> topk -> attention), on the GPU or on CPU copies."""
    to = (lambda x: x.cpu() if hasattr(x, "cpu") and on_cpu else x)
    ops = ops or mv
    k_scale, v_scale = (to(s) if s is not None else None for s in b.kv_scales())
    out = to(b.torch.zeros_like(b.q))
    if decode:
        topk = ops.minimax_m3_index_decode(to(b.idx_q), to(b.index_kv_cache), to(b.block_table),
                                           to(b.seq_lens), b.max_seq_len, TOPK, INIT, LOCAL, b.heads, 1, 1)
        ops.minimax_m3_sparse_attn_decode(to(b.q), to(b.kv_cache), topk, to(b.block_table),
                                          to(b.seq_lens), b.heads, SCALE, out, 1, k_scale, v_scale)
        return None, topk, out
    score = ops.minimax_m3_index_score(*(to(x) for x in b.index_args()))
    topk = ops.minimax_m3_index_topk(score, to(b.cu_seqlens_q), to(b.prefix_lens), b.max_query_len,
                                     TOPK, INIT, LOCAL)
    ops.minimax_m3_sparse_attn(to(b.q), to(b.kv_cache), topk, to(b.block_table), to(b.cu_seqlens_q),
                               to(b.seq_lens), to(b.prefix_lens), b.max_query_len, b.heads, SCALE,
                               out, k_scale, v_scale)
    return score, topk, out


@pytest.mark.parametrize("decode", [False, True], ids=["prefill", "decode"])
@pytest.mark.parametrize("index_dtype, kv_dtype", [("bf16", "bf16"), ("fp8_e4m3", "fp8_e4m3")])
def test_vllm_ops_on_cuda_match_the_cpu_backend(torch, decode, index_dtype, kv_dtype):
    b = vllm_batch(torch, decode, index_dtype=index_dtype, kv_dtype=kv_dtype, integer_data=True)
    score, topk, out = run_vllm_ops(b, decode)
    assert topk.is_cuda and out.is_cuda
    cpu_score, cpu_topk, cpu_out = run_vllm_ops(b, decode, on_cpu=True)
    if score is not None:  # integer data: exact in fp32 whatever the order
        torch.testing.assert_close(score.cpu(), cpu_score, rtol=0, atol=0)
    np.testing.assert_array_equal(topk.cpu().numpy(), cpu_topk.numpy())
    # the same selections into both attentions
    cpu_out = torch.zeros_like(cpu_out)
    k_scale, v_scale = (s.cpu() if s is not None else None for s in b.kv_scales())
    if decode:
        mv.minimax_m3_sparse_attn_decode(b.q.cpu(), b.kv_cache.cpu(), topk.cpu(), b.block_table.cpu(),
                                         b.seq_lens.cpu(), b.heads, SCALE, cpu_out, 1, k_scale, v_scale)
    else:
        mv.minimax_m3_sparse_attn(b.q.cpu(), b.kv_cache.cpu(), topk.cpu(), b.block_table.cpu(),
                                  b.cu_seqlens_q.cpu(), b.seq_lens.cpu(), b.prefix_lens.cpu(),
                                  b.max_query_len, b.heads, SCALE, cpu_out, k_scale, v_scale)
    errors = attention_errors(out.cpu(), cpu_out)
    record("vllm_cuda_vs_cpu", decode=decode, index_dtype=index_dtype, kv_dtype=kv_dtype, **errors)
    assert errors["relative_l2"] <= GPU_ATTENTION_L2, errors


def test_workspace_buffer_is_the_callers(torch):
    b = vllm_batch(torch, decode=True)
    want = run_vllm_ops(b, True)[1:]
    buffer = torch.zeros(64 << 20, dtype=torch.uint8, device="cuda")
    mv.set_workspace_buffer(buffer)
    got = run_vllm_ops(b, True)[1:]
    assert len(mv.plan_cache()) == 2
    for plan, workspace in mv._plans.values():
        start = workspace.data_ptr() - buffer.data_ptr()
        assert 0 <= start and start + plan.workspace_bytes <= buffer.numel() and start % 64 == 0
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)
    torch.testing.assert_close(got[1], want[1], rtol=0, atol=0)
    mv.set_workspace_buffer(buffer[:64])
    with pytest.raises(ValueError, match="workspace buffer: expected at least"):
        run_vllm_ops(b, True)


# --- vLLM's Triton ops on the same inputs ----------------------------------------------------------

def peer_ops():
    """vLLM's index_topk and sparse_attn modules from the peer folder (README: ../shared/peer)."""
    named = os.environ.get("M3SA_PEER_DIR")
    folder = Path(named) if named else Path(__file__).resolve().parents[3] / "shared" / "peer"
    if not (folder / "vllm_shim").is_dir():
        if named:
            pytest.fail(f"M3SA_PEER_DIR={named} has no vllm_shim/")
        pytest.skip(f"vLLM's ops are not at {folder} (set M3SA_PEER_DIR)")
    sys.path.insert(0, str(folder / "vllm_shim"))
    try:
        from vllm.models.minimax_m3.common.ops import index_topk, sparse_attn
    except Exception as exc:  # noqa: BLE001 (triton missing, an API change: say which)
        if named:
            pytest.fail(f"vLLM's ops from {folder} do not import: {type(exc).__name__}: {exc}")
        pytest.skip(f"vLLM's ops do not import: {type(exc).__name__}: {exc}")
    return index_topk, sparse_attn


class PeerOps:
    def __init__(self, index_topk, sparse_attn):
        for module in (index_topk, sparse_attn):
            for name in mv.__all__:
                if name.startswith("minimax_m3_") and hasattr(module, name):
                    setattr(self, name, getattr(module, name))


@pytest.mark.parametrize("decode", [False, True], ids=["prefill", "decode"])
@pytest.mark.parametrize("index_dtype", ["bf16", "fp8_e4m3"])
def test_vllm_ops_match_vllms_triton_ops(torch, decode, index_dtype):
    peer = PeerOps(*peer_ops())
    kv_dtype = index_dtype
    b = vllm_batch(torch, decode, index_dtype=index_dtype, kv_dtype=kv_dtype)
    score, topk, out = run_vllm_ops(b, decode)
    peer_score, peer_topk, _ = run_vllm_ops(b, decode, ops=peer)
    reference = b.reference_scores()
    metrics = {}
    if score is not None:  # vLLM leaves the columns past a token's causal blocks unwritten
        n = reference.shape[-1]
        causal = torch.isfinite(reference)
        for name, s in (("m3sa", score), ("vllm", peer_score)):
            err = (s[..., :n].double() - reference).abs()[causal]
            metrics[f"{name}_score_max_abs_error"] = float(err.max())
        assert metrics["m3sa_score_max_abs_error"] <= SCORE_RELATIVE[index_dtype] * max(
            1.0, float(reference[causal].abs().max())), metrics
    selections = selection_check(topk, peer_topk, reference, NEAR_TIE[index_dtype])
    exact = selection_check(topk, peer_topk, reference, 0.0)
    metrics.update(selections=selections)
    # the same (m3sa's, ascending) selections into both attentions: vLLM reads them as a set
    peer_out = torch.zeros_like(b.q)
    k_scale, v_scale = b.kv_scales()
    if decode:
        peer.minimax_m3_sparse_attn_decode(b.q, b.kv_cache, topk, b.block_table, b.seq_lens, b.heads,
                                           SCALE, peer_out, 1, k_scale, v_scale)
    else:
        peer.minimax_m3_sparse_attn(b.q, b.kv_cache, topk, b.block_table, b.cu_seqlens_q, b.seq_lens,
                                    b.prefix_lens, b.max_query_len, b.heads, SCALE, peer_out,
                                    k_scale, v_scale)
    # Attention against the CPU backend on the same selections (fp32 throughout: the oracle): m3sa
    # must hold its GPU bound; against vLLM, issue 14's 1e-2 max abs. vLLM's relative L2 to the
    # oracle is reported, not asserted: its Triton prefill attention differed from m3sa by 2.4e-3
    # relative L2 on the H200 (2026-12-01) while m3sa was within 1e-3 of the CPU backend.
    cpu_out = torch.zeros_like(b.q).cpu()
    cpu = [t.cpu() if t is not None else None for t in (b.q, b.kv_cache, topk, b.block_table)]
    scales = [s.cpu() if s is not None else None for s in (k_scale, v_scale)]
    if decode:
        mv.minimax_m3_sparse_attn_decode(*cpu, b.seq_lens.cpu(), b.heads, SCALE, cpu_out, 1, *scales)
    else:
        mv.minimax_m3_sparse_attn(*cpu, b.cu_seqlens_q.cpu(), b.seq_lens.cpu(), b.prefix_lens.cpu(),
                                  b.max_query_len, b.heads, SCALE, cpu_out, *scales)
    errors = attention_errors(out.cpu(), cpu_out)
    metrics.update(attention_m3sa_vs_cpu=errors,
                   attention_vllm_vs_cpu=attention_errors(peer_out.cpu(), cpu_out),
                   attention_m3sa_vs_vllm=attention_errors(out, peer_out),
                   exactly_identical_rows=exact["rows"] - exact["differing_rows"])
    record("vllm_m3sa_vs_triton", decode=decode, index_dtype=index_dtype, **metrics)
    assert selections["mismatched_rows"] == 0, selections
    assert errors["relative_l2"] <= GPU_ATTENTION_L2, errors
    assert metrics["attention_m3sa_vs_vllm"]["max_abs"] <= ATTENTION_MAX_ABS, metrics


# --- torch.ops.m3sa: opcheck, CUDA graphs, torch.compile -------------------------------------------

TORCH_OPS = {"index_score", "index_topk", "index_decode", "sparse_attn", "sparse_attn_decode",
             "norm_rope_insert", "sparse_attention"}


def m3sa_torch_ops(torch):
    """The ops registered under torch.ops.m3sa (from the dispatcher where it lists them)."""
    import m3sa.torch  # noqa: F401  (registers torch.ops.m3sa)

    all_names = getattr(torch._C, "_dispatch_get_all_op_names", None)
    if all_names is None:
        return set(TORCH_OPS)
    return {name.split("::")[1].split(".")[0] for name in all_names() if name.startswith("m3sa::")}


def opcheck(torch, op, args):
    """torch.library.opcheck; where torch's own checks cannot compare float8 tensors, the fake-kernel
    check alone (returned: which checks ran)."""
    try:
        torch.library.opcheck(op, args)
        return "all"
    except Exception as exc:  # noqa: BLE001
        if "float8" not in str(exc).lower():
            raise
    torch.library.opcheck(op, args, test_utils=("test_faketensor",))
    return "test_faketensor (torch cannot compare float8 tensors)"


def m3sa_caches(b):
    """b's KV cache in m3sa's layout: separate K and V caches [pages, 128, Hkv, 128]."""
    return (b.kv_cache[..., :HEAD_DIM].permute(0, 2, 1, 3).contiguous(),
            b.kv_cache[..., HEAD_DIM:].permute(0, 2, 1, 3).contiguous())


def norm_rope_args(torch, b, seed=5):
    """norm_rope_insert's arguments for b's tokens (positions and slots from its block table), with
    m3sa-layout K and V caches made from b's."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    rnd = lambda *shape: torch.randn(shape, generator=g, device="cuda").to(torch.bfloat16)
    pages = b.block_table[b.request_of_token, (b.positions // BLOCK)].long()
    slots = pages * BLOCK + b.positions % BLOCK
    weights = [(1 + 0.1 * torch.randn(HEAD_DIM, generator=g, device="cuda")) for _ in range(4)]
    index_dtype = b.torch_dtype(b.index_dtype)
    return dict(q=rnd(b.total_q, b.q_heads, HEAD_DIM), k=rnd(b.total_q, b.heads, HEAD_DIM),
                v=rnd(b.total_q, b.heads, HEAD_DIM), idx_q=rnd(b.total_q, b.heads, HEAD_DIM),
                idx_k=rnd(b.total_q, HEAD_DIM), positions=b.positions.long(),
                q_norm_weight=weights[0], k_norm_weight=weights[1], idx_q_norm_weight=weights[2],
                idx_k_norm_weight=weights[3], slot_mapping=slots, idx_slot_mapping=slots,
                q_out=torch.zeros(b.total_q, b.q_heads, HEAD_DIM, dtype=torch.bfloat16, device="cuda"),
                **dict(zip(("k_cache", "v_cache"), m3sa_caches(b))),
                idx_q_out=torch.zeros(b.total_q, b.heads, HEAD_DIM, device="cuda").to(index_dtype),
                index_kv_cache=b.index_kv_cache)


def test_opcheck_every_torch_op(torch):
    registered = m3sa_torch_ops(torch)
    ops = torch.ops.m3sa
    checked = set()
    b = vllm_batch(torch, decode=False)
    score = ops.index_score(*b.index_args())
    topk = ops.index_topk(score, b.cu_seqlens_q, b.prefix_lens, b.max_query_len, TOPK, INIT, LOCAL)
    cases = {
        "index_score": b.index_args(),
        "index_topk": (score, b.cu_seqlens_q, b.prefix_lens, b.max_query_len, TOPK, INIT, LOCAL),
        "sparse_attn": (b.q, b.kv_cache, topk, b.block_table, b.cu_seqlens_q, b.seq_lens,
                        b.prefix_lens, b.max_query_len, b.heads, SCALE, torch.zeros_like(b.q)),
    }
    d = vllm_batch(torch, decode=True)
    decode_topk = ops.index_decode(d.idx_q, d.index_kv_cache, d.block_table, d.seq_lens, d.max_seq_len,
                                   TOPK, INIT, LOCAL, d.heads, 1, 1)
    cases["index_decode"] = (d.idx_q, d.index_kv_cache, d.block_table, d.seq_lens, d.max_seq_len,
                             TOPK, INIT, LOCAL, d.heads, 1, 1)
    cases["sparse_attn_decode"] = (d.q, d.kv_cache, decode_topk, d.block_table, d.seq_lens, d.heads,
                                   SCALE, torch.zeros_like(d.q), 1)
    nr = norm_rope_args(torch, d)
    cases["norm_rope_insert"] = tuple(nr.values())
    cases["sparse_attention"] = (d.q, nr["k_cache"], nr["v_cache"], decode_topk,
                                 torch.arange(len(d.seq_lens) + 1, dtype=torch.int32, device="cuda"),
                                 d.seq_lens, d.block_table, torch.zeros_like(d.q), len(d.seq_lens), 1)
    for name, args in cases.items():
        torch.library.opcheck(getattr(ops, name).default, args)
        checked.add(name)
    assert registered == TORCH_OPS, registered
    assert checked == registered, f"torch.ops.m3sa ops without an opcheck: {registered - checked}"


def test_opcheck_fp8_caches_with_scales(torch):
    m3sa_torch_ops(torch)
    ops = torch.ops.m3sa
    d = vllm_batch(torch, decode=True, index_dtype="fp8_e4m3", kv_dtype="fp8_e4m3")
    args = (d.idx_q, d.index_kv_cache, d.block_table, d.seq_lens, d.max_seq_len, TOPK, INIT, LOCAL,
            d.heads, 1, 1)
    topk = ops.index_decode(*args)
    ran = {"index_decode": opcheck(torch, ops.index_decode.default, args)}
    attn = (d.q, d.kv_cache, topk, d.block_table, d.seq_lens, d.heads, SCALE, torch.zeros_like(d.q), 1,
            0.5, 0.25)
    ran["sparse_attn_decode"] = opcheck(torch, ops.sparse_attn_decode.default, attn)
    nr = norm_rope_args(torch, d)
    ran["norm_rope_insert"] = opcheck(torch, ops.norm_rope_insert.default,
                                      tuple(nr.values()) + (None, 1e-6, 5e6, 0.5, 0.25))
    cu = torch.arange(len(d.seq_lens) + 1, dtype=torch.int32, device="cuda")
    ran["sparse_attention"] = opcheck(torch, ops.sparse_attention.default,
                                      (d.q, nr["k_cache"], nr["v_cache"], topk, cu, d.seq_lens,
                                       d.block_table, torch.zeros_like(d.q), len(d.seq_lens), 1, 0.5, 0.25))
    record("opcheck_fp8", checks=ran)


def rewrite_decode_inputs(torch, b, seed):
    """New values in b's decode inputs, in place: queries, caches, seq_lens (same block counts)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    b.idx_q.copy_(torch.randn(b.idx_q.shape, generator=g, device="cuda").to(b.idx_q.dtype))
    b.q.copy_(torch.randn(b.q.shape, generator=g, device="cuda").to(b.q.dtype))
    b.index_kv_cache.copy_(torch.randn(b.index_kv_cache.shape, generator=g, device="cuda")
                           .to(b.index_kv_cache.dtype))
    blocks = (b.seq_lens + BLOCK - 1) // BLOCK
    b.seq_lens.copy_(torch.maximum((blocks - 1) * BLOCK + 1, b.seq_lens - 37))  # stay in their blocks
    b.block_table.copy_(b.block_table.flip(0) if b.block_table.shape[0] > 1 else b.block_table)
    b.seq_lens.copy_(b.seq_lens.flip(0))


@pytest.mark.parametrize("through", ["m3sa.vllm", "torch.ops.m3sa"])
def test_cuda_graph_replay_equals_eager(torch, through):
    b = vllm_batch(torch, decode=True)
    if through == "torch.ops.m3sa":
        m3sa_torch_ops(torch)
        index_decode, attn_decode = torch.ops.m3sa.index_decode, torch.ops.m3sa.sparse_attn_decode
    else:
        index_decode, attn_decode = mv.minimax_m3_index_decode, mv.minimax_m3_sparse_attn_decode
    out = torch.zeros_like(b.q)

    def step():
        topk = index_decode(b.idx_q, b.index_kv_cache, b.block_table, b.seq_lens, b.max_seq_len, TOPK,
                            INIT, LOCAL, b.heads, 1, 1)
        attn_decode(b.q, b.kv_cache, topk, b.block_table, b.seq_lens, b.heads, SCALE, out, 1)
        return topk

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: plans and workspaces made outside the capture
        step()
    torch.cuda.current_stream().wait_stream(side)
    plans = mv.plan_cache()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        graph_topk = step()
    assert mv.plan_cache() == plans  # the capture used the cached plans
    for seed in (1, 2):
        rewrite_decode_inputs(torch, b, seed)
        graph.replay()
        torch.cuda.synchronize()
        replayed_topk, replayed_out = graph_topk.clone(), out.clone()
        eager_topk = step()
        torch.cuda.synchronize()
        torch.testing.assert_close(replayed_topk, eager_topk, rtol=0, atol=0)
        torch.testing.assert_close(replayed_out, out, rtol=0, atol=0)
    assert out.abs().sum() > 0


def test_cuda_graph_replay_prefill_equals_eager(torch):
    b = vllm_batch(torch, decode=False)
    out = torch.zeros_like(b.q)

    def step():
        score = mv.minimax_m3_index_score(*b.index_args())
        topk = mv.minimax_m3_index_topk(score, b.cu_seqlens_q, b.prefix_lens, b.max_query_len, TOPK,
                                        INIT, LOCAL)
        mv.minimax_m3_sparse_attn(b.q, b.kv_cache, topk, b.block_table, b.cu_seqlens_q, b.seq_lens,
                                  b.prefix_lens, b.max_query_len, b.heads, SCALE, out)
        return topk

    step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        graph_topk = step()
    g = torch.Generator(device="cuda").manual_seed(9)
    b.idx_q.copy_(torch.randn(b.idx_q.shape, generator=g, device="cuda").to(b.idx_q.dtype))
    b.q.copy_(torch.randn(b.q.shape, generator=g, device="cuda").to(b.q.dtype))
    graph.replay()
    torch.cuda.synchronize()
    replayed_topk, replayed_out = graph_topk.clone(), out.clone()
    eager_topk = step()
    torch.testing.assert_close(replayed_topk, eager_topk, rtol=0, atol=0)
    torch.testing.assert_close(replayed_out, out, rtol=0, atol=0)


def test_first_call_inside_a_capture_is_not_cached(torch):
    """No warm-up: the capture makes its own plan workspace, which eager calls must not reuse."""
    b = vllm_batch(torch, decode=True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        graph_topk = mv.minimax_m3_index_decode(b.idx_q, b.index_kv_cache, b.block_table, b.seq_lens,
                                                b.max_seq_len, TOPK, INIT, LOCAL, b.heads, 1, 1)
    assert mv.plan_cache() == []
    graph.replay()
    eager = mv.minimax_m3_index_decode(b.idx_q, b.index_kv_cache, b.block_table, b.seq_lens,
                                       b.max_seq_len, TOPK, INIT, LOCAL, b.heads, 1, 1)
    torch.testing.assert_close(graph_topk, eager, rtol=0, atol=0)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_torch_compile_fullgraph_layer(torch, backend):
    """norm_rope_insert -> index_decode -> sparse_attention (a decode step of one layer) compiled
    with fullgraph=True: the same outputs and cache writes as eager."""
    m3sa_torch_ops(torch)
    ops = torch.ops.m3sa
    torch._dynamo.reset()

    def layer(args, block_table, seq_lens, cu_seqlens_q, out):
        ops.norm_rope_insert(*args)
        q_out, k_cache, v_cache, idx_q_out, index_kv_cache = args[12:17]
        topk = ops.index_decode(idx_q_out, index_kv_cache, block_table, seq_lens, 6000, TOPK, INIT,
                                LOCAL, HEADS, 1, 1)
        ops.sparse_attention(q_out, k_cache, v_cache, topk, cu_seqlens_q, seq_lens, block_table, out,
                             seq_lens.shape[0], 1)
        return topk

    b = vllm_batch(torch, decode=True)
    assert b.max_seq_len == 6000
    args = list(norm_rope_args(torch, b).values())
    eager_args = [a.clone() for a in args]
    eager_out, out = torch.zeros_like(b.q), torch.zeros_like(b.q)
    want = layer(eager_args, b.block_table, b.seq_lens, b.cu_seqlens_q, eager_out)
    compiled = torch.compile(layer, fullgraph=True, backend=backend)
    got = compiled(args, b.block_table, b.seq_lens, b.cu_seqlens_q, out)
    torch.cuda.synchronize()
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch.testing.assert_close(out, eager_out, rtol=0, atol=0)
    for i in range(12, 17):  # q_out, k_cache, v_cache, idx_q_out, index_kv_cache: written in place
        torch.testing.assert_close(args[i].view(torch.uint8), eager_args[i].view(torch.uint8),
                                   rtol=0, atol=0)
    assert out.abs().sum() > 0
    # the m3sa-layout step equals the vLLM-layout one on the same caches
    kv = torch.cat([args[13].permute(0, 2, 1, 3), args[14].permute(0, 2, 1, 3)], dim=-1)
    vllm_out = torch.zeros_like(out)
    ops.sparse_attn_decode(args[12], kv, got, b.block_table, b.seq_lens, HEADS, SCALE, vllm_out, 1)
    errors = attention_errors(vllm_out, out)  # the same kernel: strided views vs dense caches
    assert errors["relative_l2"] <= GPU_ATTENTION_L2, errors
