#!/usr/bin/env python3
"""Where one kernel's warps wait, from Nsight Compute's source page: the stall reasons over all samples, then the
instructions (SASS) with the most samples and their top reasons. This is how the Hopper flash attention's
serialized wgmma showed up (a wait after every HGMMA; docs/perf/inference.md, 2026-12-01).

On the GPU machine (ncu there; none here), for one launch of the kernel:
  ncu --section SourceCounters --section WarpStateStats --kernel-name regex:flash_forward_sm90 \\
      --launch-skip 5 --launch-count 1 --clock-control none -o fa \\
      .device/bin/cuda_ops_bench --reps 1 --filter "attention_fwd deepseek"
  ncu --import fa.ncu-rep --page source --csv --print-source sass > fa_sass.csv
then, anywhere:
  python3 tools/gpu/ncu_sass_stalls.py fa_sass.csv [--top 30]

"Instructions Executed" counts warp-level executions, so the instructions of a loop share the largest counts.
"""
import argparse
import collections
import csv


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv")
    parser.add_argument("--top", type=int, default=30, help="instructions to list")
    args = parser.parse_args()

    with open(args.csv, newline="") as f:
        rows = list(csv.reader(f))
    # Row 0 names the kernel; row 1 holds the column names; one row per SASS instruction after them.
    kernel, header, data = rows[0], rows[1], rows[2:]
    col = {name: i for i, name in enumerate(header)}
    reasons = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]

    def number(row, name):
        value = row[col[name]].replace(",", "")
        return int(value) if value else 0

    totals = collections.Counter()
    instructions = []
    for index, row in enumerate(data):
        if len(row) < len(header):
            continue
        stalls = {r[len("stall_"):]: number(row, r) for r in reasons}
        totals.update(stalls)
        instructions.append((index, row[col["Source"]].strip(), number(row, "Warp Stall Sampling (All Samples)"),
                             number(row, "Instructions Executed"), stalls))
    samples = sum(i[2] for i in instructions)
    if samples == 0:
        raise SystemExit(f"{args.csv}: no stall samples (was the SourceCounters section collected?)")

    print(" ".join(kernel)[:160])
    print(f"{samples} samples over {len(instructions)} instructions\n")
    print("| stall reason | samples | share |\n|---|---:|---:|")
    for reason, count in totals.most_common(10):
        print(f"| {reason} | {count} | {100 * count / samples:.1f}% |")
    # Samples whose reason has no column of its own here (e.g. a wgmma waiting on the tensor cores' queue).
    unnamed = samples - sum(totals.values())
    print(f"| (no column of its own) | {unnamed} | {100 * unnamed / samples:.1f}% |")
    print("\n| # | instruction | share | executed | top reasons |\n|---:|---|---:|---:|---|")
    for index, source, count, executed, stalls in sorted(instructions, key=lambda i: -i[2])[: args.top]:
        top = ", ".join(f"{r} {c}" for r, c in sorted(stalls.items(), key=lambda kv: -kv[1])[:3] if c)
        if count > sum(stalls.values()):
            top += f", (no column) {count - sum(stalls.values())}"
        print(f"| {index} | `{source[:60]}` | {100 * count / samples:.1f}% | {executed} | {top} |")


if __name__ == "__main__":
    main()
