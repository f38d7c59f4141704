#!/usr/bin/python3
"""A/B step time of two mixprec builds (a refactor's "speed unchanged"), interleaved.

For each repeat, for each configuration, runs `A bench ...` then `B bench ...` once each and
takes each run's median step time; reports per configuration the median of those over the
repeats and the ratio B/A computed pair by pair (same repeat), as min/median/max: runs close
in time are comparable on this shared machine, runs minutes apart are not. It also reports each
build's best step over all its runs and their ratio: where neighbours slow the host by the
minute (2026-12-07: pair-wise ratios from 0.6 to 1.6 for the same two binaries), the fastest
step either build ran is the figure least touched by them.

Usage (standard library only):
    python3 bench/ab.py OLD_BINARY NEW_BINARY [--repeats 5] [--steps 30] [--warmup 5]
        [--configs "mlp:fp32,mlp:amp-bf16,cnn:amp-bf16"] [--threads 2]

A configuration is NAME:PRECISION; NAME is a model (mlp, cnn, cnn-bn, gpt) or one of
bench/compare.py's other shapes: mlp256 (hidden 2048,512 at batch 256), mlp1024 (hidden
512,512,512 at batch 1024), cnn32 (channels 32,64 at batch 256), cnn-wide (420,1000 at batch 64).
"""

import argparse
import json
import statistics
import subprocess

# config name -> `mixprec bench`'s model and extra flags (the default recipes' batch sizes, and
# bench/compare.py's other shapes)
MODELS = {"mlp": ("mlp", ["--batch-size", "512"]), "cnn": ("cnn", ["--batch-size", "64"]),
          "mlp256": ("mlp", ["--hidden", "2048,512", "--batch-size", "256"]),
          "mlp1024": ("mlp", ["--hidden", "512,512,512", "--batch-size", "1024"]),
          "cnn-bn": ("cnn-bn", ["--batch-size", "128"]),
          "cnn32": ("cnn", ["--channels", "32,64", "--batch-size", "256"]),
          "cnn-wide": ("cnn", ["--channels", "420,1000", "--batch-size", "64"]), "gpt": ("gpt", [])}


def step_ms(binary, config, precision, a):
    model, flags = MODELS.get(config, (config, []))
    cmd = [binary, "bench", "--model", model, "--precision", precision, "--steps", str(a.steps),
           "--warmup", str(a.warmup), "--threads", str(a.threads)] + flags
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    ms = json.loads(out)["step_ms"]
    return ms["median"], ms["best"]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--configs", default="mlp:fp32,mlp:amp-bf16,cnn:fp32,cnn:amp-bf16")
    a = p.parse_args()
    configs = [tuple(c.split(":")) for c in a.configs.split(",")]
    times = {c: ([], []) for c in configs}
    for _ in range(a.repeats):
        for c in configs:
            times[c][0].append(step_ms(a.a, *c, a))
            times[c][1].append(step_ms(a.b, *c, a))
    print(f"A = {a.a}\nB = {a.b}\n{a.repeats} interleaved repeats, median step ms of {a.steps} steps each")
    print(f"{'config':<16} {'A ms':>8} {'B ms':>8}   B/A min / median / max   best A ms   best B ms   B/A")
    for c in configs:
        ta, tb = ([m for m, _ in runs] for runs in times[c])
        best_a, best_b = (min(b for _, b in runs) for runs in times[c])
        r = [y / x for x, y in zip(ta, tb)]
        print(f"{c[0] + ' ' + c[1]:<16} {statistics.median(ta):8.2f} {statistics.median(tb):8.2f}   "
              f"{min(r):.3f} / {statistics.median(r):.3f} / {max(r):.3f}   "
              f"{best_a:9.2f}   {best_b:9.2f}   {best_b / best_a:.3f}")


if __name__ == "__main__":
    main()
