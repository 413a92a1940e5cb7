"""Per-call overhead of m3sa's Python layers on a CUDA device (issue 14's target: an m3sa.vllm decode
call with B=1 in eager mode costs at most 10 us over the kernel time).

For the decode indexer (minimax_m3_index_decode) and decode attention (minimax_m3_sparse_attn_decode),
B=1, one query token, it times, in microseconds per call:

- kernel: the op's GPU time, from a CUDA graph of `--graph-calls` raw calls replayed (no host work);
- cpp: the host time of the C++ call (m3sa validation + launch), arguments converted once
  (m3sa._core.time_index_topk / time_sparse_attention: a C++ loop);
- core: m3sa._core's Python binding, tensors as DLPack capsules, batch built once (nanobind +
  DLPack + C++);
- vllm: m3sa.vllm's function, as vLLM would call it (a uniform decode: one call into m3sa);
- vllm_general: the same call through m3sa.vllm's general path (a Batch and the checks built in
  Python; the ragged decode and prefill calls take it; s37 r2 / r3 measured it while it still made
  two torch views of the combined cache, since split in C++);
- torch_op: torch.ops.m3sa's custom op around it;
- triton: vLLM's Triton function (when the peer imports: M3SA_PEER_DIR), for scale.

Each eager layer is timed two ways over `--calls` back-to-back calls: `host` (until the last call
returns, without waiting for the GPU: the CPU cost a call adds) and `wall` (until the GPU is done:
max(host, GPU) per call). overhead = wall - kernel: what eager mode costs over the kernel.
Medians of `--repeats` runs. Writes JSON to --out (default $OUT/python_overhead.json).
"""
import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import torch

import m3sa
import m3sa.torch  # noqa: F401  (torch.ops.m3sa)
import m3sa.vllm as mv

HEAD_DIM, BLOCK = 128, 128


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "python_overhead.json"))
    p.add_argument("--seq-len", type=int, default=8192)
    p.add_argument("--heads", type=int, default=4, help="index / KV heads (M3 TP1: 4)")
    p.add_argument("--gqa", type=int, default=16)
    p.add_argument("--topk", type=int, default=16)
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--graph-calls", type=int, default=100)
    return p.parse_args()


def peer():
    folder = os.environ.get("M3SA_PEER_DIR")
    if not folder or not (Path(folder) / "vllm_shim").is_dir():
        return None, "M3SA_PEER_DIR is not set to the peer folder"
    sys.path.insert(0, str(Path(folder) / "vllm_shim"))
    try:
        from vllm.models.minimax_m3.common.ops import index_topk, sparse_attn
    except Exception as exc:  # noqa: BLE001
        return None, f"{type(exc).__name__}: {exc}"
    return (index_topk, sparse_attn), None


def timed(fn, calls, repeats):
    """(host, wall) median microseconds per call over `calls` back-to-back calls."""
    hosts, walls = [], []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        host = time.perf_counter() - start
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
        hosts.append(host / calls * 1e6)
        walls.append(wall / calls * 1e6)
    return statistics.median(hosts), statistics.median(walls)


def graph_time(fn, calls, repeats):
    """GPU microseconds per call: `calls` calls captured in one graph, replayed."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    return statistics.median(times)


def main():
    args = parse()
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(1)
    H, Hq, K, S = args.heads, args.heads * args.gqa, args.topk, args.seq_len
    blocks = -(-S // BLOCK)
    pages = blocks + 3
    bf16 = torch.bfloat16
    idx_q = torch.randn((1, H, HEAD_DIM), generator=g, device=dev).to(bf16)
    index_kv_cache = torch.randn((pages, BLOCK, HEAD_DIM), generator=g, device=dev).to(bf16)
    kv_cache = torch.randn((pages, H, BLOCK, 2 * HEAD_DIM), generator=g, device=dev).to(bf16)
    q = torch.randn((1, Hq, HEAD_DIM), generator=g, device=dev).to(bf16)
    block_table = torch.randperm(pages, generator=g, device=dev)[:blocks].to(torch.int32)[None]
    seq_lens = torch.tensor([S], dtype=torch.int32, device=dev)
    out = torch.zeros_like(q)
    scale = 1 / math.sqrt(HEAD_DIM)
    decode_args = (idx_q, index_kv_cache, block_table, seq_lens, S, K, 0, 1, H, 1, 1)
    attn_args = lambda t: (q, kv_cache, t, block_table, seq_lens, H, scale, out, 1)
    topk = mv.minimax_m3_index_decode(*decode_args)  # makes the two plans the raw calls reuse
    mv.minimax_m3_sparse_attn_decode(*attn_args(topk))

    # the raw API, with the plans and workspaces m3sa.vllm made (one plan each)
    plans = {key[0]: entry for key, entry in mv._plans.items()}
    (index_plan, index_ws), (attn_plan, attn_ws) = plans["index_topk"], plans["sparse_attention"]
    cu = torch.tensor([0, 1], dtype=torch.int32, device=dev)
    batch = m3sa.Batch(cu, seq_lens, block_table, num_tokens=1, num_decode_requests=1, decode_q_len=1)
    k_view = kv_cache[..., :HEAD_DIM].permute(0, 2, 1, 3)
    v_view = kv_cache[..., HEAD_DIM:].permute(0, 2, 1, 3)
    raw_topk = torch.empty_like(topk)
    stream = lambda: torch.cuda.current_stream().cuda_stream
    # Tensors as DLPack capsules, one per call (as m3sa.vllm passes them): Tensor.__dlpack__ would
    # make the default stream wait on the current one, which a graph capture does not allow.
    dl = torch.utils.dlpack.to_dlpack

    def core_index():
        m3sa._core.index_topk(index_plan, dl(idx_q), dl(index_kv_cache), batch, dl(raw_topk),
                              workspace=dl(index_ws), stream=stream())

    def core_attn():
        m3sa._core.sparse_attention(attn_plan, dl(q), dl(k_view), dl(v_view), dl(topk), batch,
                                    dl(out), workspace=dl(attn_ws), stream=stream())

    ops = torch.ops.m3sa
    layers = {
        "index_decode": {
            "core": core_index,
            "vllm": lambda: mv.minimax_m3_index_decode(*decode_args),
            "vllm_general": lambda: mv.minimax_m3_index_decode(*decode_args),
            "torch_op": lambda: ops.index_decode(*decode_args),
        },
        "sparse_attn_decode": {
            "core": core_attn,
            "vllm": lambda: mv.minimax_m3_sparse_attn_decode(*attn_args(topk)),
            "vllm_general": lambda: mv.minimax_m3_sparse_attn_decode(*attn_args(topk)),
            "torch_op": lambda: ops.sparse_attn_decode(*attn_args(topk)),
        },
    }
    peer_ops, peer_error = peer()
    if peer_ops:
        vi, va = peer_ops
        layers["index_decode"]["triton"] = lambda: vi.minimax_m3_index_decode(*decode_args)
        layers["sparse_attn_decode"]["triton"] = lambda: va.minimax_m3_sparse_attn_decode(*attn_args(topk))

    cpp = {
        "index_decode": lambda n: m3sa._core.time_index_topk(index_plan, idx_q, index_kv_cache, batch,
                                                             raw_topk, index_ws, stream(), n),
        "sparse_attn_decode": lambda n: m3sa._core.time_sparse_attention(
            attn_plan, q, k_view, v_view, topk, batch, out, attn_ws, stream(), n),
    }
    result = {
        "what": "per-call time of m3sa's layers, B=1 decode, eager (us); overhead = wall - kernel",
        "device": torch.cuda.get_device_name(), "torch": torch.__version__, "m3sa": m3sa.__version__,
        "build_commit": m3sa.build_commit(),
        "shape": {"seq_len": S, "index_heads": H, "q_heads": Hq, "topk": K, "batch": 1},
        "calls": args.calls, "repeats": args.repeats, "peer": None if peer_ops else peer_error,
        "ops": {},
    }
    for name, fns in layers.items():
        kernel = graph_time(fns["core"], args.graph_calls, args.repeats)
        row = {"kernel_us": kernel}
        for _ in range(3):  # warm-up: C++ loop
            cpp[name](args.calls)
        cpp_host = statistics.median(cpp[name](args.calls) / args.calls * 1e6 for _ in range(args.repeats))
        torch.cuda.synchronize()
        row["cpp_host_us"] = cpp_host
        for layer, fn in fns.items():
            one_call = mv._index_decode_in_one_call, mv._attention_decode_in_one_call
            if layer == "vllm_general":  # the one-call path declines: the general path runs
                mv._index_decode_in_one_call = lambda *a: None
                mv._attention_decode_in_one_call = lambda *a: False
            for _ in range(20):
                fn()
            host, wall = timed(fn, args.calls, args.repeats)
            mv._index_decode_in_one_call, mv._attention_decode_in_one_call = one_call
            row[layer] = {"host_us": host, "wall_us": wall, "overhead_us": wall - kernel,
                          "host_over_cpp_us": host - cpp_host}
        if "triton" in fns:
            row["triton_kernel_us"] = graph_time(fns["triton"], args.graph_calls, args.repeats)
        result["ops"][name] = row
        print(f"{name}: kernel {kernel:.2f} us, C++ call {cpp_host:.2f} us host; " + ", ".join(
            f"{layer} host {row[layer]['host_us']:.2f} wall {row[layer]['wall_us']:.2f} "
            f"(+{row[layer]['overhead_us']:.2f})" for layer in fns), flush=True)
    assert mv.device_errors() == {}
    overheads = {name: result["ops"][name]["vllm"]["overhead_us"] for name in layers}
    result["target"] = {**{f"m3sa.vllm {name} overhead_us": us for name, us in overheads.items()},
                        "bound_us": 10.0, "met": all(us <= 10.0 for us in overheads.values())}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}; target (<= 10 us over the kernel): " + ", ".join(
        f"{name} {us:.2f} us" for name, us in overheads.items()), flush=True)


if __name__ == "__main__":
    main()
