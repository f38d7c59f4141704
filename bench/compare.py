#!/usr/bin/python3
"""Compare `mixprec bench` with the PyTorch peer (bench/peers/torch_bench.py).

Runs both implementations for each precision, interleaved:
    for r in range(repeats): for precision: for impl: run once
and takes each run's median step time as that run's figure. Per impl and precision
it reports the min and median of those figures over the repeats, and the ratios
    mixprec <p> vs mixprec fp32, pytorch <p> vs pytorch fp32   (speedup of <p>)
    mixprec vs pytorch at each precision                       (times faster)
computed pair-wise within each repeat (same repeat index) and summarised as
min/median/max, because this shared machine's throughput (AMX especially) drifts up to
2x from minute to minute: runs close in time are comparable, runs minutes apart are not.

The peer runs with glibc's malloc keeping freed memory for reuse (--torch-malloc; peer_malloc
below): with glibc's defaults its step pays page faults that a caching allocator does not.

For the mlp and gpt it also runs bench/matmul_probe.cpp once per repeat on the model's Linear
shapes (gpt: a block's four, C x 3C, C x C, C x 4C, 4C x C, at batch x block tokens; the head's C x V,
about 1% of the FLOPs, is left out): oneDNN's own bf16 over f32 matmul speed-up, and mixprec's
amp-bf16 speed-up as a share of it, pair-wise per repeat. The probe is
built next to the mixprec CLI (`cmake --build build --target matmul_probe`) when it is missing.

Usage (from anywhere; standard library only, torch is only needed by the peer):
    /usr/bin/python3 bench/compare.py --model mlp --batch-size 512 --steps 30 --warmup 5
    /usr/bin/python3 bench/compare.py --model cnn --channels 420,1000 --batch-size 64 \\
        --steps 10 --warmup 3 --repeats 3 --json-out /tmp/cnn.json
    /usr/bin/python3 bench/compare.py --model gpt --steps 20 --warmup 3 --repeats 5
"""

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEER = os.path.join(REPO, "bench", "peers", "torch_bench.py")
TORCH_PRECISIONS = ("fp32", "amp-bf16")
PROBE = "onednn"  # the probe's impl name in the runs


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mixprec", default="build/mixprec",
                   help="mixprec CLI (relative paths are relative to the repo root)")
    p.add_argument("--python", default="/usr/bin/python3",
                   help="interpreter with torch for the peer (default /usr/bin/python3)")
    p.add_argument("--impls", default="mixprec,pytorch",
                   help="which implementations to run (default mixprec,pytorch)")
    p.add_argument("--model", choices=("mlp", "cnn", "cnn-bn", "gpt"), default="mlp")
    p.add_argument("--hidden", default="1024,1024")
    p.add_argument("--channels", default="8,16")
    p.add_argument("--layers", type=int, default=4, help="gpt")
    p.add_argument("--heads", type=int, default=4, help="gpt")
    p.add_argument("--d-model", type=int, default=128, help="gpt")
    p.add_argument("--block-size", type=int, default=128, help="gpt")
    p.add_argument("--batch-size", type=int, default=None, help="default 512 (gpt: 32)")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--precisions", default="fp32,amp-bf16")
    p.add_argument("--optimizer", choices=("sgd", "adamw"), default=None,
                   help="default sgd; gpt: not passed (both run the recipe's adamw)")
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--torch-linear", choices=("native", "onednn"), default="native",
                   help="peer's nn.Linear path: native (Debian torch: netlib BLAS in fp32) "
                        "or onednn (fp32 Linear as a oneDNN 1x1 conv); see bench/peers/models.py")
    p.add_argument("--torch-malloc", choices=("glibc-tuned", "glibc", "jemalloc"), default="glibc-tuned",
                   help="the peer's heap (see peer_malloc): glibc-tuned (default) keeps freed memory "
                        "for reuse; glibc = glibc's defaults (page faults every step); jemalloc = "
                        "LD_PRELOAD of libjemalloc2")
    p.add_argument("--probe", default=None,
                   help="oneDNN matmul probe (default: matmul_probe next to --mixprec, built if missing)")
    p.add_argument("--probe-reps", type=int, default=10, help="timed reps per probe run (default 10)")
    p.add_argument("--no-probe", action="store_true", help="skip oneDNN's matmul probe")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per run")
    p.add_argument("--json-out", metavar="FILE", help="write raw results + summary here")
    a = p.parse_args(argv)
    a.precisions = [s for s in a.precisions.replace(" ", "").split(",") if s]
    a.impls = [s for s in a.impls.replace(" ", "").split(",") if s]
    bad = [i for i in a.impls if i not in ("mixprec", "pytorch")]
    if bad or not a.impls:
        p.error(f"--impls: unknown {bad}; expected mixprec and/or pytorch")
    if not a.precisions:
        p.error("--precisions is empty")
    if a.repeats < 1:
        p.error("--repeats must be >= 1")
    if not os.path.isabs(a.mixprec):
        a.mixprec = os.path.join(REPO, a.mixprec)
    if a.batch_size is None:
        a.batch_size = 32 if a.model == "gpt" else 512
    if a.optimizer is None and a.model != "gpt":
        a.optimizer = "sgd"
    if a.probe is None:
        a.probe = os.path.join(os.path.dirname(a.mixprec), "matmul_probe")
    elif not os.path.isabs(a.probe):
        a.probe = os.path.join(REPO, a.probe)
    a.probe_layers = None if a.no_probe else probe_layers(a)
    return a


def probe_layers(a):
    """The model's Linear layers as the probe's (batch, "INxOUT,...") or None (cnn: convolutions)."""
    if a.model == "gpt":
        c = a.d_model
        # A block's Linears in its order: qkv, the attention's output projection, the MLP's two.
        return a.batch_size * a.block_size, f"{c}x{3 * c},{c}x{c},{c}x{4 * c},{4 * c}x{c}"
    if a.model == "mlp":
        widths = [784] + [int(w) for w in a.hidden.split(",") if w] + [10]
        return a.batch_size, ",".join(f"{i}x{o}" for i, o in zip(widths, widths[1:]))
    return None


def common_flags(a, precision):
    f = ["--model", a.model]
    if a.model == "mlp":
        f += ["--hidden", a.hidden]
    if a.model == "cnn":
        f += ["--channels", a.channels]
    if a.model == "gpt":
        f += ["--layers", str(a.layers), "--heads", str(a.heads), "--d-model", str(a.d_model),
              "--block-size", str(a.block_size)]
    f += ["--precision", precision, "--batch-size", str(a.batch_size),
          "--steps", str(a.steps), "--warmup", str(a.warmup), "--threads", str(a.threads)]
    if a.optimizer is not None:
        f += ["--optimizer", a.optimizer]
    if a.lr is not None:
        f += ["--lr", repr(a.lr)]
    return f


# The peer's heap. PyTorch's CPU allocator is malloc, and with glibc's defaults every tensor of a
# few MiB is a fresh mmap whose pages fault in on first touch and go back to the kernel on free,
# where mixprec's caching allocator keeps its blocks. On the AMD Zen 5 host of 2026-11-28 (a
# guest where a page fault is expensive) that made PyTorch's steps 2-5x slower: mlp 256 with
# 2048/512 amp-bf16 43.3 -> 8.4 ms best, gpt fp32 528 -> 256 ms, cnn 32/64 amp-bf16 74 -> 44 ms
# with glibc's mmap and trim thresholds raised (GLIBC_TUNABLES: the heap keeps and reuses what is
# freed), the default here. jemalloc (Debian's libjemalloc2, LD_PRELOAD; PyTorch's CPU tuning
# guide names it) was faster than the defaults on the mlp but slower on the gpt (1309 ms) and the
# cnn (294 ms) on that host, its freed pages purged and faulted in again: --torch-malloc jemalloc
# where it is installed; --torch-malloc glibc runs glibc's defaults.
JEMALLOC = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
GLIBC_TUNED = "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=4294967296"


def peer_malloc(a):
    """(name, environment additions) of the peer's heap for --torch-malloc."""
    if a.torch_malloc == "jemalloc":
        if not os.path.isfile(JEMALLOC):
            raise RunError(f"--torch-malloc jemalloc: {JEMALLOC} is missing (apt-get install libjemalloc2)")
        return a.torch_malloc, {"LD_PRELOAD": JEMALLOC}
    if a.torch_malloc == "glibc-tuned":
        return a.torch_malloc, {"GLIBC_TUNABLES": GLIBC_TUNED}
    return a.torch_malloc, {}


def command(a, impl, precision):
    if impl == "mixprec":
        return [a.mixprec, "bench"] + common_flags(a, precision)
    cmd = [a.python, PEER] + common_flags(a, precision)
    if a.torch_linear != "native":
        cmd += ["--linear", a.torch_linear]
    return cmd


def parse_result(stdout):
    """The last stdout line that parses as a JSON object with "steps_per_s"."""
    for line in reversed(stdout.splitlines()):
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict) and "steps_per_s" in obj:
            return obj
    return None


class RunError(Exception):
    pass


def run_command(cmd, label, timeout, env=None):
    """Runs one bench command (env: additions to the environment); its JSON result, or RunError
    saying what failed and how."""
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True,
                              timeout=timeout, env=dict(os.environ, **(env or {})))
    except OSError as e:
        raise RunError(f"cannot run {shlex.join(cmd)}: {e}") from e
    except subprocess.TimeoutExpired as e:
        raise RunError(f"timed out after {timeout:.0f} s: {shlex.join(cmd)}") from e
    wall = time.perf_counter() - t0
    res = parse_result(proc.stdout)
    if proc.returncode != 0 or res is None:
        tail = "\n".join((proc.stderr or proc.stdout or "").strip().splitlines()[-15:])
        why = (f"exit status {proc.returncode}" if proc.returncode != 0
               else "no JSON line with \"steps_per_s\" on stdout")
        raise RunError(f"{label} failed ({why}): {shlex.join(cmd)}\n{tail}")
    try:
        float(res["step_ms"]["median"])
    except (KeyError, TypeError, ValueError) as e:
        raise RunError(f"{label}: result has no step_ms.median: {res}") from e
    return {"cmd": cmd, "wall_s": wall, "result": res}


def run_once(a, impl, precision):
    if impl == PROBE:
        return run_probe(a)
    env = peer_malloc(a)[1] if impl == "pytorch" else None
    return run_command(command(a, impl, precision), f"{impl} {precision}", a.timeout, env)


def ensure_probe(a):
    """Builds the probe in the mixprec CLI's build directory when it is not there."""
    if os.path.isfile(a.probe) and os.access(a.probe, os.X_OK):
        return
    build = os.path.dirname(a.probe)
    cmd = ["cmake", "--build", build, "--target", "matmul_probe"]
    print(f"compare.py: building the probe: {shlex.join(cmd)}", file=sys.stderr, flush=True)
    try:
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=a.timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise RunError(f"cannot build the probe: {shlex.join(cmd)}: {e}") from e
    if proc.returncode != 0 or not os.path.isfile(a.probe):
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise RunError(f"building the probe failed: {shlex.join(cmd)} (or pass --probe PATH, "
                       f"--no-probe)\n{tail}")


def probe_has_bf16(a):
    """False where the probe says oneDNN has no bf16 matmul here (exit status 3, at once)."""
    try:
        proc = subprocess.run([a.probe, "1", "1", "1x1"], cwd=REPO, capture_output=True, text=True,
                              timeout=a.timeout)
    except (OSError, subprocess.TimeoutExpired):
        return True  # the real runs report the failure
    return proc.returncode != 3


PROBE_LINE = re.compile(r"^(?P<label>.*?)\s+(?P<dtype>f32|bf16|bf16->f32)\s+[\d.]+\s+[\d.]+\s+"
                        r"(?P<ms>[\d.]+)\s+\S+\s*$")


def parse_probe(stdout):
    """The probe's table -> {"isa", "products": [{label, f32, bf16, bf16->f32 ms}], and the sums
    f32_ms, bf16_ms (every product in bf16) and train_ms (forward and grad_x in bf16, the weight
    gradient bf16 -> f32: the dtypes of an amp-bf16 Linear's three products)}."""
    lines = stdout.splitlines()
    products, cur = [], None
    for line in lines:
        m = PROBE_LINE.match(line)
        if not m:
            continue
        if m["dtype"] == "f32":
            cur = {"label": m["label"].strip()}
            products.append(cur)
        if cur is not None:
            cur[m["dtype"]] = float(m["ms"])
    if not products or any(len(p) != 4 for p in products):
        return None
    f32 = sum(p["f32"] for p in products)
    bf16 = sum(p["bf16"] for p in products)
    train = sum(p["bf16->f32" if "gW" in p["label"] else "bf16"] for p in products)
    return {"isa": lines[0] if lines else "", "products": products, "f32_ms": f32, "bf16_ms": bf16,
            "train_ms": train, "speedup_train": f32 / train, "speedup_bf16": f32 / bf16}


def run_probe(a):
    batch, layers = a.probe_layers
    cmd = [a.probe, str(a.probe_reps), str(batch), layers]
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=a.timeout, env=env)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise RunError(f"probe failed: {shlex.join(cmd)}: {e}") from e
    res = parse_probe(proc.stdout) if proc.returncode == 0 else None
    if res is None:
        tail = "\n".join((proc.stderr or proc.stdout or "").strip().splitlines()[-15:])
        raise RunError(f"probe failed (exit status {proc.returncode}, or no table): "
                       f"{shlex.join(cmd)}\n{tail}")
    # In the shape of a bench result so the table and the ratios treat it alike: the "step" is
    # the sum of the products' median times.
    res["step_ms"] = {"median": res["train_ms"], "best": res["train_ms"]}
    return {"cmd": cmd, "wall_s": time.perf_counter() - t0, "result": res}


def stats(xs):
    xs = [x for x in xs if x is not None]
    if not xs:
        return None
    return {"min": min(xs), "median": statistics.median(xs), "max": max(xs), "n": len(xs)}


def summarise(a, runs):
    """runs: list of {"repeat", "impl", "precision", "result", ...}."""
    ms = {}  # (impl, precision) -> {repeat: median step ms}
    for r in runs:
        if r["impl"] == PROBE:  # one run gives both: f32 and amp-bf16's dtypes
            ms.setdefault((PROBE, "fp32"), {})[r["repeat"]] = r["result"]["f32_ms"]
            ms.setdefault((PROBE, "amp-bf16"), {})[r["repeat"]] = r["result"]["train_ms"]
            continue
        ms.setdefault((r["impl"], r["precision"]), {})[r["repeat"]] = \
            float(r["result"]["step_ms"]["median"])

    per = []
    for (impl, prec), by_rep in ms.items():
        s = stats(list(by_rep.values()))
        per.append({"impl": impl, "precision": prec, "step_ms_min": s["min"],
                    "step_ms_median": s["median"], "step_ms_max": s["max"],
                    "samples_per_s_best": 1000.0 * a.batch_size / s["min"],
                    "samples_per_s_median": 1000.0 * a.batch_size / s["median"],
                    "repeats": s["n"]})

    def ratio(name, slow_key, fast_key):
        """Pair-wise slow_ms / fast_ms per repeat: > 1 means fast_key is faster."""
        slow, fast = ms.get(slow_key), ms.get(fast_key)
        if not slow or not fast:
            return None
        vals = [slow[r] / fast[r] for r in sorted(slow) if r in fast and fast[r] > 0]
        s = stats(vals)
        if s is None:
            return None
        return {"name": name, "numerator": list(slow_key), "denominator": list(fast_key),
                "per_repeat": vals, **s}

    ratios = []
    for impl in a.impls + ([PROBE] if (PROBE, "fp32") in ms else []):
        for p in a.precisions:
            if p != "fp32" and "fp32" in a.precisions:
                ratios.append(ratio(f"{impl} {p} speedup over {impl} fp32",
                                    (impl, "fp32"), (impl, p)))
    share = share_of_probe(ms)
    if share is not None:
        ratios.append(share)
    # mixprec (and torch_gpu.py's mixprec-graph: --cuda-graph) against each peer (torch_gpu.py has
    # two: pytorch-eager, pytorch-compile).
    ours = [i for i in a.impls if i.startswith("mixprec")]
    for mine in ours:
        for peer in [i for i in a.impls if i not in ours]:
            for p in a.precisions:
                ratios.append(ratio(f"{mine} {p} vs {peer} {p} (x faster)",
                                    (peer, p), (mine, p)))
    return {"per_impl": per, "ratios": [r for r in ratios if r is not None]}


def share_of_probe(ms):
    """mixprec's amp-bf16 speed-up over fp32 as a share of oneDNN's matmul speed-up, per repeat."""
    keys = [("mixprec", "fp32"), ("mixprec", "amp-bf16"), (PROBE, "fp32"), (PROBE, "amp-bf16")]
    if any(k not in ms for k in keys):
        return None
    m32, m16, o32, o16 = (ms[k] for k in keys)
    vals = [(m32[r] / m16[r]) / (o32[r] / o16[r]) for r in sorted(m32)
            if r in m16 and r in o32 and r in o16]
    s = stats(vals)
    return None if s is None else {
        "name": "mixprec amp-bf16 speedup / onednn matmul speedup", "per_repeat": vals, **s}


def load_average():
    try:
        return os.getloadavg()[0]
    except OSError:
        return float("nan")


def print_table(a, summary):
    print()
    policy = os.environ.get("OMP_WAIT_POLICY", "(libgomp default)")
    print(f"OMP_WAIT_POLICY={policy}  load average (1 min) before {a.load_before:.2f}, "
          f"after {a.load_after:.2f}  (the machine has {os.cpu_count()} cores)")
    print(f"model={a.model}" + (f" hidden={a.hidden}" if a.model == "mlp" else "")
          + (f" channels={a.channels}" if a.model == "cnn" else "")
          + (f" layers={a.layers} heads={a.heads} d-model={a.d_model} block={a.block_size}"
             if a.model == "gpt" else "")
          + f" batch={a.batch_size} threads={a.threads} steps={a.steps} warmup={a.warmup}"
          f" optimizer={a.optimizer or 'recipe'} repeats={a.repeats}"
          + (f" torch-linear={a.torch_linear}" if a.torch_linear != "native" else "")
          + (f" torch-malloc={peer_malloc(a)[0]}" if "pytorch" in a.impls else ""))
    print("step time = each run's median step; min / median over repeats")
    hdr = f"{'impl':<8} {'precision':<10} {'ms min':>9} {'ms median':>10} " \
          f"{'ms max':>9} {'samples/s (med)':>16}"
    print(hdr)
    print("-" * len(hdr))
    for row in summary["per_impl"]:
        if row["impl"] == PROBE:
            continue
        print(f"{row['impl']:<8} {row['precision']:<10} {row['step_ms_min']:9.2f} "
              f"{row['step_ms_median']:10.2f} {row['step_ms_max']:9.2f} "
              f"{row['samples_per_s_median']:16.0f}")
    probe_rows = [r for r in summary["per_impl"] if r["impl"] == PROBE]
    if probe_rows:
        batch, layers = a.probe_layers
        print(f"\n{PROBE} matmuls (bench/matmul_probe.cpp, batch {batch}, layers {layers}: the sum of "
              f"each product's median;\n  amp-bf16 = forward and input gradient in bf16, weight "
              f"gradient bf16 -> f32)")
        for row in probe_rows:
            print(f"{PROBE:<8} {row['precision']:<10} {row['step_ms_min']:9.2f} "
                  f"{row['step_ms_median']:10.2f} {row['step_ms_max']:9.2f}")
    if summary["ratios"]:
        print()
        print("ratios, pair-wise per repeat (> 1: the first named is faster)")
        w = max(len(r["name"]) for r in summary["ratios"])
        print(f"{'':<{w}} {'min':>7} {'median':>7} {'max':>7}")
        for r in summary["ratios"]:
            print(f"{r['name']:<{w}} {r['min']:7.2f} {r['median']:7.2f} {r['max']:7.2f}")


def main(argv=None):
    a = parse_args(argv)
    if "mixprec" in a.impls and not (os.path.isfile(a.mixprec)
                                     and os.access(a.mixprec, os.X_OK)):
        print(f"compare.py: mixprec CLI not found or not executable: {a.mixprec}\n"
              f"  build it first (cmake --build build) or pass --mixprec PATH",
              file=sys.stderr)
        return 2
    if "pytorch" in a.impls and not os.access(a.python, os.X_OK):
        print(f"compare.py: peer interpreter not found: {a.python} (pass --python)",
              file=sys.stderr)
        return 2

    jobs = []
    for p in a.precisions:
        for impl in a.impls:
            if impl == "pytorch" and p not in TORCH_PRECISIONS:
                print(f"compare.py: note: the PyTorch peer has no {p}; skipping it",
                      file=sys.stderr)
                continue
            jobs.append((impl, p))

    if a.probe_layers is not None and "amp-bf16" in a.precisions and "fp32" in a.precisions:
        try:
            ensure_probe(a)
        except RunError as e:
            print(f"compare.py: {e}", file=sys.stderr)
            return 2
        if probe_has_bf16(a):
            jobs.append((PROBE, "fp32,amp-bf16"))
        else:
            print("compare.py: oneDNN has no bf16 matmul on this host (an AVX2 CPU): no oneDNN ratio to "
                  "compare with", file=sys.stderr)
            a.probe_layers = None
    else:
        a.probe_layers = None

    runs = []
    failed = None
    a.load_before = load_average()
    for rep in range(a.repeats):
        for impl, p in jobs:
            try:
                out = run_once(a, impl, p)
            except RunError as e:
                failed = str(e)
                break
            runs.append({"repeat": rep, "impl": impl, "precision": p, **out})
            res = out["result"]
            if impl == PROBE:
                print(f"[{rep + 1}/{a.repeats}] {impl:<8} matmuls f32 {res['f32_ms']:.2f} ms, "
                      f"amp-bf16 dtypes {res['train_ms']:.2f} ms ({res['speedup_train']:.2f}x), "
                      f"all bf16 {res['bf16_ms']:.2f} ms ({res['speedup_bf16']:.2f}x)  "
                      f"({out['wall_s']:.0f} s)", flush=True)
                continue
            print(f"[{rep + 1}/{a.repeats}] {impl:<8} {p:<9} "
                  f"step_ms median {float(res['step_ms']['median']):8.2f}  "
                  f"best {float(res['step_ms']['best']):8.2f}  ({out['wall_s']:.0f} s)",
                  flush=True)
        if failed:
            break

    if failed:
        print(f"compare.py: {failed}", file=sys.stderr)
    a.load_after = load_average()
    summary = summarise(a, runs) if runs else {"per_impl": [], "ratios": []}
    if runs:
        print_table(a, summary)
    if a.json_out:
        cfg = {k: v for k, v in vars(a).items() if k != "json_out"}
        cfg["torch_malloc"] = peer_malloc(a)[0]
        with open(a.json_out, "w") as f:
            json.dump({"config": cfg, "complete": failed is None, "error": failed,
                       "runs": runs, "summary": summary}, f, indent=1)
        print(f"\nwrote {a.json_out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
