#!/usr/bin/env python3
"""Every target of issues 11 (GPU sparse attention), 12 (Hopper prefill indexer) and 13 (decode
indexer) as measured in one GPU run: `m3sa bench --set full --json M3SA.json` and the peer's
`peer_bench.py --out DIR` (DIR/peer_bench.json) from the same device call (bench/gpu_check.sh
with BENCH_SET=full does both and runs this). Prints a markdown table a target a row: the
figure, the target, met / missed.
Ratios are vLLM time / m3sa time (> 1: m3sa faster), vLLM's decode times graph replays, as in
side_by_side.py; copy fractions are m3sa's own (bytes read / time against the copy rate it measured
in the same run). The structured-selection attention target needs bench/structured_attention.py
(its own run); the prefill 1M target compares with the issue's fixed vLLM times (the peer's grid
stops at 128K).
Usage: targets_table.py M3SA.json PEER.json"""
import json
import math
import sys


def m3sa_records(path):
    d = json.load(open(path))
    return d, {(r["case"], r["op"]): r for r in d["records"]}


def peer_times(path):
    """label -> ms: prefill (do_bench) and decode (graph replay where there is one)."""
    d = json.load(open(path))
    out = {}
    for r in d["summary"]:
        t = r.get("graph_ms") or r.get("vllm_ms")
        if t is not None:
            out[r["label"]] = (t, r.get("graph_frac") or r.get("vllm_frac"))
    return d, out


def main():
    md, rec = m3sa_records(sys.argv[1])
    pd, peer = peer_times(sys.argv[2])
    rows = []

    def row(issue, target, figure, met):
        rows.append((issue, target, figure, "met" if met else "missed"))

    def us(case, op):
        r = rec.get((case, op))
        return None if r is None else r["median_us"]

    def vllm_ms(label):
        return peer.get(label, (None, None))[0]

    def ratio_rows(pairs):
        """(label, peer_ms, m3sa_us) -> list of (label, vLLM/m3sa)."""
        return [(lab, p * 1e3 / m) for lab, p, m in pairs if p is not None and m is not None]

    # Issue 11: sparse attention.
    pf, dec, fp8_of_bf16 = [], [], []  # fp8_of_bf16: m3sa e4m3 time / vLLM bf16 time
    for s in ("8K", "32K", "128K"):
        for hq, hkv in ((16, 1), (64, 4)):
            lab = f"attn-pf {s} {hq}/{hkv}"
            case = f"attention prefill bf16 C=8K S={s} Hq={hq} Hkv={hkv}"
            p = vllm_ms(lab)
            pf.append((lab, p, us(case, "sparse_attention")))
            fp8 = us(f"attention prefill fp8 C=8K S={s} Hq={hq} Hkv={hkv}", "sparse_attention")
            if p and fp8:
                fp8_of_bf16.append((lab, fp8 / (p * 1e3)))
            for b in (1, 32, 128):
                lab = f"attn-dec {s} B{b} {hq}/{hkv}"
                case = f"attention decode bf16 B={b} S={s} Hq={hq} Hkv={hkv}"
                dec.append((lab, vllm_ms(lab), us(case, "sparse_attention")))
    r = ratio_rows(pf)
    if r:
        lo = min(r, key=lambda x: x[1])
        row(11, "random prefill >= 1.25x vLLM, every case",
            f"{min(x[1] for x in r):.2f}-{max(x[1] for x in r):.2f}x ({len(r)} cases; min {lo[0]})",
            lo[1] >= 1.25)
    if fp8_of_bf16:
        hi = max(fp8_of_bf16, key=lambda x: x[1])
        row(11, "fp8 KV prefill <= 0.5 x vLLM's bf16 time",
            f"{min(x[1] for x in fp8_of_bf16):.2f}-{hi[1]:.2f} (max {hi[0]})", hi[1] <= 0.5)
    big = rec.get(("attention decode bf16 B=128 S=128K Hq=64 Hkv=4", "sparse_attention"))
    big8 = rec.get(("attention decode fp8 B=128 S=128K Hq=64 Hkv=4", "sparse_attention"))
    if big:
        frac = big["fraction_of_ceiling"]
        row(11, "decode B=128 S=128K 64/4 bf16 >= 94% of copy", f"{100 * frac:.1f}%", frac >= 0.94)
    if big and big8:
        x = big["median_us"] / big8["median_us"]
        row(11, "fp8 KV there >= 1.7x our bf16 time",
            f"{x:.2f}x ({big['median_us']:.1f} / {big8['median_us']:.1f} us)", x >= 1.7)
    r = ratio_rows(dec)
    if r:
        lat = [(lab, 1 / x) for lab, x in r if " B1 " in lab]
        worst = max(lat, key=lambda x: x[1])
        row(11, "decode B=1 <= 0.8x vLLM's latency",
            f"{min(x[1] for x in lat):.2f}-{worst[1]:.2f} (max {worst[0]})", worst[1] <= 0.8)
        lo = min(r, key=lambda x: x[1])
        behind = sum(x < 1 for _, x in r)
        row(11, "decode at least vLLM's speed, every case",
            f"min {lo[1]:.2f}x ({lo[0]}); behind in {behind} of {len(r)}", behind == 0)

    # Issue 12: prefill indexer.
    pre = []
    for dt in ("bf16", "fp8"):
        for s in ("8K", "32K", "128K"):
            for h in (1, 4):
                pre.append((f"idx-pf {s} H{h} {dt}", vllm_ms(f"idx-pf {s} H{h} {dt}"),
                            us(f"prefill {dt} C=8K S={s} H={h}", "index_topk")))
    r = ratio_rows(pre)
    if r:
        lo = min(r, key=lambda x: x[1])
        g = math.exp(sum(math.log(x) for _, x in r) / len(r))
        row(12, "every prefill case >= 1.5x vLLM", f"min {lo[1]:.2f}x ({lo[0]}; {len(r)} cases)",
            lo[1] >= 1.5)
        row(12, "prefill geometric mean >= 2x", f"{g:.2f}x", g >= 2)
    for dt, issue_ms in (("bf16", 60.0), ("fp8", 41.0)):
        t = us(f"prefill {dt} C=16K S=1M H=4", "index_topk")
        if t:
            x = issue_ms * 1e3 / t
            row(12, f"C=16K S=1M H=4 {dt} >= 2x vLLM ({issue_ms:.0f} ms, the issue's figure)",
                f"{x:.2f}x ({t / 1e3:.1f} ms)", x >= 2)
    g = rec.get(("prefill bf16 C=8K S=128K H=4", "score_blocks"))
    gi = rec.get(("prefill bf16 C=8K S=128K H=4", "index_topk"))
    if g and gi:
        row(12, "bf16 C=8K S=128K H=4 >= 65% of the bf16 GEMM rate",
            f"scoring {100 * g['fraction_of_ceiling']:.1f}%, score + top-k "
            f"{100 * gi['fraction_of_ceiling']:.1f}%", gi["fraction_of_ceiling"] >= 0.65)
    f8 = us("prefill fp8 C=8K S=128K H=4", "index_topk")
    if gi and f8:
        x = gi["median_us"] / f8
        row(12, "fp8 >= 1.6x our bf16 time (C=8K S=128K H=4)", f"{x:.2f}x", x >= 1.6)

    # Issue 13: decode indexer.
    grid = []
    for dt in ("bf16", "fp8"):
        for s in ("8K", "32K", "128K"):
            for b in (1, 32, 128):
                for h in (1, 4):
                    lab = f"idx-dec {s} B{b} H{h} {dt}"
                    p, pfrac = peer.get(lab, (None, None))
                    grid.append((lab, p, pfrac, us(f"decode {dt} B={b} S={s} H={h}", "index_topk")))
    r = [(lab, p * 1e3 / m, pfrac) for lab, p, pfrac, m in grid if p and m]
    if r:
        # Behind vLLM counts unless vLLM already streams at >= 95% of copy and m3sa is within 3%.
        fails = [(lab, x) for lab, x, pfrac in r
                 if x < 1 and not (pfrac and pfrac >= 0.95 and x >= 0.97)]
        g = math.exp(sum(math.log(x) for _, x, _ in r) / len(r))
        worst = ", ".join(f"{lab} {x:.2f}x" for lab, x in sorted(fails, key=lambda y: y[1])[:4])
        row(13, "every decode case faster than vLLM (or within 3% where vLLM >= 95% of copy)",
            f"{len(r) - len(fails)} of {len(r)}"
            + (f"; {len(fails)} behind, the worst: {worst}" if fails else ""),
            not fails)
        row(13, "decode geometric mean >= 1.3x", f"{g:.2f}x", g >= 1.3)
        lat = [(lab, 1 / x) for lab, x, _ in r if " B1 " in lab]
        worst = max(lat, key=lambda y: y[1])
        row(13, "B=1 <= 0.75x vLLM's latency (S <= 128K)",
            f"{min(y[1] for y in lat):.2f}-{worst[1]:.2f} (max {worst[0]})", worst[1] <= 0.75)
    for dt, limit in (("bf16", 70), ("fp8", 45)):
        t = us(f"decode {dt} B=1 S=1M H=1", "index_topk")
        if t:
            row(13, f"B=1 S=1M {dt} <= {limit} us", f"{t:.1f} us", t <= limit)
    for dt in ("bf16", "fp8"):
        keys = [(f"B={b} S={s} H={h}", (f"decode {dt} B={b} S={s} H={h}", "index_topk"))
                for b in (32, 128) for s in ("32K", "128K") for h in (1, 4)]
        fr = [(name, rec[key]["fraction_of_ceiling"]) for name, key in keys if key in rec]
        if fr:
            lo = min(fr, key=lambda y: y[1])
            row(13, f"B >= 32 S >= 32K {dt} >= 95% of copy",
                f"min {100 * lo[1]:.1f}% ({lo[0]}), max {100 * max(y[1] for y in fr):.1f}%",
                lo[1] >= 0.95)
    t = us("context parallel B=1 S=1M H=1 bf16, rank 0 of 4", "score_shard+merge")
    if t:
        row(13, "context-parallel rank of 4, B=1 1M <= 35 us", f"{t:.1f} us", t <= 35)

    print(f"m3sa {md.get('commit')} on {md.get('device')}; peer torch {pd['meta'].get('torch')} "
          f"triton {pd['meta'].get('triton')}")
    print("| issue | target | measured | status |\n|---|---|---|---|")
    for issue, target, figure, status in rows:
        print(f"| {issue} | {target} | {figure} | {status} |")


if __name__ == "__main__":
    main()
