"""m3sa: MiniMax-M3 sparse attention (the C++ library's plan/run API over DLPack arrays).

Arrays are any DLPack / buffer-protocol arrays (numpy on the CPU); m3sa borrows them, honours their
strides and never copies. dtypes map explicitly: float32, int32 and int64 as they are; bf16 as
torch.bfloat16 or as its bit patterns in a uint16 array (numpy has no bf16); fp8 e4m3 as
torch.float8_e4m3fn or as bit patterns in a uint8 array. `to_bf16_bits` / `from_bf16_bits` convert.
"""
from typing import TYPE_CHECKING, NamedTuple, Optional

from . import _core
from ._core import (  # noqa: F401  (the public API; "X as X" re-exports it to type checkers)
    Batch as Batch,
    Capacities as Capacities,
    Config as Config,
    Plan as Plan,
    UnsupportedError as UnsupportedError,
    index_topk as index_topk,
    insert_index_k as insert_index_k,
    make_plan as make_plan,
    norm_rope_insert as norm_rope_insert,
    prepare_workspace as prepare_workspace,
    read_device_errors as read_device_errors,
    score_blocks as score_blocks,
    select_topk_blocks as select_topk_blocks,
    sparse_attention as sparse_attention,
)

if TYPE_CHECKING:  # numpy is optional: imported where it is used
    import numpy as np
    from numpy.typing import ArrayLike, NDArray

__version__ = _core.version()
build_commit = _core.build_commit
cuda_backend_built = _core.cuda_backend_built
cuda_device_count = _core.cuda_device_count

# Workspaces must be 64-byte aligned (m3sa/ops.h).
WORKSPACE_ALIGNMENT = 64


class Implementation(NamedTuple):
    name: str  # "cpu.index_topk", "cuda.index_topk.sm80", ...
    backend: str
    op: str
    description: str


def implementations() -> list[Implementation]:
    """Every implementation this build registers (m3sa/registry.h), whether or not it runs here."""
    return [Implementation(**entry) for entry in _core.implementations()]


def backends() -> list[str]:
    """The backends with at least one registered implementation in this build."""
    return sorted({impl.backend for impl in implementations()})


class Support(NamedTuple):
    """Truthy when supported; `reason` says what is missing otherwise."""

    ok: bool
    reason: str

    def __bool__(self) -> bool:
        return self.ok


def supports(backend: str, op: Optional[str] = None, config: Optional[Config] = None,
             cache_dtype: str = "bf16") -> Support:
    """Whether `backend` can run `op` (every op of the pipeline when None) here, from the registry."""
    reason = _core.unsupported_reason(backend, op, config if config is not None else Config(),
                                      cache_dtype)
    return Support(not reason, reason)


def allocate_workspace(plan: Plan) -> "NDArray[np.uint8]":
    """A prepared, 64-byte aligned numpy uint8 workspace for a host (reference / cpu) plan."""
    import numpy as np

    if plan.backend == "cuda":
        raise ValueError("allocate_workspace: a cuda plan needs device memory: pass a framework's "
                         f"uint8 tensor of {plan.workspace_bytes} bytes to prepare_workspace")
    raw = np.zeros(plan.workspace_bytes + WORKSPACE_ALIGNMENT, dtype=np.uint8)
    start = -raw.ctypes.data % WORKSPACE_ALIGNMENT
    workspace = raw[start:start + plan.workspace_bytes]
    prepare_workspace(plan, workspace)
    return workspace


def to_bf16_bits(values: "ArrayLike") -> "NDArray[np.uint16]":
    """float32 values -> bf16 bit patterns (uint16), rounded to nearest even (NaN stays NaN)."""
    import numpy as np

    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    nan = (bits & 0x7FFFFFFF) > 0x7F800000
    return np.where(nan, (bits >> 16) | 0x40, rounded).astype(np.uint16)


def from_bf16_bits(bits: "ArrayLike") -> "NDArray[np.float32]":
    """bf16 bit patterns (uint16) -> float32, exactly."""
    import numpy as np

    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
