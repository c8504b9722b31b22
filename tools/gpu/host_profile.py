#!/usr/bin/env python3
"""Reads a gperftools CPU profile (LD_PRELOAD=libprofiler.so.0 CPUPROFILE=FILE program ...) and prints where the
host's time went: the functions with the most samples of their own, the most samples under them, and, for
--group, the samples under each named function split by the library they ended in.

Symbols come from each mapped file's symbol table (nm, demangled; the dynamic table where a library has no other,
so an internal function of such a library shows as the exported one before it),
read on the machine where the program ran, so the binaries are the ones sampled. Used by
`bash tools/gpu/run.sh host-profile` (the GPU machine has no perf); docs/perf/inference.md has a reading.

  python3 tools/gpu/host_profile.py PROFILE [--top 30] [--focus NAME] [--group NAME ...]
"""
import argparse
import bisect
import collections
import os
import re
import struct
import subprocess
import sys


def read_profile(path):
    """(samples [(count, [pc, ...])], sampling period in us, executable mappings [(lo, hi, offset, file)])."""
    data = open(path, "rb").read()
    word = lambda i: struct.unpack_from("<Q", data, 8 * i)[0]
    if word(0) != 0 or word(2) != 0:
        sys.exit(f"{path}: not a gperftools CPU profile (64-bit)")
    period = word(3)
    i = 2 + word(1)
    samples = []
    while True:
        count, depth = word(i), word(i + 1)
        pcs = [word(i + 2 + k) for k in range(depth)]
        i += 2 + depth
        if count == 0 and depth == 1 and pcs == [0]:
            break
        samples.append((count, pcs))
    maps = []
    for line in data[8 * i:].decode("latin1").splitlines():
        m = re.match(r"([0-9a-f]+)-([0-9a-f]+) (\S+) ([0-9a-f]+) \S+ \S+\s*(.*)", line)
        if m and "x" in m.group(3):
            maps.append((int(m.group(1), 16), int(m.group(2), 16), int(m.group(4), 16), m.group(5).strip()))
    return samples, period, maps


class Symbols:
    """Address -> function name for one ELF file, through its LOAD segments and its symbol table."""

    def __init__(self, path):
        self.segments, self.addrs, self.names = [], [], []
        if not path or not os.path.isfile(path):
            return
        headers = subprocess.run(["readelf", "-lW", path], capture_output=True, text=True).stdout
        for m in re.finditer(r"LOAD\s+0x([0-9a-f]+)\s+0x([0-9a-f]+)\s+0x[0-9a-f]+\s+0x([0-9a-f]+)", headers):
            self.segments.append((int(m.group(1), 16), int(m.group(2), 16), int(m.group(3), 16)))
        table = []
        for dynamic in ([], ["-D"]):
            out = subprocess.run(["nm", "-C", "--defined-only", *dynamic, path], capture_output=True, text=True).stdout
            for line in out.splitlines():
                parts = line.split(" ", 2)
                if len(parts) == 3 and parts[1].lower() in ("t", "w", "i"):
                    table.append((int(parts[0], 16), parts[2]))
            if table:
                break
        table.sort()
        self.addrs = [a for a, _ in table]
        self.names = [n for _, n in table]

    def name(self, file_offset):
        vaddr = file_offset
        for offset, base, size in self.segments:
            if offset <= file_offset < offset + size:
                vaddr = file_offset - offset + base
                break
        k = bisect.bisect_right(self.addrs, vaddr) - 1
        return self.names[k] if k >= 0 else None


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("profile")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--focus", help="only samples under a function whose name contains this")
    parser.add_argument("--group", action="append", default=[],
                        help="samples under a function containing NAME, by the library they ended in")
    args = parser.parse_args()

    samples, period, maps = read_profile(args.profile)
    tables = {}

    def frame(pc, caller):
        pc = pc - 1 if caller else pc  # a return address points past its call
        for lo, hi, offset, path in maps:
            if lo <= pc < hi:
                if path not in tables:
                    tables[path] = Symbols(path)
                name = tables[path].name(pc - lo + offset)
                library = os.path.basename(path) or "?"
                return (name or f"[{library}]"), library
        return "[?]", "?"

    stacks = [(count, [frame(pc, k > 0) for k, pc in enumerate(pcs)]) for count, pcs in samples]
    if args.focus:
        stacks = [(c, s) for c, s in stacks if any(args.focus in name for name, _ in s)]
    total = sum(c for c, _ in stacks)
    print(f"{args.profile}: {total} samples (period {period} us){' under ' + args.focus if args.focus else ''}")
    if total == 0:
        return
    own, under = collections.Counter(), collections.Counter()
    for count, stack in stacks:
        own[stack[0][0]] += count
        for name in {name for name, _ in stack}:
            under[name] += count
    for title, counter in (("own samples", own), ("samples under", under)):
        print(f"\n| {title} | share | function |\n|---:|---:|---|")
        for name, count in counter.most_common(args.top):
            print(f"| {count} | {100 * count / total:.1f}% | {name[:140].replace('|', '/')} |")
    for group in args.group:
        by_library = collections.Counter()
        for count, stack in stacks:
            if any(group in name for name, _ in stack):
                by_library[stack[0][1]] += count
        grouped = sum(by_library.values())
        print(f"\n{group}: {grouped} samples ({100 * grouped / total:.1f}%), by the library they ended in: "
              + ", ".join(f"{lib} {100 * c / max(grouped, 1):.0f}%" for lib, c in by_library.most_common(6)))


if __name__ == "__main__":
    main()
