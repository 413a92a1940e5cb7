#!/usr/bin/env python3
"""A decode round's bench files as one JSON and one table (bench/micro/decode_round.sh).

The device script writes `<variant>_<prefix tag>_<round>.json` (m3sa bench records) into
round.tgz. This merges them into one JSON whose records carry `variant` and `round` fields (the
form bench/results/h200 keeps) and prints a markdown table: every case's time (us) for each
variant and round, and each variant's mean over its rounds minus main's (negative: faster).

  bench/micro/round_table.py <dir or round.tgz> --json out.json [--md out.md]
                             [--variant V --round N]  (only those records: the side by side's input)
"""
import argparse
import glob
import json
import os
import re
import sys
import tarfile
import tempfile

NAME = re.compile(r"^(?P<variant>[A-Za-z0-9]+)_(?P<tag>.*)_(?P<round>\d+)\.json$")


def load(directory, variant=None, round_=None):
    """(meta, records) from the round's bench files (those of `variant` / `round_` where given):
    records gain variant and round."""
    meta, records = None, []
    for path in sorted(glob.glob(os.path.join(directory, "*.json"))):
        m = NAME.match(os.path.basename(path))
        if not m:
            continue  # the peer's, or a merged file
        if (variant is not None and m.group("variant") != variant) or \
                (round_ is not None and int(m.group("round")) != round_):
            continue
        with open(path) as f:
            j = json.load(f)
        if meta is None:
            meta = {k: v for k, v in j.items() if k != "records"}
        for r in j.get("records", []):
            r = dict(r)
            r["variant"] = m.group("variant")
            r["round"] = int(m.group("round"))
            records.append(r)
    return meta, records


def table(records, variants):
    """Markdown rows: case, each variant's rounds, each variant's mean minus main's."""
    rounds = sorted({r["round"] for r in records})
    by = {}
    for r in records:
        by.setdefault(r["case"], {})[(r["variant"], r["round"])] = r["median_us"]
    others = [v for v in variants if v != "main"]
    head = ["case"] + [f"{v}/{n}" for v in variants for n in rounds] + [f"{v} - main" for v in others]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def mean(times, v):
        xs = [times[(v, n)] for n in rounds if (v, n) in times]
        return sum(xs) / len(xs) if xs else None

    for case in sorted(by, key=case_order):
        times = by[case]
        cells = [case]
        for v in variants:
            for n in rounds:
                t = times.get((v, n))
                cells.append("" if t is None else f"{t:.2f}")
        base = mean(times, "main")
        for v in others:
            m = mean(times, v)
            cells.append("" if m is None or base is None else f"{m - base:+.2f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def case_order(case):
    """dtype, batch, context, heads in numeric order."""
    def number(text):
        m = re.match(r"(\d+)([KM]?)", text)
        if not m:
            return 0
        return int(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20}[m.group(2)]

    fields = dict(re.findall(r"(\w+)=(\w+)", case))
    words = case.split()
    return (words[1] if len(words) > 1 else "", number(fields.get("B", "0")),
            number(fields.get("S", "0")), number(fields.get("H", "0")), case)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", help="the round's output directory or round.tgz")
    parser.add_argument("--json", required=True, help="the merged records")
    parser.add_argument("--md", help="the table (default: stdout only)")
    parser.add_argument("--variant", help="only this variant's records")
    parser.add_argument("--round", type=int, help="only this round's records")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        directory = args.source
        if os.path.isfile(args.source):
            with tarfile.open(args.source) as tar:
                try:
                    tar.extractall(tmp, filter="data")
                except TypeError:  # Python without extraction filters (before 3.12)
                    tar.extractall(tmp)
            directory = tmp
        meta, records = load(directory, args.variant, args.round)
    if not records:
        sys.exit(f"round_table.py: no <variant>_<tag>_<round>.json in {args.source}")
    seen = []
    for r in records:
        if r["variant"] not in seen:
            seen.append(r["variant"])
    variants = ["main"] + [v for v in seen if v != "main"] if "main" in seen else seen
    meta = dict(meta)
    meta["variants"] = variants
    meta["records"] = records
    with open(args.json, "w") as f:
        json.dump(meta, f, indent=1)
    text = table(records, variants)
    if args.md:
        with open(args.md, "w") as f:
            f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
