#!/usr/bin/env python3
"""Groups an Nsight Compute CSV of one metric (gpu__time_duration.sum) by kernel and prints a table: launches,
total and median time, share of the whole. Each kernel was timed alone by ncu (no neighbour overlapping it), so
the total is an upper bound of the GPU time the kernels take back to back. Used by `bash tools/gpu/run.sh
prefill-profile` (the GPU machine has no nsys).

  python3 tools/gpu/ncu_kernel_table.py NCU.csv [--skip N] [--count N] [--name-width 70]

--skip / --count select a window of launches (in launch order), e.g. one forward of several.
"""
import argparse
import collections
import csv
import re
import statistics
import sys


def short_name(name, width):
    """The kernel's name without its argument list and namespaces, clipped to width."""
    name = re.sub(r"\(.*$", "", name)          # arguments
    name = re.sub(r"^void ", "", name)
    name = re.sub(r"\bmicrollm::cuda_kernels::(\(anonymous namespace\)::)?", "", name)
    return name if len(name) <= width else name[: width - 3] + "..."


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv")
    parser.add_argument("--skip", type=int, default=0)
    parser.add_argument("--count", type=int, default=0)
    parser.add_argument("--name-width", type=int, default=70)
    args = parser.parse_args()
    rows = []
    with open(args.csv, newline="") as f:
        lines = [line for line in f if line.startswith('"')]  # ncu prints its own log lines before the CSV
    for row in csv.DictReader(lines):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        value = float(row["Metric Value"].replace(",", ""))
        unit = row.get("Metric Unit", "nsecond")
        scale = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3}.get(unit, 1e-3)
        rows.append((row["Kernel Name"], value * scale))
    if not rows:
        sys.exit(f"{args.csv}: no gpu__time_duration.sum rows")
    rows = rows[args.skip:]
    if args.count:
        rows = rows[: args.count]
    by_kernel = collections.defaultdict(list)
    for name, us in rows:
        by_kernel[short_name(name, args.name_width)].append(us)
    total = sum(us for _, us in rows)
    print(f"{len(rows)} launches, {total / 1e3:.3f} ms in all (each timed alone)\n")
    print(f"| kernel | launches | total ms | median us | share |")
    print(f"|---|---:|---:|---:|---:|")
    for name, times in sorted(by_kernel.items(), key=lambda item: -sum(item[1])):
        print(f"| `{name}` | {len(times)} | {sum(times) / 1e3:.3f} | {statistics.median(times):.1f} | "
              f"{100 * sum(times) / total:.1f}% |")


if __name__ == "__main__":
    main()
