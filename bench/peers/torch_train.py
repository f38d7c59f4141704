#!/usr/bin/python3
"""Full Fashion-MNIST training with PyTorch: the accuracy reference for `mixprec train`.

Run with Debian's interpreter (/usr/bin/python3, python3-torch), e.g.
  /usr/bin/python3 bench/peers/torch_train.py --model cnn-bn --precision amp-bf16 --epochs 5

Reads the gzip idx files from --data-dir (default /usr/share/datasets/fashion-mnist),
normalises with mean 0.2860 / std 0.3530, prints one line per epoch and finally one
JSON line {"impl":"pytorch","test_accuracy":...,...}.

--model gpt trains the character-level GPT of gpt.py on --text (Moby Dick) with the recipe of
`mixprec train --model gpt` (AdamW 0.9/0.95, weight decay 0.1 on 2-D weights, lr 1e-3 with 100
warm-up steps and cosine to 1e-4, clipping at 1.0, batch 32, 2000 steps), e.g.
  /usr/bin/python3 bench/peers/torch_train.py --model gpt --seed 1337 --precision amp-bf16 \
      --metrics runs/gpt_bf16.jsonl
It prints a line per evaluation, writes mixprec's metrics lines ({"event":"step",...} per step,
{"event":"eval","step":N,"val_loss":x} every --eval-every steps and at the last, a summary) and
finally one JSON line {"impl":"pytorch","model":"gpt","val_loss":...,...}.
"""

import argparse
import gzip
import json
import math
import os
import statistics
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import gpt  # noqa: E402
import models  # noqa: E402
import safetensors_io  # noqa: E402

MEAN, STD = 0.2860, 0.3530


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    zero, dtype, ndim = struct.unpack_from(">HBB", data, 0)
    if zero != 0 or dtype != 0x08:
        raise ValueError(f"{path}: not an unsigned-byte idx file")
    shape = struct.unpack_from(">" + "I" * ndim, data, 4)
    arr = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if arr.size != int(np.prod(shape)):
        raise ValueError(f"{path}: expected {shape}, got {arr.size} bytes")
    return arr.reshape(shape)


def load_split(data_dir, prefix):
    x = read_idx(os.path.join(data_dir, f"{prefix}-images-idx3-ubyte.gz"))
    y = read_idx(os.path.join(data_dir, f"{prefix}-labels-idx1-ubyte.gz"))
    x = torch.from_numpy(x.astype(np.float32) / 255.0).unsqueeze(1)
    x = (x - MEAN) / STD
    return x, torch.from_numpy(y.astype(np.int64))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    models.add_model_args(p, extra_models=("gpt",))
    p.add_argument("--precision", choices=("fp32", "amp-bf16"), default="fp32")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=None, help="default 128 (gpt: 32)")
    p.add_argument("--lr", type=float, default=None,
                   help="learning rate (default 1e-3 for adam/adamw, 0.05 for sgd)")
    p.add_argument("--optimizer", choices=("adam", "adamw", "sgd"), default="adamw")
    p.add_argument("--momentum", type=float, default=0.9, help="sgd momentum")
    p.add_argument("--weight-decay", type=float, default=None,
                   help="default 0.01 for adamw (gpt: 0.1 on 2-D weights), 0 otherwise")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--limit-train", type=int, default=0,
                   help="use only the first N training images (0 = all; for quick checks)")
    g = p.add_argument_group("gpt (--model gpt; the defaults are the recipe)")
    gpt.add_args(g)
    g.add_argument("--steps", type=int, default=2000)
    g.add_argument("--eval-every", type=int, default=250, help="and at the last step")
    g.add_argument("--eval-batches", type=int, default=gpt.VAL_BATCHES,
                   help=f"the first N of the {gpt.VAL_BATCHES} fixed validation batches")
    g.add_argument("--min-lr", type=float, default=1e-4)
    g.add_argument("--lr-warmup", type=int, default=100)
    g.add_argument("--beta2", type=float, default=0.95)
    g.add_argument("--clip-grad-norm", type=float, default=1.0, help="0: no clipping")
    g.add_argument("--metrics", metavar="FILE", help="JSON lines as `mixprec train --metrics`")
    g.add_argument("--log-every", type=int, default=1, help="a step line every K steps")
    g.add_argument("--save-init", metavar="FILE", help="write the initial weights (safetensors)")
    g.add_argument("--init-from", metavar="FILE",
                   help="start from these weights (safetensors: ours, or a mixprec checkpoint)")
    g.add_argument("--save", metavar="FILE", help="write the trained weights (safetensors)")
    a = p.parse_args(argv)
    if a.batch_size is None:
        a.batch_size = 32 if a.model == "gpt" else 128
    if a.model == "gpt":
        if a.optimizer != "adamw":
            p.error("--model gpt trains with adamw (the recipe)")
        if (a.steps < 1 or a.eval_every < 1 or a.log_every < 1 or a.batch_size < 1
                or not 1 <= a.eval_batches <= gpt.VAL_BATCHES or a.lr_warmup < 0):
            p.error(f"--steps, --eval-every, --log-every, --batch-size must be >= 1, --lr-warmup >= 0 "
                    f"and --eval-batches in 1..{gpt.VAL_BATCHES}")
    return a


def make_optimizer(a, params):
    lr = a.lr if a.lr is not None else (0.05 if a.optimizer == "sgd" else 1e-3)
    wd = a.weight_decay if a.weight_decay is not None else (0.01 if a.optimizer == "adamw" else 0.0)
    if a.optimizer == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=a.momentum, weight_decay=wd), lr, wd
    if a.optimizer == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=wd), lr, wd
    return torch.optim.AdamW(params, lr=lr, weight_decay=wd), lr, wd


@torch.no_grad()
def evaluate(model, x, y, amp, batch=1000):
    model.eval()
    correct, loss_sum = 0, 0.0
    for i in range(0, len(x), batch):
        xb, yb = x[i:i + batch], y[i:i + batch]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            logits = model(xb)
        logits = logits.float()
        loss_sum += F.cross_entropy(logits, yb, reduction="sum").item()
        correct += (logits.argmax(1) == yb).sum().item()
    return correct / len(x), loss_sum / len(x)


# Prefixes of a mixprec checkpoint's non-model tensors (docs/design.md), skipped by --init-from.
RESERVED = ("optimizer.", "scaler.", "rng.", "run.")


def load_weights(model, path):
    """Loads a safetensors file into the model, strictly (every name, every shape)."""
    tensors, _ = safetensors_io.load(path)
    state = {k: v.float() for k, v in tensors.items() if not k.startswith(RESERVED)}
    if "lm_head.weight" not in state and "transformer.wte.weight" in state:
        state["lm_head.weight"] = state["transformer.wte.weight"]  # a file that stores the tie once
    model.load_state_dict(state, strict=True)


def train_gpt(a):
    """The GPT recipe on the text corpus; step, eval and summary lines as `mixprec train`."""
    try:
        corpus = gpt.load_corpus(a.text, min_split=a.block_size)
        cfg = gpt.config_of(a, len(corpus.vocab))
    except (OSError, ValueError) as e:
        print(f"torch_train.py: {e}", file=sys.stderr)
        return 1
    model = gpt.GPT(cfg)
    if a.init_from:
        load_weights(model, a.init_from)
    if a.save_init:
        safetensors_io.save(a.save_init, model.state_dict(), {"model": "gpt", "framework": "pytorch"})
    lr = a.lr if a.lr is not None else 1e-3
    wd = a.weight_decay if a.weight_decay is not None else 0.1
    opt = gpt.optimizer(model, lr, wd, (0.9, a.beta2))
    amp = a.precision == "amp-bf16"
    n_params = sum(p.numel() for p in model.parameters())
    print(f"gpt: {n_params} parameters, vocabulary {len(corpus.vocab)}, train {len(corpus.train)} / "
          f"val {len(corpus.val)} characters, {a.precision}, {a.threads} threads", flush=True)

    metrics = open(a.metrics, "w") if a.metrics else None

    def emit(obj):
        if metrics:
            metrics.write(json.dumps(obj, separators=(",", ":")) + "\n")
            metrics.flush()

    evals, step_ms, val = [], [], None
    model.train()
    t_start = time.perf_counter()
    for it in range(a.steps):
        step = it + 1  # mixprec numbers steps from 1: step N is the N-th update
        step_lr = gpt.get_lr(it, lr, a.min_lr, a.lr_warmup, a.steps)
        for group in opt.param_groups:
            group["lr"] = step_lr
        x, y = gpt.train_batch(corpus.train, a.seed, it, a.batch_size, a.block_size)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            loss = gpt.loss_of(model(x), y)
        loss.backward()
        norm = (torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip_grad_norm).item()
                if a.clip_grad_norm > 0 else None)
        opt.step()
        loss_v = loss.item()
        step_ms.append((time.perf_counter() - t0) * 1000.0)
        if not math.isfinite(loss_v):
            print(f"torch_train.py: training diverged: loss is {loss_v} at step {step}", file=sys.stderr)
            return 1
        if step % a.log_every == 0:
            emit({"event": "step", "step": step, "loss": loss_v, "lr": step_lr, "grad_norm": norm})
        if step % a.eval_every == 0 or step == a.steps:
            val = gpt.val_loss(model, corpus.val, a.block_size, amp, a.eval_batches)
            evals.append({"step": step, "val_loss": val, "loss": loss_v})
            emit({"event": "eval", "step": step, "val_loss": val})
            print(f"step {step}/{a.steps}  loss {loss_v:.4f}  val_loss {val:.4f}  lr {step_lr:.3g}  "
                  f"step {statistics.median(step_ms[-a.eval_every:]):.1f} ms (median)  "
                  f"({time.perf_counter() - t_start:.0f} s)", flush=True)
    if a.save:
        safetensors_io.save(a.save, model.state_dict(), {"model": "gpt", "framework": "pytorch"})

    out = {
        "impl": "pytorch",
        "model": "gpt",
        "precision": a.precision,
        "layers": a.layers, "heads": a.heads, "d_model": a.d_model, "block_size": a.block_size,
        "dropout": a.dropout,
        "parameters": n_params,
        "vocab_size": len(corpus.vocab),
        "steps": a.steps,
        "batch_size": a.batch_size,
        "lr": lr, "min_lr": a.min_lr, "lr_warmup": a.lr_warmup, "weight_decay": wd,
        "beta2": a.beta2, "clip_grad_norm": a.clip_grad_norm,
        "seed": a.seed,
        "threads": a.threads,
        "val_loss": val,
        "train_loss": evals[-1]["loss"] if evals else None,
        "evals": evals,
        "step_ms": {"best": min(step_ms), "median": statistics.median(step_ms)},
        "wall_seconds": time.perf_counter() - t_start,
        "torch_version": torch.__version__,
    }
    emit({"event": "summary", **out})
    if metrics:
        metrics.close()
    print(json.dumps(out, separators=(",", ":")), flush=True)
    return 0


def main(argv=None):
    a = parse_args(argv)
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    if a.model == "gpt":
        return train_gpt(a)

    xtr, ytr = load_split(a.data_dir, "train")
    xte, yte = load_split(a.data_dir, "t10k")
    if a.limit_train > 0:
        xtr, ytr = xtr[:a.limit_train], ytr[:a.limit_train]

    model = models.build(a.model, a.hidden, a.channels, a.linear)
    opt, lr, wd = make_optimizer(a, model.parameters())
    amp = a.precision == "amp-bf16"
    gen = torch.Generator().manual_seed(a.seed)

    epoch_s, history = [], []
    t_start = time.perf_counter()
    for epoch in range(1, a.epochs + 1):
        model.train()
        t0 = time.perf_counter()
        perm = torch.randperm(len(xtr), generator=gen)
        loss_sum, correct, seen = 0.0, 0, 0
        for i in range(0, len(xtr), a.batch_size):
            idx = perm[i:i + a.batch_size]
            xb, yb = xtr[idx], ytr[idx]
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
                logits = model(xb)
                loss = F.cross_entropy(logits, yb)
            loss.backward()
            opt.step()
            loss_sum += loss.item() * len(yb)
            correct += (logits.argmax(1) == yb).sum().item()
            seen += len(yb)
        train_s = time.perf_counter() - t0
        test_acc, test_loss = evaluate(model, xte, yte, amp)
        epoch_s.append(train_s)
        rec = {"epoch": epoch, "train_loss": loss_sum / seen, "train_accuracy": correct / seen,
               "test_loss": test_loss, "test_accuracy": test_acc, "train_s": train_s}
        history.append(rec)
        print(f"epoch {epoch}/{a.epochs}  train_loss {rec['train_loss']:.4f}  "
              f"train_acc {rec['train_accuracy']:.4f}  test_loss {test_loss:.4f}  "
              f"test_acc {test_acc:.4f}  ({train_s:.1f} s)", flush=True)

    out = {
        "impl": "pytorch",
        "model": a.model,
        "precision": a.precision,
        "linear": a.linear,
        "optimizer": a.optimizer,
        "lr": lr,
        "weight_decay": wd,
        "epochs": a.epochs,
        "batch_size": a.batch_size,
        "seed": a.seed,
        "threads": a.threads,
        "test_accuracy": history[-1]["test_accuracy"] if history else None,
        "test_loss": history[-1]["test_loss"] if history else None,
        "train_loss": history[-1]["train_loss"] if history else None,
        "epoch_s": epoch_s,
        "total_s": time.perf_counter() - t_start,
        "history": history,
        "torch_version": torch.__version__,
    }
    print(json.dumps(out, separators=(",", ":")), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
