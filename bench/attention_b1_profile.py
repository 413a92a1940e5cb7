"""Where batch 1's decode attention time goes, m3sa against vLLM's Triton (issue 11: m3sa 7.2-7.6 us
a call against vLLM's 5.9-6.9 in back-to-back graph replays, bench/NOTES.md s29 r2).

For B=1 S=32K, heads 16/1 and 64/4, bf16, the same inputs for both (one request, 16 selected
blocks ascending with its own last; pages shuffled in a pool), it reports:
- each kernel's GPU duration from torch.profiler (CUPTI): m3sa's one kernel, vLLM's decode and
  merge kernels, median over the profiled calls;
- the per-call time of `--calls` back-to-back calls replayed from a CUDA graph (what both benches
  time), so that per call = kernels + what lies between them (launch latency, the PDL handoff).
Run on the GPU machine from the repository root after installing m3sa with its CUDA backend
(bench/python_gpu_check.sh builds it): M3SA_PEER_DIR=.peer python3 bench/attention_b1_profile.py
--out $OUT/attention_b1_profile.json
"""
import argparse
import json
import math
import os
import statistics
import sys
from pathlib import Path

import torch

import m3sa.vllm as mv
from python_overhead import graph_time  # bench/ is the script's folder: on sys.path

BLOCK, D, TOPK = 128, 128, 16


def peer_attention():
    folder = Path(os.environ.get("M3SA_PEER_DIR", ".peer"))
    sys.path.insert(0, str(folder / "vllm_shim"))
    from vllm.models.minimax_m3.common.ops import sparse_attn
    return sparse_attn.minimax_m3_sparse_attn_decode


def inputs(seq_len, hq, hkv, seed=1):
    g = torch.Generator(device="cuda").manual_seed(seed)
    blocks = -(-seq_len // BLOCK)
    pool = 4 * blocks
    kv = torch.randn((pool, hkv, BLOCK, 2 * D), generator=g, device="cuda").to(torch.bfloat16)
    table = torch.randperm(pool, generator=g, device="cuda")[:blocks].to(torch.int32)[None]
    q = torch.randn((1, hq, D), generator=g, device="cuda").to(torch.bfloat16)
    picks = []
    for _ in range(hkv):  # 15 distinct earlier blocks and the own (last) block, ascending
        earlier = torch.randperm(blocks - 1, generator=g, device="cuda")[:TOPK - 1]
        picks.append(torch.sort(torch.cat([earlier, earlier.new_tensor([blocks - 1])])).values)
    topk = torch.stack(picks)[:, None, :].to(torch.int32).contiguous()  # [Hkv, 1, 16]
    seq_lens = torch.tensor([seq_len], dtype=torch.int32, device="cuda")
    return q, kv, topk, table, seq_lens


def kernel_durations(fn, calls):
    """Median GPU microseconds of each kernel name over `calls` eager calls (CUPTI)."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    times = {}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            us = getattr(event, "device_time", None) or event.cuda_time
            times.setdefault(event.name, []).append(us)
    return {name[:80]: {"median_us": statistics.median(t), "count": len(t)}
            for name, t in times.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."),
                                                      "attention_b1_profile.json"))
    parser.add_argument("--seq-len", type=int, default=32768)
    parser.add_argument("--calls", type=int, default=64)
    args = parser.parse_args()
    vllm_decode = peer_attention()
    scale = 1 / math.sqrt(D)
    result = {"device": torch.cuda.get_device_name(), "seq_len": args.seq_len, "cases": {}}
    for hq, hkv in ((16, 1), (64, 4)):
        q, kv, topk, table, seq_lens = inputs(args.seq_len, hq, hkv)
        out_m, out_v = torch.empty_like(q), torch.empty_like(q)
        m3sa_call = lambda: mv.minimax_m3_sparse_attn_decode(q, kv, topk, table, seq_lens, hkv,
                                                             scale, out_m, 1)
        vllm_call = lambda: vllm_decode(q, kv, topk, table, seq_lens, hkv, scale, out_v, 1)
        m3sa_call(), vllm_call()
        torch.cuda.synchronize()
        diff = (out_m.float() - out_v.float()).norm() / out_v.float().norm()
        case = {"rel_l2_m3sa_vs_vllm": float(diff)}
        for name, fn in (("m3sa", m3sa_call), ("vllm", vllm_call)):
            kernels = kernel_durations(fn, args.calls)
            case[name] = {"kernels": kernels, "graph_us_per_call": graph_time(fn, args.calls, 20),
                          "kernel_sum_us": sum(k["median_us"] * k["count"] / args.calls
                                               for k in kernels.values())}
        result["cases"][f"{hq}/{hkv}"] = case
        print(f"B=1 S={args.seq_len // 1024}K {hq}/{hkv}: rel. L2 m3sa vs vLLM {diff:.1e}", flush=True)
        for name in ("m3sa", "vllm"):
            c = case[name]
            kernels = "; ".join(f"{k} {v['median_us']:.2f} x{v['count'] // args.calls}"
                                for k, v in c["kernels"].items())
            print(f"  {name}: graph {c['graph_us_per_call']:.2f} us a call, kernels "
                  f"{c['kernel_sum_us']:.2f} us: {kernels}", flush=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
