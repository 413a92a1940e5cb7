"""Synthetic batches for the Python tests, built with numpy (the C++ tests' src/testing mirrors)."""
import dataclasses

import numpy as np
import pytest

import m3sa

BLOCK = 128
HEAD_DIM = 128
# Exactly representable e4m3 codes of 0, +-0.5, +-1, +-2, +-3: integer-like data keeps every score
# exact in fp32, so the CPU backend's selections must equal the reference's bit for bit.
E4M3_SMALL_VALUES = np.array([0x00, 0x30, 0xB0, 0x38, 0xB8, 0x40, 0xC0, 0x44, 0xC4], np.uint8)


@dataclasses.dataclass
class Case:
    config: m3sa.Config
    capacities: m3sa.Capacities
    batch: m3sa.Batch
    positions: np.ndarray  # [T] i64
    slots: np.ndarray  # [T] i64 cache slot of each token (page * 128 + offset)
    num_pages: int
    kv_heads: int
    q_heads: int
    index_dtype: str
    index_q: np.ndarray  # [T, H, 128]
    index_k_cache: np.ndarray  # [pages, 128, 128]
    rng: np.random.Generator

    @property
    def num_tokens(self):
        return self.batch.num_tokens


def small_ints(rng, shape, index_dtype):
    if index_dtype == "fp8_e4m3":
        return rng.choice(E4M3_SMALL_VALUES, size=shape)
    return m3sa.to_bf16_bits(rng.integers(-3, 4, size=shape).astype(np.float32))


def random_bf16(rng, shape):
    return m3sa.to_bf16_bits(rng.standard_normal(shape).astype(np.float32))


def make_case(seed=0, index_dtype="bf16", heads=2, q_lens=(1, 1, 37, 5), seq_lens=(700, 129, 300, 40),
              num_decode=2, top_k=4):
    """Decode requests first, then chunked prefills; every block on its own shuffled page."""
    rng = np.random.default_rng(seed)
    blocks = [-(-s // BLOCK) for s in seq_lens]
    width = max(blocks) + 2  # columns past a request's blocks stay unread
    num_pages = sum(blocks) + 3
    pages = rng.permutation(num_pages).astype(np.int32)
    block_table = np.zeros((len(seq_lens), width), np.int32)
    positions, slots, used = [], [], 0
    for r, (q_len, seq_len) in enumerate(zip(q_lens, seq_lens)):
        block_table[r, :blocks[r]] = pages[used:used + blocks[r]]
        used += blocks[r]
        for p in range(seq_len - q_len, seq_len):
            positions.append(p)
            slots.append(int(block_table[r, p // BLOCK]) * BLOCK + p % BLOCK)
    cu_q_lens = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    num_tokens = int(cu_q_lens[-1])
    batch = m3sa.Batch(cu_q_lens, np.array(seq_lens, np.int32), block_table, num_tokens=num_tokens,
                       num_decode_requests=num_decode, decode_q_len=1)
    return Case(config=m3sa.Config(top_k=top_k, num_index_heads=heads),
                capacities=m3sa.Capacities(max_requests=8, max_tokens=64, max_blocks_per_request=width),
                batch=batch, positions=np.array(positions, np.int64), slots=np.array(slots, np.int64),
                num_pages=num_pages, kv_heads=heads, q_heads=4 * heads, index_dtype=index_dtype,
                index_q=small_ints(rng, (num_tokens, heads, HEAD_DIM), index_dtype),
                index_k_cache=small_ints(rng, (num_pages, BLOCK, HEAD_DIM), index_dtype), rng=rng)


def plan_for(case, op, backend, cache_dtype=None):
    return m3sa.make_plan(op, backend, case.config, case.capacities, cache_dtype or case.index_dtype)


def run_index_topk(case, backend, plan=None, workspace=None):
    plan = plan or plan_for(case, "index_topk", backend)
    topk = np.full((case.config.num_index_heads, case.num_tokens, case.config.top_k), -7, np.int32)
    m3sa.index_topk(plan, case.index_q, case.index_k_cache, case.batch, topk,
                    workspace=workspace if workspace is not None else m3sa.allocate_workspace(plan))
    return topk


@pytest.fixture(params=["bf16", "fp8_e4m3"])
def case(request):
    return make_case(seed=11, index_dtype=request.param)
