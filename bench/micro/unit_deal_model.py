#!/usr/bin/env python3
"""How evenly the SM90 scorer's work units fall on its persistent CTAs (bench/NOTES.md s19).

A model in page steps: a unit of b causal blocks costs b + kUnitOverheadBlocks (1). Tiles of
256 / H tokens of a C-token chunk after a prefix P; units are ranges of R blocks, listed
range-major as the schedule kernel lists them. Prints, for each R, the largest CTA share of
  strided: unit u to CTA u mod G (what the scorer does), and
  snake:   units sorted by size, largest first, dealt 0..G-1 then G-1..0 (a candidate),
and the mean share. Usage: bench/micro/unit_deal_model.py [C P H [G]] ...
"""
import math
import sys

OVERHEAD = 1


def tile_blocks(chunk, prefix, heads):
    tokens = 256 // heads
    return [(prefix + t + tokens - 1) // 128 + 1 for t in range(0, chunk, tokens)]


def range_major_units(blocks, r):
    per_tile = [max(1, math.ceil(n / r)) for n in blocks]
    units = []
    for k in range(max(per_tile)):
        units += [max(0, min(n, (k + 1) * r) - k * r) for n, u in zip(blocks, per_tile) if k < u]
    return units


def largest_share(units, ctas, snake):
    load = [0] * ctas
    order = sorted(units, reverse=True) if snake else units
    for k, b in enumerate(order):
        j, i = divmod(k, ctas)
        load[i if not snake or j % 2 == 0 else ctas - 1 - i] += b + OVERHEAD
    return max(load)


def main(argv):
    cases = [(8192, 0, 4, 132), (8192, 0, 1, 132), (8192, 24576, 4, 132), (8192, 122880, 4, 132)]
    if argv:
        cases = [tuple(int(x) for x in arg.split(",")) for arg in argv]
    for case in cases:
        chunk, prefix, heads = case[:3]
        ctas = case[3] if len(case) > 3 else 132
        blocks = tile_blocks(chunk, prefix, heads)
        print(f"C={chunk} P={prefix} H={heads} CTAs={ctas}: mean {sum(blocks) / ctas:.1f} (+ units)")
        for r in range(4, 33):
            units = range_major_units(blocks, r)
            print(f"  R={r:2d} units {len(units):5d} strided {largest_share(units, ctas, False):6d}"
                  f" snake {largest_share(units, ctas, True):6d}")


if __name__ == "__main__":
    main(sys.argv[1:])
