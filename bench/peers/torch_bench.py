#!/usr/bin/python3
"""Time PyTorch training steps on synthetic data: the peer of `mixprec bench`.

Run with Debian's interpreter (/usr/bin/python3, python3-torch), e.g.
  /usr/bin/python3 bench/peers/torch_bench.py --model mlp --precision amp-bf16

Prints one JSON line in the same shape as `mixprec bench`:
  {"impl":"pytorch","model":...,"steps_per_s":{"best":..,"median":..},
   "samples_per_s":{...},"step_ms":{...},"torch_version":...}
"best" comes from the fastest single step, "median" from the median step time.
With --repeats R > 1 the timed loop runs R times after one warm-up; "best" is the
fastest step overall and "median" the median of the per-repeat medians.

--model gpt times the GPT recipe's step (gpt.py: AdamW 0.9/0.95 with its two weight-decay groups,
clipping at 1.0) on one fixed batch of random tokens [batch, block] over --vocab-size, e.g.
  /usr/bin/python3 bench/peers/torch_bench.py --model gpt --precision amp-bf16 --batch-size 32
"""

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import gpt  # noqa: E402
import models  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    models.add_model_args(p, extra_models=("gpt",))
    p.add_argument("--precision", choices=("fp32", "amp-bf16"), default="fp32")
    p.add_argument("--batch-size", type=int, default=None, help="default 512 (gpt: 32)")
    p.add_argument("--steps", type=int, default=50, help="timed steps per repeat")
    p.add_argument("--warmup", type=int, default=10, help="untimed steps first")
    p.add_argument("--optimizer", choices=("sgd", "adamw"), default=None,
                   help="default sgd (gpt: adamw with the recipe's groups and betas)")
    p.add_argument("--lr", type=float, default=None,
                   help="learning rate (default 0.01 for sgd, 1e-3 for adamw)")
    p.add_argument("--momentum", type=float, default=0.9, help="sgd momentum (default 0.9)")
    p.add_argument("--threads", type=int, default=os.cpu_count(),
                   help="torch.set_num_threads (default: os.cpu_count())")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    g = p.add_argument_group("gpt (--model gpt)")
    gpt.add_args(g)
    g.add_argument("--vocab-size", type=int, default=81, help="random tokens in [0, V) (81: Moby Dick's)")
    g.add_argument("--clip-grad-norm", type=float, default=1.0, help="0: no clipping")
    a = p.parse_args(argv)
    if a.batch_size is None:
        a.batch_size = 32 if a.model == "gpt" else 512
    if a.optimizer is None:
        a.optimizer = "adamw" if a.model == "gpt" else "sgd"
    if a.model == "gpt" and a.optimizer != "adamw":
        p.error("--model gpt times the recipe's adamw step")
    if a.steps < 1 or a.batch_size < 1 or a.repeats < 1 or a.warmup < 0:
        p.error("--steps, --batch-size, --repeats must be >= 1 and --warmup >= 0")
    return a


def rates(step_ms, batch_size):
    return {
        "steps_per_s": 1000.0 / step_ms,
        "samples_per_s": 1000.0 * batch_size / step_ms,
    }


def main(argv=None):
    a = parse_args(argv)
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)

    lr = a.lr if a.lr is not None else (0.01 if a.optimizer == "sgd" else 1e-3)
    clip = 0.0
    if a.model == "gpt":
        try:
            model = gpt.GPT(gpt.config_of(a, a.vocab_size))
        except ValueError as e:
            print(f"torch_bench.py: {e}", file=sys.stderr)
            return 1
        opt = gpt.optimizer(model, lr)
        tokens = torch.randint(0, a.vocab_size, (a.batch_size, a.block_size + 1))
        x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
        loss_of, clip = gpt.loss_of, a.clip_grad_norm
    else:
        model = models.build(a.model, a.hidden, a.channels, a.linear)
        if a.optimizer == "sgd":
            opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=a.momentum)
        else:
            opt = torch.optim.AdamW(model.parameters(), lr=lr)
        x = torch.randn(a.batch_size, 1, 28, 28)
        y = torch.randint(0, 10, (a.batch_size,))
        loss_of = F.cross_entropy
    model.train()
    amp = a.precision == "amp-bf16"

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            loss = loss_of(model(x), y)
        loss.backward()
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        return loss

    for _ in range(a.warmup):
        step()

    all_ms, medians = [], []
    for _ in range(a.repeats):
        times = []
        for _ in range(a.steps):
            t0 = time.perf_counter()
            step()
            times.append((time.perf_counter() - t0) * 1000.0)
        all_ms += times
        medians.append(statistics.median(times))

    best_ms = min(all_ms)
    median_ms = statistics.median(medians)
    rb, rm = rates(best_ms, a.batch_size), rates(median_ms, a.batch_size)
    out = {
        "impl": "pytorch",
        "model": a.model,
        "precision": a.precision,
        "batch_size": a.batch_size,
        "threads": a.threads,
        "steps": a.steps,
        "warmup": a.warmup,
        "steps_per_s": {"best": rb["steps_per_s"], "median": rm["steps_per_s"]},
        "samples_per_s": {"best": rb["samples_per_s"], "median": rm["samples_per_s"]},
        "step_ms": {"best": best_ms, "median": median_ms},
        "torch_version": torch.__version__,
    }
    if a.model == "gpt":
        out.update({"layers": a.layers, "heads": a.heads, "d_model": a.d_model,
                    "block_size": a.block_size, "vocab_size": a.vocab_size,
                    "tokens_per_s": {k: v * a.block_size for k, v in out["samples_per_s"].items()}})
    if a.linear != "native":  # default output keeps exactly the `mixprec bench` shape
        out["linear"] = a.linear
    print(json.dumps(out, separators=(",", ":")), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
