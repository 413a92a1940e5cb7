#!/usr/bin/env python3
"""How evenly the page-union kernel's CTAs share a structured prefill pass's tiles (numpy model).

Selections as `m3sa bench`'s structured case makes them (tools/m3sa_cli/bench_attention.cpp:
one random index-q per 128-token query block and head, each token's a +-2 % perturbation of it;
random index K; block score = the max of q.k over the block's visible keys; top 16, own block
always in), an 8K chunk at the end of an S-token context. A union tile is 8 tokens; its cost is
the pages of its two 4-token halves (one consumer warpgroup's MMAs each) plus `fixed` pages' worth
(query load, epilogue). Prints, per pass order, how far the longest of 132 CTAs runs above the
mean: `static` tile t on CTA t mod 132 (the landed kernel), `claims` one at a time in tile order,
`largest` one at a time, largest 8-token union first (the gather's buckets); both with a CTA
claiming `--lead` tiles ahead of the one it runs (0: when it finishes one).

  bench/micro/union_claim_model.py [--contexts 8192 32768] [--heads 1] [--seeds 1 2] [--lead 0 2]

S=8K, 16/1, seed 1 (s54): static +7.7 %; claims in tile order +6.9 / +6.9 / +8.1 % and largest
first +1.6 / +5.7 / +5.7 % at lead 0 / 1 / 2; S=32K: static +7.3 %, largest first +3.1 % at lead
0 and +3.8 % at lead 2 (the rest is integral: 8 tiles where the mean is 7.76).
"""
import argparse
import heapq

import numpy as np


def selections(context, chunk, seed):
    rng = np.random.default_rng(seed)
    keys = rng.uniform(-1, 1, (context, 128)).astype(np.float32)
    out = np.full((chunk, 16), -1, np.int64)
    for qb in range(chunk // 128):
        base = rng.uniform(-2, 2, 128).astype(np.float32)
        q = base + rng.uniform(-0.04, 0.04, (128, 128)).astype(np.float32)
        pos = context - chunk + qb * 128 + np.arange(128)
        own = pos // 128
        blocks = own[-1] + 1
        s = q @ keys[: blocks * 128].T
        s = np.where(np.arange(blocks * 128)[None, :] <= pos[:, None], s, -np.inf)
        score = s.reshape(128, blocks, 128).max(-1)
        score[np.arange(128), own] = np.inf
        k = min(16, blocks)
        out[qb * 128:(qb + 1) * 128, :k] = np.argsort(-score, axis=1)[:, :k]
    return out


def tile_costs(topk, fixed):
    def union(rows):
        return len(set(rows.ravel()) - {-1})
    costs, sizes = [], []
    for t0 in range(0, topk.shape[0], 8):
        costs.append(fixed + union(topk[t0:t0 + 4]) + union(topk[t0 + 4:t0 + 8]))
        sizes.append(union(topk[t0:t0 + 8]))
    return np.array(costs, float), np.array(sizes)


def longest(costs, order, ctas, lead=0):
    """List scheduling: each tile in `order` to the CTA that claims first. lead 0: a CTA claims
    its next tile when it finishes one; lead L >= 1: its k-th tile when it begins its (k - L)-th,
    so that it holds up to L tiles it has not begun (the landed kernel: 2, warp 1 claiming as soon
    as it has asked for the previous tile's query rows)."""
    heap = [(0.0, k, c) for c in range(ctas) for k in range(max(lead, 1))]
    heapq.heapify(heap)
    finish = [0.0] * ctas
    for t in order:
        claimed, k, c = heapq.heappop(heap)
        begin = max(finish[c], claimed)
        finish[c] = begin + costs[t]
        heapq.heappush(heap, (begin if lead else finish[c], k + max(lead, 1), c))
    return max(finish)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--contexts", type=int, nargs="+", default=[8192, 32768, 131072])
    ap.add_argument("--heads", type=int, default=1, help="KV (= index) heads: 1 for 16/1, 4 for 64/4")
    ap.add_argument("--pass-tokens", type=int, default=0, help="tokens a pass (default: 8192 / heads "
                    "rounded as the plan's passes: 8192 at one head, 4096 at four)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--fixed", type=float, default=2.0)
    ap.add_argument("--ctas", type=int, default=132)
    ap.add_argument("--lead", type=int, nargs="+", default=[0])
    a = ap.parse_args()
    chunk = 8192
    per_pass = a.pass_tokens or (8192 if a.heads == 1 else 4096)
    for context in a.contexts:
        for seed in a.seeds:
            heads = [selections(context, chunk, 100 * seed + h) for h in range(a.heads)]
            total = {"static": 0.0}
            for lead in a.lead:
                total[f"claims@{lead}"] = total[f"largest@{lead}"] = 0.0
            mean = 0.0
            for begin in range(0, chunk, per_pass):
                parts = [tile_costs(h[begin:begin + per_pass], a.fixed) for h in heads]
                costs = np.concatenate([c for c, _ in parts])
                sizes = np.concatenate([s for _, s in parts])
                mean += costs.sum() / a.ctas
                total["static"] += max(costs[i::a.ctas].sum() for i in range(a.ctas))
                for lead in a.lead:
                    total[f"claims@{lead}"] += longest(costs, range(len(costs)), a.ctas, lead)
                    total[f"largest@{lead}"] += longest(costs, np.argsort(-sizes, kind="stable"),
                                                        a.ctas, lead)
            print(f"S={context} heads={a.heads} seed={seed}: " +
                  ", ".join(f"{k} +{100 * (v / mean - 1):.1f} %" for k, v in total.items()), flush=True)


if __name__ == "__main__":
    main()
