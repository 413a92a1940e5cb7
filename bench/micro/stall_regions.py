#!/usr/bin/env python3
"""Summarise ncu's source page (--page source --print-source sass --csv) of one kernel launch.

Prints the warp-stall samples by 1 KB region of SASS (with each region's commonest opcodes), the
most-sampled instructions, and the mbarrier waits: each SYNCS.PHASECHK try-wait with the samples
of the branch that retries it (the first `@!P BRA` on its predicate within 400 instructions: the
time a role spends waiting on that barrier offset). How
bench/NOTES.md s48 r2 / r4 read the prefill attend step.
  stall_regions.py stalls.csv [--region BYTES] [--top N]
"""
import argparse
import collections
import csv
import lzma


def read_rows(path):
    opener = lzma.open if path.endswith(".xz") else open
    with opener(path, "rt") as f:
        rows = list(csv.reader(f))
    # Row 0 names the kernel; row 1 is the header.
    header = rows[1]
    samples = header.index("Warp Stall Sampling (All Samples)")
    executed = header.index("Instructions Executed")
    base = int(rows[2][0], 16)
    out = []
    for r in rows[2:]:
        out.append((int(r[0], 16) - base, r[1].strip(), int(r[samples] or 0), int(r[executed] or 0)))
    name = next((c for c in rows[0][1:] if c), "") if rows[0] else ""
    return name, out


def opcode(sass):
    words = sass.split()
    word = words[1] if words and words[0].startswith("@") and len(words) > 1 else (words or [""])[0]
    return word.split(".")[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--region", type=lambda s: int(s, 0), default=0x400)
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    kernel, rows = read_rows(a.csv)
    total = sum(r[2] for r in rows)
    print(f"{kernel}: {total} samples, {len(rows)} instructions")

    print(f"\n| region | samples | executed | commonest opcodes (samples) |\n|---|---|---|---|")
    regions = collections.OrderedDict()
    for offset, sass, samples, executed in rows:
        r = regions.setdefault(offset // a.region, [0, 0, collections.Counter()])
        r[0] += samples
        r[1] += executed
        r[2][opcode(sass)] += samples
    for k, (samples, executed, ops) in regions.items():
        if samples * 100 >= total:  # regions with at least 1 % of the samples
            common = ", ".join(f"{o} {n}" for o, n in ops.most_common(4))
            print(f"| {k * a.region:#07x} | {samples} | {executed} | {common} |")

    print(f"\n| offset | samples | executed | instruction |\n|---|---|---|---|")
    for offset, sass, samples, executed in sorted(rows, key=lambda r: -r[2])[: a.top]:
        print(f"| {offset:#07x} | {samples} | {executed} | `{sass[:80]}` |")

    print("\n| try-wait at | barrier operand | samples (wait + retry branch) |\n|---|---|---|")
    for i, (offset, sass, samples, _) in enumerate(rows):
        if "SYNCS.PHASECHK" not in sass:
            continue
        operand = sass[sass.find("[") : sass.find("]") + 1]
        # The retry is the first branch on the try-wait's predicate that is taken when it is false
        # (ptxas may place it well after the wait, past the code that does not need the barrier).
        predicate = sass.split()[1].rstrip(",") if len(sass.split()) > 1 else ""
        retry = next((r for r in rows[i + 1 : i + 400] if r[1].startswith(f"@!{predicate} ")
                      and "BRA" in r[1]), None)
        waited = samples + (retry[2] if retry else 0)
        if waited * 200 >= total:  # at least 0.5 % of the samples
            print(f"| {offset:#07x} | `{operand}` | {waited} |")


if __name__ == "__main__":
    main()
