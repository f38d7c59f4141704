#!/usr/bin/python3
"""Full Fashion-MNIST training with PyTorch: the accuracy reference for `mixprec train`.

Run with Debian's interpreter (/usr/bin/python3, python3-torch), e.g.
  /usr/bin/python3 bench/peers/torch_train.py --model cnn-bn --precision amp-bf16 --epochs 5

Reads the gzip idx files from --data-dir (default /usr/share/datasets/fashion-mnist),
normalises with mean 0.2860 / std 0.3530, prints one line per epoch and finally one
JSON line {"impl":"pytorch","test_accuracy":...,...}.
"""

import argparse
import gzip
import json
import os
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import models  # noqa: E402

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
    models.add_model_args(p)
    p.add_argument("--precision", choices=("fp32", "amp-bf16"), default="fp32")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=None,
                   help="learning rate (default 1e-3 for adam/adamw, 0.05 for sgd)")
    p.add_argument("--optimizer", choices=("adam", "adamw", "sgd"), default="adamw")
    p.add_argument("--momentum", type=float, default=0.9, help="sgd momentum")
    p.add_argument("--weight-decay", type=float, default=None,
                   help="default 0.01 for adamw, 0 otherwise")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--limit-train", type=int, default=0,
                   help="use only the first N training images (0 = all; for quick checks)")
    return p.parse_args(argv)


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


def main(argv=None):
    a = parse_args(argv)
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)

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


if __name__ == "__main__":
    main()
