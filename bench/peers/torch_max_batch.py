#!/usr/bin/env python3
"""PyTorch's largest batch under a GPU memory limit: the peer of `mixprec max-batch --device cuda`.

The seeds' experiment (how much larger a batch fits in the same GPU memory with 16-bit training)
with PyTorch at its best: for each precision, the largest batch whose whole training step (forward,
backward, fused AdamW, GradScaler for fp16) runs under `torch.cuda.set_per_process_memory_fraction`
(PyTorch's caching allocator refuses to reserve past it, as mixprec's budget counts reserved
bytes), found as mixprec finds it (src/core/memory_budget.cpp): batches 1, 2, 4, ... until one
fails, then bisection; each size stepped until its memory stops growing (the optimizer's state
appears at the first step). `cudnn.benchmark` on (its trials respect the limit too).

Precisions (mixprec's presets, docs/API.md): fp32; amp-bf16 and amp-fp16 (autocast, f32 weights;
fp16 with GradScaler); half-bf16 (the model in bf16, f32 master weights and AdamW state in the
optimizer, Apex O2's way: PyTorch has no such mode, so this script keeps the masters itself).

Usage (on the GPU machine):
    python3 bench/peers/torch_max_batch.py --memory-limit 3GiB --channels 420,1000 --json
    python3 bench/peers/torch_max_batch.py --self-test      # the search alone, no torch needed
"""

import argparse
import gc
import json
import os
import re
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from recipes import ADAMW_LR  # noqa: E402  (the CLI's AdamW learning rates)

PRECISIONS = ("fp32", "amp-bf16", "amp-fp16", "half-bf16")
MAX_RUNS_PER_SIZE = 3  # as kMaxRunsPerSize in src/core/memory_budget.cpp


def parse_size(text):
    """'3GiB', '512MiB', '1.5GB', '1000000' -> bytes (mixprec's --memory-limit units)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMGT]?i?B)?\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"'{text}' is no size (bytes, or with a unit: 1GiB, 512MiB, 1.5GB)")
    unit = (m.group(2) or "B").upper()
    scale = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
             "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}[unit]
    n = int(float(m.group(1)) * scale)
    if n <= 0:
        raise argparse.ArgumentTypeError(f"'{text}': the limit must be > 0 bytes")
    return n


def find_largest_batch(fits, max_batch):
    """fits(b) -> bool. Doubling from 1 (capped at max_batch), then bisection between the last
    batch that fit and the first that did not. Returns (batch, attempts, smallest_failed); batch 0
    when not even 1 fits; smallest_failed 0 when max_batch fit."""
    lo = hi = attempts = 0
    b = 1
    while True:
        attempts += 1
        if not fits(b):
            hi = b
            break
        lo = b
        if b == max_batch:
            break
        b = min(b * 2, max_batch)
    while hi - lo > 1:
        mid = lo + (hi - lo) // 2
        attempts += 1
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo, attempts, hi


class Trainer:
    """One model, optimizer and scaler per precision, stepped at any batch size."""

    def __init__(self, a, precision):
        import torch
        import models
        self.torch, self.precision = torch, precision
        torch.manual_seed(a.seed)
        kw = {"hidden": a.hidden} if a.model == "mlp" else {"channels": a.channels}
        self.model = models.build(a.model, **kw).cuda().train()
        self.amp_dtype = {"amp-bf16": torch.bfloat16, "amp-fp16": torch.float16}.get(precision)
        self.masters = None
        if precision == "half-bf16":
            self.model = self.model.to(torch.bfloat16)
            self.masters = [p.detach().float().requires_grad_() for p in self.model.parameters()]
            params = self.masters
        else:
            params = list(self.model.parameters())
        self.opt = torch.optim.AdamW(params, lr=ADAMW_LR[a.model], weight_decay=0.0, fused=True)
        self.scaler = torch.amp.GradScaler("cuda") if precision == "amp-fp16" else None
        self.input_dtype = torch.bfloat16 if precision == "half-bf16" else torch.float32

    def step(self, b):
        torch = self.torch
        F = torch.nn.functional
        x = torch.randn(b, 1, 28, 28, device="cuda", dtype=self.input_dtype)
        y = torch.randint(0, 10, (b,), device="cuda")
        self.opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=self.amp_dtype or torch.bfloat16, enabled=self.amp_dtype is not None):
            loss = F.cross_entropy(self.model(x).float(), y)
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            self.scaler.step(self.opt)
            self.scaler.update()
        else:
            loss.backward()
            if self.masters is not None:  # bf16 gradients into the f32 masters, the step, back to bf16
                for m, p in zip(self.masters, self.model.parameters()):
                    m.grad = p.grad.float()
                    p.grad = None
            self.opt.step()
            if self.masters is not None:
                with torch.no_grad():
                    for m, p in zip(self.masters, self.model.parameters()):
                        p.copy_(m)
                for m in self.masters:
                    m.grad = None
        torch.cuda.synchronize()

    def fits(self, b, record):
        """Steps batch b until the allocated memory stops growing; False on out-of-memory."""
        torch = self.torch
        for _ in range(MAX_RUNS_PER_SIZE):
            before = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            try:
                self.step(b)
            except torch.cuda.OutOfMemoryError:
                self.opt.zero_grad(set_to_none=True)
                if self.masters is not None:
                    for p in self.model.parameters():
                        p.grad = None
                gc.collect()
                torch.cuda.empty_cache()  # what a failed step reserved goes, as mixprec's cache is freed
                return False
            record[b] = {"max_memory_allocated": torch.cuda.max_memory_allocated(),
                         "max_memory_reserved": torch.cuda.max_memory_reserved()}
            if torch.cuda.memory_allocated() <= before:
                break
        return True


def run(a):
    import torch
    if not torch.cuda.is_available():
        print("torch_max_batch.py: torch sees no GPU (torch.cuda.is_available() is False): the limit is a GPU's",
              file=sys.stderr)
        return 2
    torch.backends.cudnn.benchmark = True
    try:
        torch.backends.cuda.matmul.fp32_precision = "ieee"
        torch.backends.cudnn.conv.fp32_precision = "ieee"
    except (AttributeError, RuntimeError):
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    total = torch.cuda.get_device_properties(0).total_memory
    if a.memory_limit > total:
        print(f"torch_max_batch.py: --memory-limit {a.memory_limit} bytes is more than the GPU's {total}",
              file=sys.stderr)
        return 2
    torch.cuda.set_per_process_memory_fraction(a.memory_limit / total)
    out = {"memory_limit_bytes": a.memory_limit, "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
           "model": a.model, "widths": a.hidden if a.model == "mlp" else a.channels, "baseline": a.precisions[0],
           "precisions": []}
    for prec in a.precisions:
        t0 = time.perf_counter()
        gc.collect()
        torch.cuda.empty_cache()
        trainer = Trainer(a, prec)
        record = {}
        batch, attempts, failed = find_largest_batch(lambda b: trainer.fits(b, record), a.max_batch)
        row = {"precision": prec, "batch": batch, "smallest_failed": failed, "attempts": attempts,
               "seconds": round(time.perf_counter() - t0, 1)}
        row.update(record.get(batch, {}))
        out["precisions"].append(row)
        print(f"torch_max_batch.py: {prec}: batch {batch} ({attempts} attempts, {row['seconds']} s)", file=sys.stderr,
              flush=True)
        trainer = None  # its model and optimizer go before the next precision's
    base = out["precisions"][0]["batch"]
    for row in out["precisions"]:
        row["ratio"] = row["batch"] / base if base else None
    if a.json:
        print(json.dumps(out))
    else:
        print(f"{out['device']}, torch {out['torch']}, limit {a.memory_limit / 2**30:.2f} GiB, {a.model} {out['widths']}")
        for row in out["precisions"]:
            ratio = f"{row['ratio']:.2f}x" if row["ratio"] is not None else "-"
            peak = row.get("max_memory_reserved")
            print(f"{row['precision']:<10} batch {row['batch']:>6}  {ratio:>7}  reserved peak "
                  f"{peak / 2**20 if peak else 0:9.1f} MiB")
    return 0


def self_test():
    """The search against a step that fits up to a known batch (no torch, no GPU)."""
    for limit, cap in ((37, 4096), (1, 8), (0, 8), (5000, 4096), (64, 64), (63, 64)):
        seen = []
        batch, attempts, failed = find_largest_batch(lambda b: seen.append(b) or b <= limit, cap)
        want = min(limit, cap)
        assert batch == want, (limit, cap, batch)
        assert failed == (0 if limit >= cap else want + 1), (limit, cap, failed)
        assert attempts == len(seen) and len(set(seen)) == len(seen), seen
    for bad in ("12parsecs", "0", "-1GiB"):
        try:
            parse_size(bad)
        except argparse.ArgumentTypeError:
            continue
        raise AssertionError(f"parse_size accepted {bad!r}")
    assert parse_size("3GiB") == 3 * 2**30 and parse_size("1.5GB") == 1_500_000_000 and parse_size("512") == 512
    print("torch_max_batch.py: self-test passed")
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--memory-limit", type=parse_size, help="the limit: bytes, or 3GiB, 512MiB, 1.5GB")
    p.add_argument("--model", choices=("mlp", "cnn"), default="cnn")
    p.add_argument("--channels", default="420,1000", help="cnn widths (default: 420,1000, the seeds' wide cnn)")
    p.add_argument("--hidden", default="1024,1024", help="mlp widths")
    p.add_argument("--precisions", default="fp32,amp-fp16,amp-bf16,half-bf16",
                   help=f"the first is the ratios' baseline; each one of {', '.join(PRECISIONS)}")
    p.add_argument("--max-batch", type=int, default=65536)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--self-test", action="store_true", help="test the search and the size parser, then exit")
    a = p.parse_args(argv)
    if a.self_test:
        return self_test()
    a.precisions = [s for s in a.precisions.split(",") if s]
    bad = [x for x in a.precisions if x not in PRECISIONS]
    if bad or not a.precisions:
        p.error(f"--precisions: unknown {bad}; expected some of {', '.join(PRECISIONS)}")
    if a.memory_limit is None:
        p.error("--memory-limit SIZE is required")
    if a.max_batch < 1:
        p.error("--max-batch must be >= 1")
    return run(a)


if __name__ == "__main__":
    sys.exit(main())
