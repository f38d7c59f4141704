#!/usr/bin/python3
"""Test accuracy of `mixprec train` per model, precision preset and seed, as a table.

Runs `mixprec train --model M --precision P --seed S [extra flags]` for every combination
(one at a time: accuracy does not depend on the machine's load, only the wall time does),
reads the final epoch's test accuracy from its --metrics file, and prints one markdown
table per model: accuracy per seed, the mean, and the difference from fp32 with the same
seed (same initial weights and batch order, so a pair differs only by precision).

Usage (from anywhere; standard library only):
    python3 bench/accuracy.py --models mlp,cnn --seeds 0,1,2
    python3 bench/accuracy.py --models cnn --precisions fp32,amp-bf16 --seeds 0 -- --epochs 2
Flags after `--` go to every `mixprec train` run. Exit status 1 if any run fails.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ALL_PRESETS = "fp32,amp-bf16,amp-fp16,half-bf16,half-fp16,pure-bf16,pure-fp16"


def parse_args(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    extra = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mixprec", default="build/mixprec",
                   help="mixprec CLI (relative paths are relative to the repo root)")
    p.add_argument("--models", default="mlp,cnn")
    p.add_argument("--precisions", default=ALL_PRESETS)
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--json-out", metavar="FILE", help="write every run's result here")
    a = p.parse_args(argv)
    a.extra = extra
    a.models = [s for s in a.models.split(",") if s]
    a.precisions = [s for s in a.precisions.split(",") if s]
    a.seeds = [int(s) for s in a.seeds.split(",") if s]
    if not os.path.isabs(a.mixprec):
        a.mixprec = os.path.join(REPO, a.mixprec)
    return a


def run_one(a, model, precision, seed, tmp):
    metrics = os.path.join(tmp, f"{model}_{precision}_{seed}.jsonl")
    cmd = [a.mixprec, "train", "--model", model, "--precision", precision,
           "--seed", str(seed), "--metrics", metrics, "--log-every", "1000000"] + a.extra
    t0 = time.time()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    secs = time.time() - t0
    if proc.returncode != 0:
        tail = proc.stdout.strip().splitlines()[-1:] or ["(no output)"]
        print(f"FAILED: {' '.join(cmd)}: {tail[0]}", file=sys.stderr)
        return None
    acc, skipped = None, 0
    with open(metrics) as f:
        for line in f:
            e = json.loads(line)
            if e.get("event") == "epoch":
                acc = 100.0 * e["test_accuracy"]
            elif e.get("event") == "summary":
                skipped = e.get("skipped_steps", 0)
    print(f"{model:6s} {precision:10s} seed {seed}: {acc:.2f}%  ({secs:.0f} s"
          f"{f', {skipped} skipped steps' if skipped else ''})", file=sys.stderr, flush=True)
    return {"model": model, "precision": precision, "seed": seed, "test_accuracy": acc,
            "skipped_steps": skipped, "seconds": secs, "command": " ".join(cmd)}


def table(model, results, precisions, seeds):
    acc = {(r["precision"], r["seed"]): r["test_accuracy"] for r in results if r["model"] == model}
    head = ["`" + model + "`"] + [f"seed {s}" for s in seeds] + ["mean"]
    has_ref = "fp32" in precisions and len(precisions) > 1
    if has_ref:
        head += ["mean - fp32", "per seed - fp32"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for p in precisions:
        vals = [acc.get((p, s)) for s in seeds]
        got = [v for v in vals if v is not None]
        row = [f"`{p}`"] + [f"{v:.2f}" if v is not None else "failed" for v in vals]
        row.append(f"{statistics.mean(got):.2f}" if got else "-")
        if has_ref:
            if p == "fp32":
                row += ["", ""]
            else:
                diffs = [(v - acc[("fp32", s)]) if v is not None and ("fp32", s) in acc else None
                         for v, s in zip(vals, seeds)]
                d = [x for x in diffs if x is not None]
                row.append(f"{statistics.mean(d):+.2f}" if d else "-")
                row.append(" / ".join(f"{x:+.2f}" if x is not None else "-" for x in diffs))
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def main():
    a = parse_args()
    if not os.access(a.mixprec, os.X_OK):
        sys.exit(f"accuracy.py: {a.mixprec} not found: build first (scripts/dev.sh build)")
    results, failed = [], False
    with tempfile.TemporaryDirectory(prefix="mixprec-acc-") as tmp:
        for model in a.models:
            for seed in a.seeds:
                for p in a.precisions:
                    r = run_one(a, model, p, seed, tmp)
                    failed = failed or r is None
                    if r is not None:
                        results.append(r)
    flags = " ".join(a.extra) if a.extra else "(defaults)"
    print(f"final-epoch test accuracy (%), mixprec train {flags}\n")
    for model in a.models:
        print(table(model, results, a.precisions, a.seeds) + "\n")
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump(results, f, indent=1)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
