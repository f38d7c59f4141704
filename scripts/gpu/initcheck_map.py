#!/usr/bin/env python3
"""Which buffer initcheck's reports read: maps each reported address to the cuBLASLt calls' operands.

Input: one log holding both compute-sanitizer's initcheck reports ("Uninitialized __global__ memory
read of size N bytes ... at 0xADDR" / "Address 0xADDR ...") and the lines MIXPREC_TRACE_CUBLASLT=1
prints (src/kernels/cuda/matmul.cpp: "cublasLt: m .. n .. k .. epilogue .. beta .. capture .. NAME PTR
ROWS COLS LD BATCH BATCH_STRIDE BYTES ..."). Prints, per (call, operand) that holds reported
addresses, how many reports fall in it, the offsets' range and the operand's extent; and the
reports no traced operand holds. Usage: initcheck_map.py LOG   (scripts/gpu/run.sh initcheck-probe)
"""

import re
import sys
from collections import defaultdict

OPERAND = re.compile(r"(A|B|D|bias|aux|workspace) (0x[0-9a-f]+|\(nil\)) (\d+) (\d+) (\d+) (\d+) (\d+) (\d+)")
REPORT = re.compile(r"(?:Uninitialized __global__ memory read.*?|Address )(0x[0-9a-f]+)", re.I)


def extent(rows, cols, ld, batch, batch_stride, size):
    """Bytes from the operand's pointer to one past its last element (column-major, batched)."""
    if rows == 0 or cols == 0:
        return 0
    return ((batch - 1) * batch_stride + (cols - 1) * ld + rows) * size


def parse(lines):
    calls, reports = [], []
    for line in lines:
        if line.startswith("cublasLt:"):
            head = line.split(" A ")[0]
            ops = []
            for name, ptr, *nums in OPERAND.findall(line):
                if ptr == "(nil)":
                    continue
                rows, cols, ld, batch, bstride, size = map(int, nums)
                start = int(ptr, 16)
                ops.append((name, start, start + extent(rows, cols, ld, batch, bstride, size)))
            calls.append((head.strip(), ops))
        else:
            m = REPORT.search(line)
            if m:
                reports.append(int(m.group(1), 16))
    return calls, reports


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    with open(sys.argv[1], errors="replace") as f:
        calls, reports = parse(f)
    print(f"{len(calls)} traced cuBLASLt calls, {len(reports)} reported addresses")
    hits, unmatched = defaultdict(list), []
    for addr in reports:
        found = False
        # The latest call first: a buffer's address is reused after it is freed.
        for i in range(len(calls) - 1, -1, -1):
            for name, lo, hi in calls[i][1]:
                if lo <= addr < hi:
                    hits[(i, name)].append(addr - lo)
                    found = True
                    break
            if found:
                break
        if not found:
            unmatched.append(addr)
    for (i, name), offs in sorted(hits.items(), key=lambda kv: -len(kv[1])):
        lo, hi = next((lo, hi) for n, lo, hi in calls[i][1] if n == name)
        print(f"{len(offs):6d} reports in {name} of call {i} ({calls[i][0]}), offsets {min(offs)}..{max(offs)} "
              f"of {hi - lo} bytes")
    if unmatched:
        print(f"{len(unmatched)} reports outside every traced operand, e.g. {', '.join(hex(a) for a in unmatched[:5])}")


if __name__ == "__main__":
    main()
