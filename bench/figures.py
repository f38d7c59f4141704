#!/usr/bin/python3
"""Regenerates, for the host it runs on, the figures docs/hosts.md keeps per host kind.

1. The host: CPU model, the features mixprec detects, oneDNN's bf16 implementation.
   bench/peak_probe (built beside the CLI when missing): the host's arithmetic ceiling, every thread
   at once, f32 FMAs and bf16 products on its fastest bf16 unit.
2. Per model of bench/compare.py's set (mlp 512; mlp 256 with 2048/512 hidden; mlp 1024 with 512x3;
   cnn 420/1000 at 64; cnn 32/64 at 256; gpt), from `mixprec bench --profile --json`: the step's
   FLOPs (counted from the ops), its best time and FLOP rate, the host's matmul rate in the same
   process and the share of it, and the share its matrix kernels alone would give (at the rates
   they ran at, the rest of the step free: the ceiling without faster matrix kernels), in fp32
   and amp-bf16, and the step's share of the host's arithmetic peak; the bf16/fp32 step ratio
   against the matmul's own bf16/fp32 ratio; the slowest kernels of the amp-bf16 step.
3. With --pytorch: bench/compare.py on each model (mixprec against PyTorch's eager step, fp32 and
   autocast-bf16, interleaved repeats): min / median / max of the pair-wise ratios, and with the peak
   the most any step could be ahead of the peer's median step here (its FLOPs at the peak). The peer runs
   on compare.py's default heap (glibc with its mmap and trim thresholds raised: bench/README.md).
4. With --skips: the test suite's skipped tests on this host, grouped by the reason they give, and
   the op cases whose fast run fell back to the reference for some kernel (OpBackends' NOTE lines).

Prints Markdown on stdout; --json-out FILE keeps every raw result. Run on a quiet machine, under
the wait policy a user of either product has (OMP_WAIT_POLICY unset; the Host line names it):
    /usr/bin/python3 bench/figures.py --mixprec build/mixprec --pytorch --skips
Sections of docs/hosts.md before 2026-12-05's third session ran it with OMP_WAIT_POLICY=passive, under
which every parallel region first wakes the partner thread (60-80 us on our KVM hosts), at more
cost to the peer's steps than to mixprec's.
"""

import argparse
import collections
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# bench/compare.py's set: (name, bench flags). The "every shape" (docs/hosts.md).
SHAPES = [
    ("mlp 512", ["--model", "mlp", "--batch-size", "512"]),
    ("mlp 256 2048/512", ["--model", "mlp", "--batch-size", "256", "--hidden", "2048,512"]),
    ("mlp 1024 512x3", ["--model", "mlp", "--batch-size", "1024", "--hidden", "512,512,512"]),
    ("cnn 420/1000 @64", ["--model", "cnn", "--channels", "420,1000", "--batch-size", "64"]),
    ("cnn 32/64 @256", ["--model", "cnn", "--channels", "32,64", "--batch-size", "256"]),
    ("gpt", ["--model", "gpt"]),
]
PRECISIONS = ("fp32", "amp-bf16")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mixprec", default="build/mixprec", help="mixprec CLI (relative to the repo root)")
    p.add_argument("--tests", default=None, help="the test binary for --skips (default: beside the CLI)")
    p.add_argument("--models", default=None,
                   help="comma-separated names from the set (default all): " + ", ".join(n for n, _ in SHAPES))
    p.add_argument("--repeats", type=int, default=2, help="profiles per model and precision, best kept")
    p.add_argument("--pytorch", action="store_true", help="also run bench/compare.py against PyTorch")
    p.add_argument("--skips", action="store_true", help="also list the test suite's skips on this host")
    p.add_argument("--json-out", metavar="FILE")
    return p.parse_args(argv)


def resolve(path):
    return path if os.path.isabs(path) else os.path.join(REPO, path)


def steps_for(name):
    # About a second or more of timed steps per run, and few for the slow wide cnn.
    if name.startswith("cnn 420"):
        return ["--steps", "4", "--warmup", "2"]
    return ["--steps", "10", "--warmup", "3"]


def run(cmd):
    print(f"figures.py: {shlex.join(cmd)}", file=sys.stderr, flush=True)
    r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "2"})
    if r.returncode != 0:
        sys.exit(f"figures.py: {shlex.join(cmd)} failed ({r.returncode}): {r.stderr.strip()}")
    return r.stdout


def host(cli):
    model = "?"
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name:"):
                model = line.split(":", 1)[1].strip()
    except OSError:
        pass
    devices = run([cli, "devices"])
    cpu = next((line.split(":", 1)[1].strip() for line in devices.splitlines() if line.startswith("cpu:")), "?")
    # `mixprec devices` ends the line with where bf16 products compute, in brackets.
    if "AMX-BF16" in cpu:
        kind = "Intel, AMX-BF16"
    elif "AVX512-BF16" in cpu:
        kind = "AVX512-BF16 only, " + ("bf16 products in f32 where large" if "in f32" in cpu else "bf16 products native")
    else:
        kind = "other"
    # Both products leave libgomp's wait policy as the user's environment has it; it changes what
    # every parallel region costs (docs/design.md, Threads), the peer's more than mixprec's.
    policy = os.environ.get("OMP_WAIT_POLICY") or "unset (libgomp's default: spin, then sleep)"
    return {"model": model, "features": cpu, "kind": kind, "cores": os.cpu_count(), "wait_policy": policy}


def peak(cli):
    """bench/peak_probe's JSON line (the host's f32 and bf16 arithmetic ceilings), or None."""
    build = os.path.dirname(cli)
    probe = os.path.join(build, "peak_probe")
    if not os.path.exists(probe):  # built as compare.py builds its matmul probe
        cmd = ["cmake", "--build", build, "--target", "peak_probe"]
        print(f"figures.py: building the peak probe: {shlex.join(cmd)}", file=sys.stderr, flush=True)
        r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
        if r.returncode != 0 or not os.path.exists(probe):
            print(f"figures.py: {shlex.join(cmd)} failed: no peak columns", file=sys.stderr)
            return None
    return json.loads(run([probe]))


def profile(cli, name, flags, precision, repeats):
    best = None
    for _ in range(repeats):
        j = json.loads(run([cli, "bench", *flags, "--precision", precision, *steps_for(name), "--profile", "--json"]))
        if best is None or j["step_ms"]["best"] < best["step_ms"]["best"]:
            best = j
    return best


def compare(cli, flags):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "compare.json")
        steps = ["--steps", "4", "--warmup", "2", "--repeats", "3"] if "420,1000" in flags else \
            ["--steps", "10", "--warmup", "3", "--repeats", "3"]
        run([sys.executable, os.path.join(REPO, "bench", "compare.py"), "--mixprec", cli, *flags, *steps,
             "--json-out", out])
        with open(out) as f:
            return json.load(f)


def skips(tests):
    """The skipped tests of one run of the test binary, grouped by the reason each prints."""
    r = subprocess.run([tests], capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "2"})
    by_reason = collections.defaultdict(list)
    fallbacks = collections.defaultdict(list)  # kernels -> the op cases whose fast run used the reference
    current, reason, in_skip = None, [], False
    for line in r.stdout.splitlines():
        m = re.match(r"\[ NOTE     \] (\S+) (\S+): ran the reference on the fast backend \(compared with itself\): (.*)", line)
        if m:
            fallbacks[m.group(3)].append(f"{m.group(1)} {m.group(2)}")
            continue
        m = re.match(r"\[ RUN      \] (\S+)", line)
        if m:
            current, reason, in_skip = m.group(1), [], False
            continue
        if current and re.search(r": Skipped$", line):
            in_skip = True
            continue
        m = re.match(r"\[  SKIPPED \] (\S+)", line)
        if m and current == m.group(1):
            text = " ".join(reason).strip() or "(no reason given)"
            by_reason[text].append(current)
            current = None
            continue
        if in_skip and not line.startswith("["):
            reason.append(line.strip())
    return {"exit_code": r.returncode, "by_reason": dict(by_reason), "fallbacks": dict(fallbacks)}


def suite_name(test):
    """Ops/OpDevices.MatchTheCpu/x_fenced_f32 -> Ops/OpDevices.MatchTheCpu; CudaKernels.Fill -> CudaKernels.*"""
    parts = test.split(".")
    return parts[0] + ".*" if len(parts) == 2 and "/" not in test else test


def main(argv=None):
    a = parse_args(argv)
    cli = resolve(a.mixprec)
    names = [n for n, _ in SHAPES]
    wanted = a.models.split(",") if a.models else names
    for n in wanted:
        if n not in names:
            sys.exit(f"figures.py: --models: unknown '{n}' (known: {', '.join(names)})")
    h = host(cli)
    out = {"host": h, "peak": peak(cli), "profiles": {}, "compare": {}}
    for name, flags in SHAPES:
        if name not in wanted:
            continue
        out["profiles"][name] = {p: profile(cli, name, flags, p, a.repeats) for p in PRECISIONS}
        if a.pytorch:
            out["compare"][name] = compare(cli, flags)
    if a.skips:
        out["skips"] = skips(resolve(a.tests) if a.tests else os.path.join(os.path.dirname(cli), "mixprec_tests"))

    print(f"Host: {h['model']}, {h['cores']} cores; mixprec detects {h['features']} ({h['kind']}); "
          f"OMP_WAIT_POLICY {h['wait_policy']}.\n")
    pk = out["peak"]
    if pk:
        print(f"Arithmetic peak (bench/peak_probe, {pk['threads']} threads at once): f32 {pk['f32_gflops']:.0f} "
              f"GFLOP/s ({pk['f32_unit']}), bf16 {pk['bf16_gflops']:.0f} GFLOP/s ({pk['bf16_unit']}).\n")

    def peak_of(precision):
        return pk["f32_gflops" if precision == "fp32" else "bf16_gflops"] if pk else None

    # "Matrix kernels alone": the share the step would have if it were only its matrix kernels
    # (matmul, convolution, attention: the profile rows with a FLOP rate) at the rates they ran at
    # in the profile, the rest of the step taking no time: the ceiling on the share without faster
    # matrix kernels (oneDNN's, on the model's own shapes, or mixprec's attention).
    # "Of the peak": the step's FLOP rate over the host's arithmetic ceiling in its dtype (the matmul
    # rate's own share of it in brackets).
    print("| model | precision | GFLOP/step | step ms (best) | GFLOP/s | host matmul GFLOP/s | share "
          "| matrix kernels alone | of the peak (matmul's) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, by_p in out["profiles"].items():
        for p, j in by_p.items():
            pr = j["profile"]
            rows = [k for k in pr["kernels"] if "gflops" in k and k["ms"] > 0]
            ms = sum(k["ms"] for k in rows)
            alone = sum(k["gflops"] * k["ms"] for k in rows) / ms / pr["reference_gflops"] if ms else 0
            print(f"| {name} | {p} | {pr['gflop_per_step']:.2f} | {j['step_ms']['best']:.2f} | "
                  f"{pr['step_gflops']:.0f} | {pr['reference_gflops']:.0f} ({pr['reference_dtype']}) | "
                  f"{100 * pr['share_of_reference']:.0f}% | {100 * alone:.0f}% | " +
                  (f"{100 * pr['step_gflops'] / peak_of(p):.0f}% ({100 * pr['reference_gflops'] / peak_of(p):.0f}%) |"
                   if pk else " |"))
    print("\n| model | bf16/fp32 step | bf16/f32 matmul | share of it | oneDNN bf16 implementation |")
    print("|---|---:|---:|---:|---|")
    for name, by_p in out["profiles"].items():
        f32, bf16 = by_p["fp32"], by_p["amp-bf16"]
        step = f32["step_ms"]["best"] / bf16["step_ms"]["best"]
        mm = bf16["profile"]["reference_gflops"] / f32["profile"]["reference_gflops"]
        impls = sorted({k["impl"] for k in bf16["profile"]["kernels"] if k["impl"] and k["dtype"] == "bf16"})
        print(f"| {name} | {step:.2f}x | {mm:.2f}x | {100 * step / mm:.0f}% | {', '.join(impls)} |")
    for name, by_p in out["profiles"].items():
        pr = by_p["amp-bf16"]["profile"]
        print(f"\n{name}, amp-bf16, the slowest kernels (profiled step {pr['profiled_step_ms']:.2f} ms, "
              f"outside kernels {pr['outside_kernels_ms']:.2f} ms):\n")
        print("| phase | kernel | dtype | calls | ms/step | GFLOP/s | implementation |")
        print("|---|---|---|---:|---:|---:|---|")
        for k in pr["kernels"][:8]:
            rate = f"{k['gflops']:.0f}" if "gflops" in k else ""
            print(f"| {k['phase']} | {k['kernel']} | {k['dtype']} | {k['calls']:g} | {k['ms']:.3f} | {rate} | "
                  f"{k['impl']} |")
    if out["compare"]:
        print("\nAgainst PyTorch (bench/compare.py: each repeat's median step, pair-wise ratios, min / median / max):\n")
        print("| model | ratio | min | median | max |")
        print("|---|---|---:|---:|---:|")
        for name, c in out["compare"].items():
            for r in c["summary"]["ratios"]:
                print(f"| {name} | {r['name']} | {r['min']:.2f} | {r['median']:.2f} | {r['max']:.2f} |")
        if pk:
            # The fastest step the host's arithmetic allows is the step's FLOPs (counted from its matrix
            # ops, the profile's) at the peak; the peer's median step over it bounds any speed-up over
            # the peer here, whatever the kernels.
            print("\nThe most any step could be ahead of PyTorch here (PyTorch's median step over the step's FLOPs "
                  "at the arithmetic peak):\n")
            # And the share of the peak a whole step would need to be 1.3x and 1.5x ahead (issue 13's
            # targets on AVX512-BF16-only and AMX hosts): over 100%, no step can be.
            print("| model | precision | GFLOP/step | at the peak, ms | PyTorch median ms | at most | 1.3x needs | "
                  "1.5x needs |")
            print("|---|---|---:|---:|---:|---:|---:|---:|")
            for name, c in out["compare"].items():
                for row in c["summary"]["per_impl"]:
                    if row["impl"] != "pytorch":
                        continue
                    gflop = out["profiles"][name][row["precision"]]["profile"]["gflop_per_step"]
                    floor = 1000 * gflop / peak_of(row["precision"])
                    at_most = row["step_ms_median"] / floor
                    print(f"| {name} | {row['precision']} | {gflop:.2f} | {floor:.2f} | "
                          f"{row['step_ms_median']:.2f} | {at_most:.2f}x | {100 * 1.3 / at_most:.0f}% of the peak | "
                          f"{100 * 1.5 / at_most:.0f}% |")
    if a.skips:
        s = out["skips"]
        total = sum(len(v) for v in s["by_reason"].values())
        print(f"\nSkipped tests on this host: {total} (test binary exit code {s['exit_code']}):\n")
        for reason, tests in sorted(s["by_reason"].items(), key=lambda kv: -len(kv[1])):
            groups = sorted({suite_name(t) for t in tests})
            print(f"- {len(tests)}: {reason}\n  ({', '.join(groups)})")
        if s["fallbacks"]:
            print("\nOp cases whose fast run took the reference for some kernels (OpBackends' NOTE lines: "
                  "those kernels are compared with themselves):\n")
            for kernels, cases in sorted(s["fallbacks"].items()):
                print(f"- {kernels}: {', '.join(sorted(set(cases)))}")
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump(out, f, indent=1)
        print(f"\nwrote {a.json_out}", file=sys.stderr)


if __name__ == "__main__":
    main()
