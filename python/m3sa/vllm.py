"""vLLM's five MiniMax-M3 MSA ops with exactly vLLM's signatures, run by m3sa.

vLLM resolves these names as module globals of ``vllm.models.minimax_m3.common.ops.index_topk``
and ``.sparse_attn``, so rebinding them there (and in any module that imported them by name)
switches an engine to m3sa (README.md, "vLLM drop-in"). The arguments are any DLPack arrays: torch tensors on a CUDA device in an engine,
numpy arrays on the CPU in tests (bf16 as uint16 bits, fp8 e4m3 as uint8 bits, as in ``m3sa``).
The backend follows the arrays' device: ``cuda`` for CUDA arrays, ``host_backend`` (``"cpu"``,
or ``"reference"``) for CPU arrays. Plans are cached per (op, backend, device, config, capacities,
dtype), capacities rounded up to powers of two so that a growing batch re-plans O(log) times, and
each plan keeps one workspace (numpy on the CPU; on a CUDA device a torch uint8 tensor, prepared on
the current stream; without torch a CUDA array raises ``m3sa.UnsupportedError``). CUDA calls run on
torch's current stream and never synchronise.

How vLLM's arguments map onto m3sa's contract (docs/contract.md):

- Layouts are vLLM's: ``idx_q [total_q, H, 128]``, ``index_kv_cache [pages, 128, 128]``, the
  scores ``[H, total_q, round_up(cdiv(max_seq_len, 128), 16)]`` f32 and ``topk_idx
  [num_kv_heads, total_q, topk]`` i32, which is m3sa's ``[H, T, K]``. vLLM's combined KV cache
  ``[pages, num_kv_heads, 128, 2 * 128]`` becomes m3sa's K and V caches ``[pages, 128, Hkv, 128]``
  as two strided views of it (``kv[..., :128]`` and ``kv[..., 128:]``, dims 1 and 2 swapped): no
  copy. ``output`` is written in place; the index functions return new arrays in the framework of
  their inputs, as vLLM's do.
- Positions. vLLM places token i of request r at ``prefix_lens[r] + i``; m3sa at ``seq_len - q_len
  + i``. The prefill functions pass m3sa ``seq_lens = prefix_lens + query lengths`` (from
  ``cu_seqlens_q``), so positions are vLLM's; on host arrays ``minimax_m3_index_score`` and
  ``minimax_m3_sparse_attn`` also check that vLLM's ``seq_lens`` equals that (ValueError naming
  ``seq_lens`` otherwise; on a device it is not read: checking would synchronise).
  ``cu_seqlens_q`` is m3sa's ``cu_q_lens``; every prefill request is an m3sa prefill request.
- Decode (``minimax_m3_index_decode``, ``minimax_m3_sparse_attn_decode`` without
  ``query_start_loc``): ``total_q == num_reqs * decode_query_len``, request-major, mapped to m3sa
  decode requests with ``decode_q_len = decode_query_len`` (at most 16). A request with
  ``seq_len == 0`` (vLLM's CUDA-graph padding) is m3sa padding: topk all -1, output zeros. vLLM
  clamps ``0 < seq_len < decode_query_len``; m3sa rejects it (``q_len > seq_len``).
  The ragged decode (``query_start_loc`` given) maps to m3sa prefill-style requests with
  ``cu_q_lens = query_start_loc`` (same positions, ``seq_len - q_len + i``);
  ``token_to_req_indices`` is implied by it (checked on host arrays) and ``query_start_loc[-1]``
  must equal ``total_q`` (vLLM's rows past it are not supported; m3sa checks it on host arrays).
- Selection. vLLM's kernels and m3sa select the same *set* of blocks (forced ``init_blocks`` first
  blocks and ``local_blocks`` last causal blocks, then the best scores; all causal blocks when
  there are at most ``topk``), but the *order* differs: vLLM writes the ids in bitonic-sort order
  of score (ties in no defined order), m3sa writes them ascending, unique, then -1 padding, with
  ties broken to the lower block id. vLLM ranks a NaN score as -1e30 (above -inf), m3sa below
  every number. Attention only reads the set, but m3sa's attention requires its own format: pass
  it topk from these index functions (rebind all five names), not from vLLM's Triton top-k; host
  backends reject any other order with a ValueError naming ``topk``.
- Scores. vLLM's prefill score is the raw ``max q.k`` (no scale), as m3sa's with ``score_scale =
  1``; columns past a token's causal blocks are left unwritten by vLLM and hold -inf here. NaN
  products propagate as in m3sa (contract §4). ``minimax_m3_index_topk`` reads only causal columns.
- Attention: ``sm_scale`` must be 1/sqrt(128) (m3sa's fixed softmax scale; anything else raises
  ValueError naming ``sm_scale``); head dims and the page size are 128 (ValueError naming ``q``,
  ``idx_q`` or ``kv_cache`` otherwise); ``num_kv_heads`` must equal the cache's and topk's heads
  and divide ``q``'s heads. fp8 e4m3 KV caches take per-tensor ``k_scale`` / ``v_scale`` (arrays of
  one element, read to the host: this synchronises a CUDA tensor, so an engine capturing graphs
  should use bf16 caches or pass Python floats); vLLM's per-token/head scales ``[Hkv, tokens]`` are
  not supported (ValueError naming ``k_scale``). A bf16 cache ignores the scales, as vLLM does.
  Other fp8 formats (e5m2, fnuz) raise TypeError. A row with no keys outputs zeros (vLLM: NaN).
- ``max_query_len``, ``max_seq_len``, ``max_decode_query_len`` only size vLLM's grids; they are
  checked for consistency where that costs nothing (``decode_query_len <= max_decode_query_len``).
"""
import math
from typing import Any

from . import _core
from ._core import Batch, Capacities, Config, UnsupportedError

__all__ = [
    "minimax_m3_index_score",
    "minimax_m3_index_topk",
    "minimax_m3_index_decode",
    "minimax_m3_sparse_attn",
    "minimax_m3_sparse_attn_decode",
    "norm_rope_insert",
    "sparse_attention",
    "clear_caches",
    "plan_cache",
    "set_workspace_buffer",
    "device_errors",
]

SPARSE_BLOCK_SIZE = 128
HEAD_DIM = 128
SOFTMAX_SCALE = 1.0 / math.sqrt(HEAD_DIM)

# The backend for CPU arrays: "cpu" (OpenMP) or "reference" (the double-precision oracle).
host_backend = "cpu"

_DLPACK_CPU, _DLPACK_CUDA = 1, 2
_DTYPES = {  # str(array.dtype) -> m3sa dtype name, numpy and torch spellings
    "uint16": "bf16", "torch.bfloat16": "bf16", "bfloat16": "bf16",
    "uint8": "fp8_e4m3", "torch.float8_e4m3fn": "fp8_e4m3", "float8_e4m3fn": "fp8_e4m3",
    "float32": "f32", "torch.float32": "f32",
    "int32": "i32", "torch.int32": "i32",
    "int64": "i64", "torch.int64": "i64",
}

_plans: dict[tuple, tuple[_core.Plan, Any]] = {}  # key -> (plan, workspace)
_dtype_names: dict[Any, str] = {}  # array dtype object -> m3sa dtype name
_constants: dict[tuple, Any] = {}  # cached index arrays (decode cu_q_lens) per (device, shape)
_arena: list = []  # [buffer, next free byte] once set_workspace_buffer() named a caller's buffer

# torch, bound on the first torch tensor seen (m3sa.vllm never imports torch itself): tensors cross
# into m3sa._core as DLPack capsules from torch.utils.dlpack.to_dlpack (one C call), not through
# Tensor.__dlpack__ (Python code, several microseconds a tensor).
_torch_module = None
_tensor_type = None
_to_dlpack = None
_raw_stream = None
_fp8 = _uint8 = None


def clear_caches() -> None:
    """Drops the cached plans, workspaces and index arrays (and rewinds a workspace buffer)."""
    _plans.clear()
    _constants.clear()
    if _arena:
        _arena[1] = 0


def set_workspace_buffer(buffer: Any) -> None:
    """Plans made from now on carve their workspaces out of ``buffer``, a caller's contiguous 1-D
    uint8 array (a torch CUDA tensor for CUDA arrays, numpy for host ones), 64-byte aligned, in
    the order they are made; ``None`` goes back to allocating each. Drops the cached plans. A plan
    whose workspace no longer fits raises ValueError naming ``workspace buffer``."""
    clear_caches()
    _arena.clear()
    if buffer is None:
        return
    if not (str(buffer.dtype) in ("uint8", "torch.uint8") and len(buffer.shape) == 1):
        _fail("workspace buffer", "a 1-D uint8 array",
              f"dtype {buffer.dtype}, shape {tuple(buffer.shape)}")
    _arena.extend([buffer, 0])


def device_errors() -> dict[tuple, int]:
    """{plan key: flags} for every cached CUDA plan whose runs set a device error flag (m3sa/ops.h:
    1 page id out of range, 2 seq_len beyond the block table or q_len > seq_len, 4 bad slot, 8
    decode q_len, 16 position), clearing them; {} when none did. Synchronises each plan's device's
    current stream: call it outside CUDA graph capture, e.g. after a step in tests."""
    errors = {}
    for key, (plan, workspace) in list(_plans.items()):
        if plan.backend == "cuda":
            flags = _core.read_device_errors(plan, _dl(workspace), stream=_stream(key[2]))
            if flags:
                errors[key] = flags
    return errors


def plan_cache() -> list[tuple]:
    """The cached plans (a copy of the keys: (op, backend, device, config, capacities, dtype))."""
    return list(_plans)


# --- arrays -----------------------------------------------------------------------------------

def _device(array, name):
    if _tensor_type is not None and isinstance(array, _tensor_type):  # without Tensor.__dlpack_device__
        # is_cuda / get_device(): a third of the time of Tensor.device's object (hot path)
        if array.is_cuda:
            return _DLPACK_CUDA, array.get_device()
        if array.is_cpu:
            return _DLPACK_CPU, 0
    try:
        kind, ordinal = array.__dlpack_device__()
    except AttributeError:
        raise TypeError(f"m3sa.vllm: {name}: expected a DLPack array (torch tensor, numpy array), "
                        f"got {type(array).__name__}") from None
    if int(kind) not in (_DLPACK_CPU, _DLPACK_CUDA):
        raise ValueError(f"m3sa.vllm: {name}: expected an array on the CPU or a CUDA device, got "
                         f"DLPack device type {int(kind)}")
    return int(kind), int(ordinal)


def _dtype(array, name):
    dtype = _dtype_names.get(array.dtype)  # by the dtype object: str() of it is the slow part
    if dtype is None:
        dtype = _DTYPES.get(str(array.dtype))
        if dtype is None:
            raise TypeError(f"m3sa.vllm: {name}: dtype {array.dtype} has no m3sa equivalent; expected "
                            "bfloat16 (uint16 bits), float8_e4m3fn (uint8 bits), float32, int32 or int64")
        _dtype_names[array.dtype] = dtype
    return dtype


def _is_torch(array):
    return type(array).__module__.startswith("torch")


def _torch():
    global _torch_module, _tensor_type, _to_dlpack, _raw_stream, _fp8, _uint8
    if _torch_module is not None:
        return _torch_module
    try:
        import torch
    except ImportError:
        raise UnsupportedError("m3sa.vllm: arrays on a CUDA device need torch for the workspace, "
                               "outputs and stream; torch is not installed") from None
    if _tensor_type is None:
        from torch.utils.dlpack import to_dlpack

        _to_dlpack = getattr(torch._C, "_to_dlpack", None) or to_dlpack  # the C function itself
        # the current stream's handle without a Stream object (what torch.compile's code calls)
        _raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        _fp8, _uint8 = getattr(torch, "float8_e4m3fn", None), torch.uint8
        _tensor_type = torch.Tensor
    _torch_module = torch
    return torch


def _dl(array):
    """What m3sa._core takes for an array: a torch tensor as a DLPack capsule (float8_e4m3fn as its
    uint8 bits, which every DLPack version can carry), anything else as it is."""
    if _tensor_type is None:
        if not _is_torch(array):
            return array
        _torch()
    if isinstance(array, _tensor_type):
        if array.dtype is _fp8:
            array = array.view(_uint8)
        return _to_dlpack(array)
    return array


def _batch(cu_q_lens, seq_lens, block_table, **kwargs):
    return Batch(_dl(cu_q_lens), _dl(seq_lens), _dl(block_table), **kwargs)


def _empty(like, shape, dtype, fill=None):
    """A new array in like's framework and on its device ("float32" / "int32")."""
    if _is_torch(like) or _device(like, "array")[0] == _DLPACK_CUDA:
        torch = _torch()
        make = torch.empty if fill is None else (lambda *a, **k: torch.full(*a, fill, **k))
        return make(tuple(shape), dtype=getattr(torch, dtype), device=like.device)
    import numpy as np

    return np.empty(shape, dtype) if fill is None else np.full(shape, fill, dtype)


def _host(array):
    """A numpy view of a CPU array, None for a device array (not read: it would synchronise)."""
    if _device(array, "array")[0] != _DLPACK_CPU:
        return None
    import numpy as np

    return np.from_dlpack(array)


def _pow2(n):
    return 1 << max(0, int(n) - 1).bit_length()


def _stream(device):
    if device[0] != _DLPACK_CUDA:
        return 0
    torch = _torch()
    if _raw_stream is not None:
        return _raw_stream(device[1])
    return torch.cuda.current_stream(device[1]).cuda_stream


# --- plans and workspaces ---------------------------------------------------------------------

def _plan(op, device, config, requests, tokens, blocks, dtype):
    """The cached (plan, workspace) for this op; capacities rounded up to powers of two. config is
    a tuple of (name, value) pairs."""
    backend = "cuda" if device[0] == _DLPACK_CUDA else host_backend
    caps = (_pow2(requests), _pow2(tokens), _pow2(blocks))
    key = (op, backend, device, config, caps, dtype)
    entry = _plans.get(key)
    if entry is None:
        capturing = device[0] == _DLPACK_CUDA and _torch().cuda.is_current_stream_capturing()
        plan = _core.make_plan(op, backend, Config(**dict(config)), Capacities(*caps), dtype,
                               device_ordinal=device[1])
        entry = (plan, _workspace(plan, device))
        # A workspace first made inside a CUDA graph capture comes from the graph's memory pool and
        # is prepared only when the graph replays: right for that graph, wrong for a later eager
        # call, so it is not cached (warming up before capturing, as torch.cuda.graph asks, makes
        # the cached one, which the graph then uses).
        if not capturing:
            _plans[key] = entry
    return entry


def _workspace(plan, device):
    from . import WORKSPACE_ALIGNMENT

    if _arena:
        buffer, offset = _arena
        base = buffer.data_ptr() if _is_torch(buffer) else buffer.ctypes.data
        start = offset + (-(base + offset) % WORKSPACE_ALIGNMENT)
        end = start + plan.workspace_bytes
        if not (end <= buffer.shape[0]):
            _fail("workspace buffer", f"at least {end} bytes (the cached "
                  f"plans' workspaces, 64-byte aligned, {plan.implementation} needing "
                  f"{plan.workspace_bytes})", f"{buffer.shape[0]} bytes")
        workspace = buffer[start:end]
        _core.prepare_workspace(plan, _dl(workspace), stream=_stream(device))
        _arena[1] = end
        return workspace
    if device[0] == _DLPACK_CPU:
        from . import allocate_workspace

        return allocate_workspace(plan)
    torch = _torch()
    raw = torch.empty(plan.workspace_bytes + WORKSPACE_ALIGNMENT, dtype=torch.uint8,
                      device=f"cuda:{device[1]}")
    start = -raw.data_ptr() % WORKSPACE_ALIGNMENT
    workspace = raw[start:start + plan.workspace_bytes]
    _core.prepare_workspace(plan, _dl(workspace), stream=_stream(device))
    return workspace


def _run(op, device, plan_args, *args, **kwargs):
    """op's plan from the cache, then the op on args; keyword arrays (norm_rope_insert's) too."""
    plan, workspace = _plan(op, device, *plan_args)
    if kwargs:
        kwargs = {name: _dl(value) for name, value in kwargs.items()}
    getattr(_core, op)(plan, *[_dl(a) for a in args], workspace=_dl(workspace),
                       stream=_stream(device), **kwargs)


# --- argument checks --------------------------------------------------------------------------

def _fail(name, expected, got):
    """A ValueError naming the argument. Callers test first (`if not ...: _fail(...)`), so that
    the messages are formatted only on failure (the calls are on an engine's hot path)."""
    raise ValueError(f"m3sa.vllm: {name}: expected {expected}, got {got}")


def _check_head_dim(array, name):
    if not (len(array.shape) == 3 and array.shape[2] == HEAD_DIM):
        _fail(name,
              f"[tokens, heads, {HEAD_DIM}] (m3sa's head dim is fixed at {HEAD_DIM})",
              f"shape {tuple(array.shape)}")


def _check_index_heads(idx_q, num_kv_heads):
    if not (idx_q.shape[1] == num_kv_heads):
        _fail("num_kv_heads",
              f"idx_q's index heads ({idx_q.shape[1]}; M3 has one index head per KV head)", num_kv_heads)


def _query_lens(cu_seqlens_q):
    return cu_seqlens_q[1:] - cu_seqlens_q[:-1]


def _prefill_seq_lens(cu_seqlens_q, prefix_lens, seq_lens=None):
    """m3sa's seq_lens for vLLM's prefix_lens (positions prefix_len + i); checks vLLM's seq_lens."""
    derived = prefix_lens + _query_lens(cu_seqlens_q)
    if seq_lens is not None:
        host_derived, host_given = _host(derived), _host(seq_lens)
        if host_derived is not None and host_given is not None:
            if not ((host_derived == host_given).all()):
                _fail("seq_lens",
                      "prefix_lens + query lengths (vLLM places token i at prefix_len + i)",
                      f"{host_given.tolist()} vs {host_derived.tolist()}")
    return derived


def _decode_batch(queries, name, seq_lens, block_table, decode_query_len):
    """m3sa's batch for vLLM's uniform decode: num_reqs requests of decode_query_len rows."""
    total_q, num_reqs = queries.shape[0], seq_lens.shape[0]
    if not (total_q == num_reqs * decode_query_len):
        _fail(name,
              f"num_reqs x decode_query_len = {num_reqs * decode_query_len} tokens", total_q)
    return _batch(_decode_cu_q_lens(seq_lens, num_reqs, decode_query_len), seq_lens, block_table,
                  num_tokens=total_q, num_decode_requests=num_reqs, decode_q_len=decode_query_len)


def _decode_cu_q_lens(like, num_reqs, decode_query_len):
    device = _device(like, "seq_lens")
    key = (device, _is_torch(like), num_reqs, decode_query_len)
    cu = _constants.get(key)
    if cu is None:
        if _is_torch(like):
            torch = _torch()
            cu = torch.arange(0, (num_reqs + 1) * decode_query_len, decode_query_len,
                              dtype=torch.int32, device=like.device)
            if like.is_cuda and torch.cuda.is_current_stream_capturing():
                return cu  # written when the graph replays: not for eager calls (see _plan)
        else:
            import numpy as np

            cu = np.arange(num_reqs + 1, dtype=np.int32) * decode_query_len
        _constants[key] = cu
    return cu


def _index_config(num_kv_heads, topk=16, init_blocks=0, local_blocks=1):
    """m3sa.Config's arguments as (name, value) pairs (hashable: part of the plan cache's key)."""
    return (("top_k", int(topk)), ("init_blocks", int(init_blocks)),
            ("local_blocks", int(local_blocks)), ("num_index_heads", int(num_kv_heads)))


def _scale(value, name):
    if value is None:
        return 1.0
    if isinstance(value, (int, float)):
        return float(value)
    size = math.prod(value.shape)
    if not (size == 1):
        _fail(name, "a per-tensor scale (one element); m3sa has no per-token/head KV "
              "scales", f"shape {tuple(value.shape)}")
    return float(value.reshape(-1)[0])


def _kv_scales(kv_cache, k_scale, v_scale):
    dtype = _dtype(kv_cache, "kv_cache")
    if dtype != "fp8_e4m3":  # vLLM reads the scales only for fp8 caches
        return dtype, 1.0, 1.0
    if (k_scale is None) != (v_scale is None):
        raise ValueError("m3sa.vllm: k_scale and v_scale must be both provided or both None")
    return dtype, _scale(k_scale, "k_scale"), _scale(v_scale, "v_scale")


def _check_attention(q, kv_cache, topk_idx, num_kv_heads, sm_scale, output):
    _check_head_dim(q, "q")
    if not (len(kv_cache.shape) == 4 and kv_cache.shape[2] == SPARSE_BLOCK_SIZE
            and kv_cache.shape[3] == 2 * HEAD_DIM):
        _fail("kv_cache",
              f"[num_blocks, num_kv_heads, {SPARSE_BLOCK_SIZE}, {2 * HEAD_DIM}] (K then V per row)",
              f"shape {tuple(kv_cache.shape)}")
    if not (math.isclose(float(sm_scale), SOFTMAX_SCALE, rel_tol=1e-6)):
        _fail("sm_scale",
              f"1/sqrt({HEAD_DIM}) = {SOFTMAX_SCALE!r} (m3sa's softmax scale is fixed)", sm_scale)
    if not (kv_cache.shape[1] == num_kv_heads):
        _fail("num_kv_heads", f"kv_cache's heads "
              f"({kv_cache.shape[1]})", num_kv_heads)
    if not (len(topk_idx.shape) == 3 and topk_idx.shape[0] == num_kv_heads):
        _fail("topk_idx",
              f"[num_kv_heads={num_kv_heads}, total_q, topk]", f"shape {tuple(topk_idx.shape)}")
    if not (q.shape[1] % num_kv_heads == 0):
        _fail("num_kv_heads", f"a divisor of q's heads ({q.shape[1]})",
              num_kv_heads)
    if not (tuple(output.shape) == tuple(q.shape)):
        _fail("output", f"q's shape {tuple(q.shape)}",
              f"shape {tuple(output.shape)}")


def _attention(q, kv_cache, topk_idx, batch, num_reqs, num_kv_heads, output, k_scale, v_scale,
               block_table):
    """The attention over vLLM's combined cache, which m3sa._core.vllm_sparse_attn splits into
    m3sa's K and V caches [pages, 128, Hkv, 128] (two strided views, no copy)."""
    dtype, k_scale, v_scale = _kv_scales(kv_cache, k_scale, v_scale)
    device = _device(q, "q")
    plan, workspace = _plan("sparse_attention", device,
                            _index_config(num_kv_heads, topk=topk_idx.shape[2]), num_reqs,
                            q.shape[0], block_table.shape[1], dtype)
    _core.vllm_sparse_attn(plan, _dl(q), _dl(kv_cache), _dl(topk_idx), batch, _dl(output),
                           k_scale, v_scale, _dl(workspace), _stream(device))


# --- the uniform decode ops in one call ---------------------------------------------------------
# An engine's eager decode step calls these once a layer, so their host time is on its critical
# path at small batches: the general path's Batch object, checks and plan-keyed call cost a few
# microseconds more a call (two torch views of the combined cache, now split in C++, were ~5 more;
# bench/python_overhead.py). Here the arguments go to m3sa in one call
# (m3sa._core.vllm_*_decode split the cache and build the batch in C++)
# after the checks only Python can make (vLLM's scalars, and the shapes a plan is keyed on);
# m3sa validates the rest. Where it rejects an argument the op's general path runs instead, so
# that the error names vLLM's argument as it always did (it raises the same error again where its
# own checks pass).

def _decode_plan(op, q, num_kv_heads, topk, init_blocks, local_blocks, seq_lens, block_table,
                 decode_query_len, dtype):
    """(plan, workspace, device, cu_q_lens) of a uniform decode call whose shapes agree, or None."""
    if not (num_kv_heads > 0 and len(q.shape) == 3 and q.shape[1] % num_kv_heads == 0
            and len(seq_lens.shape) == 1 and len(block_table.shape) == 2):
        return None
    total_q, num_reqs = q.shape[0], seq_lens.shape[0]
    if not (total_q == num_reqs * decode_query_len):
        return None
    device = _device(q, "q")
    plan, workspace = _plan(op, device, _index_config(num_kv_heads, topk, init_blocks,
                                                      local_blocks),
                            num_reqs, total_q, block_table.shape[1], dtype)
    return plan, workspace, device, _decode_cu_q_lens(seq_lens, num_reqs, decode_query_len)


def _index_decode_in_one_call(idx_q, index_kv_cache, block_table, seq_lens, topk, init_blocks,
                              local_blocks, num_kv_heads, decode_query_len, max_decode_query_len):
    """minimax_m3_index_decode's result, or None where its general path has to say what is wrong."""
    if not (decode_query_len <= max_decode_query_len):
        return None
    try:
        if not (len(idx_q.shape) == 3 and idx_q.shape[1] == num_kv_heads):
            return None
        planned = _decode_plan("index_topk", idx_q, num_kv_heads, topk, init_blocks, local_blocks,
                               seq_lens, block_table, decode_query_len,
                               _dtype(index_kv_cache, "index_kv_cache"))
        if planned is None:
            return None
        plan, workspace, device, cu_q_lens = planned
        topk_idx = _empty(idx_q, (num_kv_heads, idx_q.shape[0], topk), "int32")
        _core.vllm_index_decode(plan, _dl(idx_q), _dl(index_kv_cache), _dl(block_table),
                                _dl(seq_lens), _dl(cu_q_lens), _dl(topk_idx), decode_query_len,
                                _dl(workspace), _stream(device))
    except ValueError:
        return None
    return topk_idx


def _attention_decode_in_one_call(q, kv_cache, topk_idx, block_table, seq_lens, num_kv_heads,
                                  sm_scale, output, decode_query_len, k_scale, v_scale):
    """True once minimax_m3_sparse_attn_decode (uniform) ran; False where its general path has to
    say what is wrong."""
    if not math.isclose(float(sm_scale), SOFTMAX_SCALE, rel_tol=1e-6):
        return False
    try:
        dtype, k_scale, v_scale = _kv_scales(kv_cache, k_scale, v_scale)
        if not (len(kv_cache.shape) == 4 and kv_cache.shape[1] == num_kv_heads
                and len(topk_idx.shape) == 3 and topk_idx.shape[0] == num_kv_heads):
            return False
        planned = _decode_plan("sparse_attention", q, num_kv_heads, topk_idx.shape[2], 0, 1,
                               seq_lens, block_table, decode_query_len, dtype)
        if planned is None:
            return False
        plan, workspace, device, cu_q_lens = planned
        _core.vllm_sparse_attn_decode(plan, _dl(q), _dl(kv_cache), _dl(topk_idx),
                                      _dl(block_table), _dl(seq_lens), _dl(cu_q_lens),
                                      _dl(output), decode_query_len, k_scale, v_scale,
                                      _dl(workspace), _stream(device))
    except ValueError:
        return False
    return True


# --- the five ops -----------------------------------------------------------------------------

def minimax_m3_index_score(
    idx_q,  # [total_q, num_idx_heads, head_dim]
    index_kv_cache,  # [num_blocks, 128, head_dim]
    block_table,  # [batch, max_blocks]
    cu_seqlens_q,  # [batch+1] int32
    seq_lens,  # [batch] int32
    prefix_lens,  # [batch] int32
    max_query_len: int,
    max_seq_len: int,
    num_kv_heads: int,
) -> Any:
    """score [num_kv_heads, total_q, round_up(cdiv(max_seq_len, 128), 16)] f32: per-block max q.k."""
    _check_head_dim(idx_q, "idx_q")
    _check_index_heads(idx_q, num_kv_heads)
    max_block = -(-int(max_seq_len) // SPARSE_BLOCK_SIZE)
    width = -(-max_block // 16) * 16
    total_q, num_reqs = idx_q.shape[0], cu_seqlens_q.shape[0] - 1
    score = _empty(idx_q, (num_kv_heads, total_q, width), "float32")
    m3sa_seq_lens = _prefill_seq_lens(cu_seqlens_q, prefix_lens, seq_lens)
    # vLLM's score has the columns of max_seq_len, m3sa's at least the block table's: the table's
    # columns past max_seq_len hold no block of this batch.
    table = block_table[:, :min(block_table.shape[1], max(max_block, 1))]
    batch = _batch(cu_seqlens_q, m3sa_seq_lens, table, num_tokens=total_q)
    _run("score_blocks", _device(idx_q, "idx_q"),
         (_index_config(num_kv_heads), num_reqs, total_q, block_table.shape[1],
          _dtype(index_kv_cache, "index_kv_cache")),
         idx_q, index_kv_cache, batch, score)
    return score


def minimax_m3_index_topk(
    score,  # [num_idx_heads, total_q, max_block]
    cu_seqlens_q,  # [batch+1] int32
    prefix_lens,  # [batch] int32
    max_query_len: int,
    topk: int,
    init_blocks: int,
    local_blocks: int,
) -> Any:
    """topk_idx [num_idx_heads, total_q, topk] i32: ascending block ids, -1 padded (see above)."""
    num_heads, total_q, width = score.shape
    num_reqs = cu_seqlens_q.shape[0] - 1
    m3sa_seq_lens = _prefill_seq_lens(cu_seqlens_q, prefix_lens)
    # select_topk_blocks reads no page: a zero table of the scores' width bounds the seq_lens.
    table = _empty(score, (num_reqs, width), "int32", fill=0)
    topk_idx = _empty(score, (num_heads, total_q, topk), "int32")
    batch = _batch(cu_seqlens_q, m3sa_seq_lens, table, num_tokens=total_q)
    _run("select_topk_blocks", _device(score, "score"),
         (_index_config(num_heads, topk, init_blocks, local_blocks), num_reqs, total_q, width, "bf16"),
         score, batch, topk_idx)
    return topk_idx


def minimax_m3_index_decode(
    idx_q,  # [total_q, num_idx_heads, head_dim]
    index_kv_cache,  # [num_blocks, 128, head_dim]
    block_table,  # [num_reqs, max_blocks]
    seq_lens,  # [num_reqs] int32
    max_seq_len: int,
    topk: int,
    init_blocks: int,
    local_blocks: int,
    num_kv_heads: int,
    decode_query_len: int,
    max_decode_query_len: int,
) -> Any:
    """topk_idx [num_kv_heads, total_q, topk] i32 for a uniform decode batch (score and top-k)."""
    topk_idx = _index_decode_in_one_call(idx_q, index_kv_cache, block_table, seq_lens, topk,
                                         init_blocks, local_blocks, num_kv_heads,
                                         decode_query_len, max_decode_query_len)
    if topk_idx is not None:
        return topk_idx
    _check_head_dim(idx_q, "idx_q")
    _check_index_heads(idx_q, num_kv_heads)
    if not (decode_query_len <= max_decode_query_len):
        _fail("decode_query_len",
              f"<= max_decode_query_len ({max_decode_query_len})", decode_query_len)
    total_q, num_reqs = idx_q.shape[0], seq_lens.shape[0]
    batch = _decode_batch(idx_q, "idx_q", seq_lens, block_table, decode_query_len)
    topk_idx = _empty(idx_q, (num_kv_heads, total_q, topk), "int32")
    _run("index_topk", _device(idx_q, "idx_q"),
         (_index_config(num_kv_heads, topk, init_blocks, local_blocks), num_reqs, total_q,
          block_table.shape[1], _dtype(index_kv_cache, "index_kv_cache")),
         idx_q, index_kv_cache, batch, topk_idx)
    return topk_idx


def minimax_m3_sparse_attn(
    q,  # [total_q, num_heads, head_dim]
    kv_cache,  # [num_blocks, num_kv_heads, 128, 2*head_dim]
    topk_idx,  # [num_kv_heads, total_q, topk]
    block_table,  # [batch, max_blocks]
    cu_seqlens_q,  # [batch+1] int32
    seq_lens,  # [batch] int32
    prefix_lens,  # [batch] int32
    max_query_len: int,
    num_kv_heads: int,
    sm_scale: float,
    output,  # [total_q, num_heads, head_dim]
    k_scale=None,
    v_scale=None,
) -> None:
    """Block-sparse GQA attention over the selected blocks into output (in place)."""
    _check_attention(q, kv_cache, topk_idx, num_kv_heads, sm_scale, output)
    num_reqs = cu_seqlens_q.shape[0] - 1
    batch = _batch(cu_seqlens_q, _prefill_seq_lens(cu_seqlens_q, prefix_lens, seq_lens), block_table,
                  num_tokens=q.shape[0])
    _attention(q, kv_cache, topk_idx, batch, num_reqs, num_kv_heads, output, k_scale, v_scale,
               block_table)


def minimax_m3_sparse_attn_decode(
    q,  # [total_q, num_heads, head_dim]
    kv_cache,  # [num_blocks, num_kv_heads, 128, 2*head_dim]
    topk_idx,  # [num_kv_heads, total_q, topk]
    block_table,  # [num_reqs, max_blocks]
    seq_lens,  # [num_reqs] int32
    num_kv_heads: int,
    sm_scale: float,
    output,  # [total_q, num_heads, head_dim]
    decode_query_len: int,
    k_scale=None,
    v_scale=None,
    query_start_loc=None,
    token_to_req_indices=None,
) -> None:
    """Decode attention, uniform (decode_query_len per request) or ragged (query_start_loc)."""
    if query_start_loc is None and _attention_decode_in_one_call(
            q, kv_cache, topk_idx, block_table, seq_lens, num_kv_heads, sm_scale, output,
            decode_query_len, k_scale, v_scale):
        return
    _check_attention(q, kv_cache, topk_idx, num_kv_heads, sm_scale, output)
    total_q, num_reqs = q.shape[0], seq_lens.shape[0]
    if query_start_loc is None:
        batch = _decode_batch(q, "q", seq_lens, block_table, decode_query_len)
    else:
        if not (token_to_req_indices is not None):
            _fail("token_to_req_indices",
                  "an array with query_start_loc", None)
        if not (query_start_loc.shape[0] == num_reqs + 1):
            _fail("query_start_loc",
                  f"[num_reqs + 1 = {num_reqs + 1}]", f"shape {tuple(query_start_loc.shape)}")
        starts, owners = _host(query_start_loc), _host(token_to_req_indices)
        if starts is not None and owners is not None:
            import numpy as np

            want = np.repeat(np.arange(num_reqs), np.diff(starts))
            if not (np.array_equal(owners[:len(want)], want)):
                _fail("token_to_req_indices",
                      "the request of each token as query_start_loc says", owners.tolist())
        batch = _batch(query_start_loc, seq_lens, block_table, num_tokens=total_q)
    _attention(q, kv_cache, topk_idx, batch, num_reqs, num_kv_heads, output, k_scale, v_scale,
               block_table)


# --- m3sa's own ops in m3sa's cache layout (not vLLM's ops) ------------------------------------
# norm_rope_insert writes K and V, so it takes them as two caches [pages, 128, Hkv, 128]: the two
# halves of vLLM's combined cache interleave, and m3sa rejects outputs whose byte ranges overlap.
# sparse_attention reads such caches (and can return the lse).

def norm_rope_insert(
    q,  # [total_q, num_heads, head_dim] bf16: the q projection
    k,  # [total_q, num_kv_heads, head_dim] bf16
    v,  # [total_q, num_kv_heads, head_dim] bf16
    idx_q,  # [total_q, num_idx_heads, head_dim] bf16
    idx_k,  # [total_q, head_dim] bf16
    positions,  # [total_q] int64
    q_norm_weight,  # [head_dim] bf16 or f32 (the checkpoint's Gemma gains, "+1" added here)
    k_norm_weight,
    idx_q_norm_weight,
    idx_k_norm_weight,
    slot_mapping,  # [total_q] int64 KV-cache slot (page * 128 + offset); < 0 skips
    idx_slot_mapping,  # [total_q] int64 index-cache slot (may be slot_mapping)
    q_out,  # [total_q, num_heads, head_dim] bf16, written
    k_cache,  # [num_blocks, 128, num_kv_heads, head_dim] bf16 or fp8 e4m3, written
    v_cache,  # [num_blocks, 128, num_kv_heads, head_dim], k_cache's dtype, written
    idx_q_out,  # [total_q, num_idx_heads, head_dim] in the index cache's dtype, written
    index_kv_cache,  # [num_blocks, 128, head_dim] bf16 or fp8 e4m3, written
    cos_sin_cache=None,  # optional [max_pos, 64] bf16 or f32; None: from positions and rope_theta
    rms_norm_eps: float = 1e-6,
    rope_theta: float = 5e6,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None:
    """m3sa's fused norm_rope_insert (Gemma RMSNorm + partial NeoX RoPE on q, k, index q and index
    k; q and index q out, k and v into their caches, index k into the index cache)."""
    _check_head_dim(q, "q")
    config = (("num_index_heads", int(idx_q.shape[1])), ("rms_norm_eps", float(rms_norm_eps)),
              ("rope_theta", float(rope_theta)))
    _run("norm_rope_insert", _device(q, "q"),
         (config, 1, q.shape[0], 1, _dtype(index_kv_cache, "index_kv_cache")),
         q=q, k=k, v=v, index_q=idx_q, index_k=idx_k, positions=positions,
         q_norm_weight=q_norm_weight, k_norm_weight=k_norm_weight,
         index_q_norm_weight=idx_q_norm_weight, index_k_norm_weight=idx_k_norm_weight,
         slot_mapping=slot_mapping, index_slot_mapping=idx_slot_mapping, q_out=q_out,
         k_cache=k_cache, v_cache=v_cache, index_q_out=idx_q_out, index_k_cache=index_kv_cache,
         cos_sin_cache=cos_sin_cache, k_scale=float(k_scale), v_scale=float(v_scale))


def sparse_attention(
    q,  # [total_q, num_heads, head_dim] bf16
    k_cache,  # [num_blocks, 128, num_kv_heads, head_dim] bf16 or fp8 e4m3
    v_cache,  # [num_blocks, 128, num_kv_heads, head_dim]
    topk_idx,  # [num_kv_heads, total_q, topk] i32 from the index functions
    cu_seqlens_q,  # [num_reqs + 1] int32
    seq_lens,  # [num_reqs] int32 (token i of request r at seq_len - q_len + i)
    block_table,  # [num_reqs, max_blocks]
    output,  # [total_q, num_heads, head_dim] bf16, written
    num_decode_requests: int = 0,  # the first requests are decode requests of decode_query_len
    decode_query_len: int = 1,
    lse=None,  # optional [total_q, num_heads] f32, written
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None:
    """m3sa's sparse_attention on m3sa's batch (contract §2) and cache layout."""
    _check_head_dim(q, "q")
    num_reqs = seq_lens.shape[0]
    batch = _batch(cu_seqlens_q, seq_lens, block_table, num_tokens=q.shape[0],
                   num_decode_requests=int(num_decode_requests), decode_q_len=int(decode_query_len))
    _run("sparse_attention", _device(q, "q"),
         (_index_config(topk_idx.shape[0], topk=topk_idx.shape[2]), num_reqs, q.shape[0],
          block_table.shape[1], _dtype(k_cache, "k_cache")),
         q, k_cache, v_cache, topk_idx, batch, output, lse=lse, k_scale=float(k_scale),
         v_scale=float(v_scale))
