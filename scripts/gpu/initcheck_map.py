#!/usr/bin/env python3
"""Which buffer initcheck's reports read: maps each reported address to the cuBLASLt calls' operands.

Input: one log holding both compute-sanitizer's initcheck reports ("Uninitialized __global__ memory
read of size N bytes ... at 0xADDR" / "Address 0xADDR ...") and the lines MIXPREC_TRACE_CUBLASLT=1
prints (src/kernels/cuda/matmul.cpp: "cublasLt: m .. n .. k .. epilogue .. beta .. capture .. NAME PTR
ROWS COLS LD BATCH BATCH_STRIDE BYTES ..."). Prints, per (call, operand) that holds reported
addresses, how many reports fall in it, the offsets' range and the operand's extent; and the
reports no traced operand holds.

--check: exit 1 unless every report lies in a 16-bit product a traced cuBLASLt call wrote (a D of
2-byte elements, any call: addresses are reused), the blind spot of initcheck that
CudaTrain.EagerProductsInFreshMemoryReadByOurKernelGiveTheCpuSums shows (docs/gpu.md, 2026-12-04,
fourth session): on an H200 with cuBLASLt 13.1, initcheck does not see the writes of the kernels
cuBLASLt runs for bf16 and f16 results, eager or replayed, and reports every later read of them;
f32 results are seen. Reports the tool dropped (its error buffer overflowed) are counted, not
classified. Usage: initcheck_map.py [--check] LOG   (scripts/gpu/run.sh memcheck, initcheck-probe)
"""

import re
import sys
from collections import defaultdict

OPERAND = re.compile(r"(A|B|D|bias|aux|workspace) (0x[0-9a-f]+|\(nil\)) (\d+) (\d+) (\d+) (\d+) (\d+) (\d+)")
# A kernel's read ("Address 0x..") or a copy's ("Uninitialized access to 0x.. on access by cudaMemcpy").
REPORT = re.compile(r"(?:Uninitialized __global__ memory read.*?|Address |Uninitialized access to )(0x[0-9a-f]+)", re.I)
DROPPED = re.compile(r"(\d+) errors were skipped \(error buffer overflow\)")


def extent(rows, cols, ld, batch, batch_stride, size):
    """Bytes from the operand's pointer to one past its last element (column-major, batched)."""
    if rows == 0 or cols == 0:
        return 0
    return ((batch - 1) * batch_stride + (cols - 1) * ld + rows) * size


def parse(lines):
    calls, reports, dropped = [], [], 0
    for line in lines:
        m = DROPPED.search(line)
        if m:
            dropped += int(m.group(1))
            continue
        if line.startswith("cublasLt:"):
            head = line.split(" A ")[0]
            ops = []
            for name, ptr, *nums in OPERAND.findall(line):
                if ptr == "(nil)":
                    continue
                rows, cols, ld, batch, bstride, size = map(int, nums)
                start = int(ptr, 16)
                ops.append((name, start, start + extent(rows, cols, ld, batch, bstride, size), size))
            calls.append((head.strip(), ops))
        else:
            m = REPORT.search(line)
            if m:
                reports.append(int(m.group(1), 16))
    return calls, reports, dropped


def outside_16bit_products(calls, reports):
    """The reported addresses that no traced call's 2-byte D holds."""
    products = [(lo, hi) for _, ops in calls for name, lo, hi, size in ops if name == "D" and size == 2]
    return [a for a in reports if not any(lo <= a < hi for lo, hi in products)]


def main():
    args = sys.argv[1:]
    check = "--check" in args
    args = [a for a in args if a != "--check"]
    if len(args) != 1:
        sys.exit(__doc__)
    with open(args[0], errors="replace") as f:
        calls, reports, dropped = parse(f)
    print(f"{len(calls)} traced cuBLASLt calls, {len(reports)} reported addresses, {dropped} reports dropped by the tool")
    hits, unmatched = defaultdict(list), []
    for addr in reports:
        found = False
        # The latest call first: a buffer's address is reused after it is freed.
        for i in range(len(calls) - 1, -1, -1):
            for name, lo, hi, _ in calls[i][1]:
                if lo <= addr < hi:
                    hits[(i, name)].append(addr - lo)
                    found = True
                    break
            if found:
                break
        if not found:
            unmatched.append(addr)
    for (i, name), offs in sorted(hits.items(), key=lambda kv: -len(kv[1])):
        lo, hi = next((lo, hi) for n, lo, hi, _ in calls[i][1] if n == name)
        print(f"{len(offs):6d} reports in {name} of call {i} ({calls[i][0]}), offsets {min(offs)}..{max(offs)} "
              f"of {hi - lo} bytes")
    if unmatched:
        print(f"{len(unmatched)} reports outside every traced operand, e.g. {', '.join(hex(a) for a in unmatched[:5])}")
    if check:
        outside = outside_16bit_products(calls, reports)
        if outside:
            print(f"check: {len(outside)} reports outside every 16-bit product cuBLASLt wrote, e.g. "
                  f"{', '.join(hex(a) for a in outside[:5])}: not initcheck's blind spot")
            sys.exit(1)
        print(f"check: all {len(reports)} reports lie in 16-bit products cuBLASLt wrote (initcheck's blind spot)")


if __name__ == "__main__":
    main()
