"""m3sa.torch: m3sa.vllm's five ops as torch.library custom ops, ``torch.ops.m3sa.*``.

``torch.ops.m3sa.index_score``, ``index_topk``, ``index_decode`` return new tensors;
``torch.ops.m3sa.sparse_attn`` and ``sparse_attn_decode`` write ``output`` in place (declared as
mutated, so functionalisation and torch.compile see the write). Arguments, layouts and semantics are
m3sa.vllm's (see its docstring), except that the optional KV scales are ``float | None`` here (a
custom op's schema has no ``Tensor | float``; a scalar tensor would synchronise). Each op has a fake
(meta) kernel, so torch.compile traces it without running m3sa. Importable only where torch is
installed.

m3sa's own ops in m3sa's cache layout (separate K and V caches ``[pages, 128, Hkv, 128]``), as in
m3sa.vllm: ``torch.ops.m3sa.norm_rope_insert`` (the fused step before attention) writes ``q_out``,
``k_cache``, ``v_cache``, ``idx_q_out`` and ``index_kv_cache`` in place;
``torch.ops.m3sa.sparse_attention`` (m3sa's batch: decode requests first) writes ``output`` (the
lse: m3sa.vllm.sparse_attention or the plain API).

Workspaces: each op's plan keeps one (m3sa.vllm's cache); ``m3sa.vllm.set_workspace_buffer(t)``
makes them slices of a caller's uint8 tensor ``t`` instead. CUDA graphs: run each shape once
eagerly before capturing (torch.cuda.graph's warm-up), so that the plans and workspaces the graph
uses are the cached ones; the ops never synchronise (fp8 KV scales are floats here).

tests/python/test_torch.py runs opcheck and compares with m3sa.vllm on CPU tensors where torch is
installed; tests/python/test_gpu.py does the same on CUDA tensors, with CUDA graphs, torch.compile
and vLLM's Triton ops (bench/python_gpu_check.sh runs it on the GPU machine).
"""
from typing import Any, Callable, Optional, Sequence, TypeVar

try:
    import torch
except ImportError:
    raise ImportError("m3sa.torch needs PyTorch (torch.library custom ops); torch is not installed. "
                      "m3sa and m3sa.vllm work without it on DLPack arrays.") from None

from . import vllm as _vllm

_LIB = "m3sa"
_library = torch.library.Library(_LIB, "DEF")
_Fake = TypeVar("_Fake", bound=Callable[..., Any])


class _Op:
    """A registered torch.ops.m3sa op; ``@op.register_fake`` gives it its fake (meta) kernel."""

    def __init__(self, name: str) -> None:
        self.name = name

    def register_fake(self, fake: _Fake) -> _Fake:
        torch.library.register_fake(f"{_LIB}::{self.name}", fake, lib=_library)
        return fake


def _op(mutates_args: Sequence[str] = ()) -> Callable[[Callable[..., Any]], _Op]:
    """Registers the decorated function as torch.ops.m3sa.<its name> for CPU and CUDA tensors, its
    schema inferred from the annotations: through Library.define / impl, as vLLM's own ops are
    (direct_register_custom_op), since torch.library.custom_op's Python wrapper adds ~10 us to every
    call (bench/python_overhead.py's torch_op layer), as much as a batch-1 decode kernel takes."""
    def register(fn: Callable[..., Any]) -> _Op:
        _library.define(fn.__name__ + torch.library.infer_schema(fn, mutates_args=mutates_args))
        for dispatch_key in ("CPU", "CUDA"):
            _library.impl(fn.__name__, fn, dispatch_key)
        return _Op(fn.__name__)
    return register


def _score_width(max_seq_len: int) -> int:
    max_block = -(-max_seq_len // _vllm.SPARSE_BLOCK_SIZE)
    return -(-max_block // 16) * 16


@_op()
def index_score(idx_q: torch.Tensor, index_kv_cache: torch.Tensor, block_table: torch.Tensor,
                cu_seqlens_q: torch.Tensor, seq_lens: torch.Tensor, prefix_lens: torch.Tensor,
                max_query_len: int, max_seq_len: int, num_kv_heads: int) -> torch.Tensor:
    return _vllm.minimax_m3_index_score(idx_q, index_kv_cache, block_table, cu_seqlens_q, seq_lens,
                                        prefix_lens, max_query_len, max_seq_len, num_kv_heads)


@index_score.register_fake
def _(idx_q, index_kv_cache, block_table, cu_seqlens_q, seq_lens, prefix_lens, max_query_len,
      max_seq_len, num_kv_heads):
    return idx_q.new_empty((num_kv_heads, idx_q.shape[0], _score_width(max_seq_len)),
                           dtype=torch.float32)


@_op()
def index_topk(score: torch.Tensor, cu_seqlens_q: torch.Tensor, prefix_lens: torch.Tensor,
               max_query_len: int, topk: int, init_blocks: int, local_blocks: int) -> torch.Tensor:
    return _vllm.minimax_m3_index_topk(score, cu_seqlens_q, prefix_lens, max_query_len, topk,
                                       init_blocks, local_blocks)


@index_topk.register_fake
def _(score, cu_seqlens_q, prefix_lens, max_query_len, topk, init_blocks, local_blocks):
    return score.new_empty((score.shape[0], score.shape[1], topk), dtype=torch.int32)


@_op()
def index_decode(idx_q: torch.Tensor, index_kv_cache: torch.Tensor, block_table: torch.Tensor,
                 seq_lens: torch.Tensor, max_seq_len: int, topk: int, init_blocks: int,
                 local_blocks: int, num_kv_heads: int, decode_query_len: int,
                 max_decode_query_len: int) -> torch.Tensor:
    return _vllm.minimax_m3_index_decode(idx_q, index_kv_cache, block_table, seq_lens, max_seq_len,
                                         topk, init_blocks, local_blocks, num_kv_heads,
                                         decode_query_len, max_decode_query_len)


@index_decode.register_fake
def _(idx_q, index_kv_cache, block_table, seq_lens, max_seq_len, topk, init_blocks, local_blocks,
      num_kv_heads, decode_query_len, max_decode_query_len):
    return idx_q.new_empty((num_kv_heads, idx_q.shape[0], topk), dtype=torch.int32)


@_op(mutates_args=("output",))
def sparse_attn(q: torch.Tensor, kv_cache: torch.Tensor, topk_idx: torch.Tensor,
                block_table: torch.Tensor, cu_seqlens_q: torch.Tensor, seq_lens: torch.Tensor,
                prefix_lens: torch.Tensor, max_query_len: int, num_kv_heads: int, sm_scale: float,
                output: torch.Tensor, k_scale: Optional[float] = None,
                v_scale: Optional[float] = None) -> None:
    _vllm.minimax_m3_sparse_attn(q, kv_cache, topk_idx, block_table, cu_seqlens_q, seq_lens,
                                 prefix_lens, max_query_len, num_kv_heads, sm_scale, output, k_scale,
                                 v_scale)


@sparse_attn.register_fake
def _(q, kv_cache, topk_idx, block_table, cu_seqlens_q, seq_lens, prefix_lens, max_query_len,
      num_kv_heads, sm_scale, output, k_scale=None, v_scale=None):
    return None


@_op(mutates_args=("output",))
def sparse_attn_decode(q: torch.Tensor, kv_cache: torch.Tensor, topk_idx: torch.Tensor,
                       block_table: torch.Tensor, seq_lens: torch.Tensor, num_kv_heads: int,
                       sm_scale: float, output: torch.Tensor, decode_query_len: int,
                       k_scale: Optional[float] = None, v_scale: Optional[float] = None,
                       query_start_loc: Optional[torch.Tensor] = None,
                       token_to_req_indices: Optional[torch.Tensor] = None) -> None:
    _vllm.minimax_m3_sparse_attn_decode(q, kv_cache, topk_idx, block_table, seq_lens, num_kv_heads,
                                        sm_scale, output, decode_query_len, k_scale, v_scale,
                                        query_start_loc, token_to_req_indices)


@sparse_attn_decode.register_fake
def _(q, kv_cache, topk_idx, block_table, seq_lens, num_kv_heads, sm_scale, output,
      decode_query_len, k_scale=None, v_scale=None, query_start_loc=None,
      token_to_req_indices=None):
    return None


@_op(mutates_args=("q_out", "k_cache", "v_cache", "idx_q_out", "index_kv_cache"))
def norm_rope_insert(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, idx_q: torch.Tensor,
                     idx_k: torch.Tensor, positions: torch.Tensor, q_norm_weight: torch.Tensor,
                     k_norm_weight: torch.Tensor, idx_q_norm_weight: torch.Tensor,
                     idx_k_norm_weight: torch.Tensor, slot_mapping: torch.Tensor,
                     idx_slot_mapping: torch.Tensor, q_out: torch.Tensor, k_cache: torch.Tensor,
                     v_cache: torch.Tensor, idx_q_out: torch.Tensor, index_kv_cache: torch.Tensor,
                     cos_sin_cache: Optional[torch.Tensor] = None, rms_norm_eps: float = 1e-6,
                     rope_theta: float = 5e6, k_scale: float = 1.0, v_scale: float = 1.0) -> None:
    _vllm.norm_rope_insert(q, k, v, idx_q, idx_k, positions, q_norm_weight, k_norm_weight,
                           idx_q_norm_weight, idx_k_norm_weight, slot_mapping, idx_slot_mapping,
                           q_out, k_cache, v_cache, idx_q_out, index_kv_cache, cos_sin_cache,
                           rms_norm_eps, rope_theta, k_scale, v_scale)


@norm_rope_insert.register_fake
def _(q, k, v, idx_q, idx_k, positions, q_norm_weight, k_norm_weight, idx_q_norm_weight,
      idx_k_norm_weight, slot_mapping, idx_slot_mapping, q_out, k_cache, v_cache, idx_q_out,
      index_kv_cache, cos_sin_cache=None, rms_norm_eps=1e-6, rope_theta=5e6, k_scale=1.0,
      v_scale=1.0):
    return None


@_op(mutates_args=("output",))
def sparse_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     topk_idx: torch.Tensor, cu_seqlens_q: torch.Tensor, seq_lens: torch.Tensor,
                     block_table: torch.Tensor, output: torch.Tensor, num_decode_requests: int = 0,
                     decode_query_len: int = 1, k_scale: float = 1.0, v_scale: float = 1.0) -> None:
    _vllm.sparse_attention(q, k_cache, v_cache, topk_idx, cu_seqlens_q, seq_lens, block_table,
                           output, num_decode_requests, decode_query_len, None, k_scale, v_scale)


@sparse_attention.register_fake
def _(q, k_cache, v_cache, topk_idx, cu_seqlens_q, seq_lens, block_table, output,
      num_decode_requests=0, decode_query_len=1, k_scale=1.0, v_scale=1.0):
    return None
