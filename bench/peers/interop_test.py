#!/usr/bin/python3
"""Checkpoints both ways between mixprec and PyTorch (a ctest entry; Debian's python3-torch).

For mlp (half-bf16: bf16 tensors in the file) and cnn-bn (amp-bf16: BatchNorm buffers):
  1. mixprec trains a few steps and saves a checkpoint; its model tensors load into the
     torch.nn model of models.py with load_state_dict(strict=True), and PyTorch's test accuracy
     on the 10,000 Fashion-MNIST test images equals `mixprec eval`'s within 0.05 points;
  2. PyTorch trains a few steps and saves its state_dict (tensors in reverse order, header
     padding, extra metadata, no model description) with safetensors_io; `mixprec eval
     --model ...` reads it and gives PyTorch's accuracy within 0.05 points.
Exits 1 on any difference; fails (never skips) where torch is missing.

  /usr/bin/python3 bench/peers/interop_test.py --mixprec build/mixprec
"""

import argparse
import functools
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import models  # noqa: E402
import safetensors_io  # noqa: E402
from torch_train import read_idx  # noqa: E402

RESERVED = ("optimizer.", "scaler.", "rng.", "run.")  # the checkpoint's own prefixes (docs/design.md)
TOLERANCE = 0.0005  # 0.05 points of accuracy: 5 of the 10,000 test images
CASES = [  # model, its flags, the preset mixprec trains it in
    ("mlp", ["--hidden", "64"], "half-bf16"),
    ("cnn-bn", [], "amp-bf16"),
]


@functools.lru_cache(maxsize=None)
def images(data_dir, split, mean, std, count=None):
    """The split's first `count` images (all by default) normalised as mixprec's loader does:
    (v / 255 - mean) / std in f64, then f32. Each split and normalisation is read once (the test
    asks for the test split four times; normalising all 60,000 training images, of which PyTorch's
    steps read 2,560, took a sixth of the test)."""
    x = read_idx(os.path.join(data_dir, f"{split}-images-idx3-ubyte.gz"))[:count].astype(np.float64)
    y = read_idx(os.path.join(data_dir, f"{split}-labels-idx1-ubyte.gz"))[:count].astype(np.int64)
    x = (x / 255.0 - float(np.float32(mean))) / float(np.float32(std))
    return torch.from_numpy(x.astype(np.float32)).unsqueeze(1), torch.from_numpy(y)


def torch_accuracy(model, x, y):
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(y), 1000):
            correct += int((model(x[i:i + 1000]).argmax(1) == y[i:i + 1000]).sum())
    return correct / len(y)


def mixprec_eval(a, path, extra):
    out = subprocess.run([a.mixprec, "eval", "--checkpoint", path, "--precision", "fp32", "--json",
                          "--threads", str(a.threads), "--data", a.data] + extra,
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)["test_accuracy"]


def check(name, mixprec_acc, torch_acc, failures):
    ok = abs(mixprec_acc - torch_acc) <= TOLERANCE
    print(f"{name:44s} mixprec {100 * mixprec_acc:6.2f} %  pytorch {100 * torch_acc:6.2f} %  {'ok' if ok else 'DIFFERENT'}")
    if not ok:
        failures.append(name)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mixprec", required=True, help="the mixprec binary")
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    env = dict(os.environ, OMP_WAIT_POLICY="passive")
    failures = []
    with tempfile.TemporaryDirectory(prefix="mixprec_interop_") as tmp:
        for model_name, flags, precision in CASES:
            # 1. mixprec -> PyTorch
            ck = os.path.join(tmp, f"{model_name}.st")
            subprocess.run([a.mixprec, "train", "--model", model_name, *flags, "--precision", precision,
                            "--epochs", "1", "--stop-after-steps", "30", "--save", ck, "--threads",
                            str(a.threads), "--data", a.data],
                           check=True, capture_output=True, text=True, env=env)
            tensors, meta = safetensors_io.load(ck)
            state = {k: v for k, v in tensors.items() if not k.startswith(RESERVED)}
            net = models.build(meta["model"], meta["hidden"], meta["channels"])
            net.load_state_dict(state, strict=True)  # every name, every shape: raises otherwise
            x, y = images(a.data, "t10k", meta["norm-mean"], meta["norm-std"])
            check(f"{model_name} ({precision}) mixprec -> pytorch", mixprec_eval(a, ck, []),
                  torch_accuracy(net, x, y), failures)

            # 2. PyTorch -> mixprec
            torch.manual_seed(1)
            net = models.build(model_name, *([flags[1]] if flags else []))
            steps, batch = 20, 128
            xt, yt = images(a.data, "train", 0.2860, 0.3530, steps * batch)
            opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
            net.train()
            for step in range(steps):
                opt.zero_grad()
                rows = slice(step * batch, (step + 1) * batch)
                F.cross_entropy(net(xt[rows]), yt[rows]).backward()
                opt.step()
            x, y = images(a.data, "t10k", 0.2860, 0.3530)
            acc = torch_accuracy(net, x, y)
            sd = net.state_dict()
            pt = os.path.join(tmp, f"{model_name}_torch.st")
            safetensors_io.save(pt, sd, {"framework": "pytorch", "note": "any metadata"},
                                order=reversed(list(sd.keys())))
            check(f"{model_name} pytorch -> mixprec", mixprec_eval(a, pt, ["--model", model_name, *flags]), acc,
                  failures)
    if failures:
        print("interop: FAILED: " + ", ".join(failures), file=sys.stderr)
        return 1
    print("interop: every checkpoint gives the same accuracy in both")
    return 0


if __name__ == "__main__":
    sys.exit(main())
