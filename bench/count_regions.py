#!/usr/bin/python3
"""Parallel regions per training step, by the function that started them.

Runs `mixprec bench ARGS --steps N1 --warmup 0` and the same with N2 steps under
LD_PRELOAD=libcount_regions.so (bench/count_regions.c), subtracts the counts so that start-up
(primitive creation, the warm-up of the first steps' allocations) cancels, divides by N2 - N1 and
names each caller with addr2line (mixprec's own frames; a shared library is named as itself).
--one-thread counts instead the regions whose `if` clause was false (a team of one).
docs/hosts.md (2026-12-01) quotes it. Standard library only; needs binutils' addr2line.

    cmake --build build --target mixprec count_regions
    python3 bench/count_regions.py --mixprec build/mixprec -- --model gpt --precision amp-bf16
"""
import argparse
import os
import subprocess
import tempfile


def counts(mixprec, lib, args, steps, one_thread):
    with tempfile.NamedTemporaryFile("r", suffix=".txt") as out:
        env = dict(os.environ, LD_PRELOAD=lib, COUNT_REGIONS_OUT=out.name,
                   COUNT_REGIONS_ONE_THREAD="1" if one_thread else "0")
        subprocess.run([mixprec, "bench", *args, "--steps", str(steps), "--warmup", "0"], env=env, check=True,
                       stdout=subprocess.DEVNULL)
        rows = {}
        for line in out:
            n, obj, offset = line.split()
            rows[(obj, offset)] = int(n)
        return rows


def name(obj, offset):
    if ".so" in os.path.basename(obj):
        return os.path.basename(obj)
    out = subprocess.run(["addr2line", "-f", "-C", "-e", obj, offset], capture_output=True, text=True).stdout
    return out.split("\n")[0] or f"{obj}+{offset}"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mixprec", default="build/mixprec")
    p.add_argument("--lib", default=None, help="libcount_regions.so (default: beside the CLI)")
    p.add_argument("--steps", default="10,20", help="N1,N2: the two runs' step counts")
    p.add_argument("--one-thread", action="store_true", help="count the regions whose `if` was false")
    p.add_argument("args", nargs=argparse.REMAINDER, help="-- then `mixprec bench` flags")
    a = p.parse_args()
    lib = os.path.abspath(a.lib or os.path.join(os.path.dirname(a.mixprec), "libcount_regions.so"))
    n1, n2 = (int(s) for s in a.steps.split(","))
    args = a.args[1:] if a.args[:1] == ["--"] else a.args
    first, second = (counts(a.mixprec, lib, args, n, a.one_thread) for n in (n1, n2))
    per_caller = {}
    for key, n in second.items():
        per_step = (n - first.get(key, 0)) / (n2 - n1)
        if per_step > 0:
            label = name(*key)
            per_caller[label] = per_caller.get(label, 0) + per_step
    which = "one thread: the `if` was false" if a.one_thread else "more than one thread"
    print(f"parallel regions per step ({which}), OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '')}")
    for label, n in sorted(per_caller.items(), key=lambda kv: -kv[1]):
        print(f"{n:8.1f}  {label[:120]}")
    print(f"{sum(per_caller.values()):8.1f}  total")


if __name__ == "__main__":
    main()
