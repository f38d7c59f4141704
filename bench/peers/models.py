"""PyTorch definitions of the mixprec models (the peer reference).

The state_dict names match mixprec's module names:
  mlp     -> "1.weight", "1.bias", "3.weight", ... (index 0 is Flatten)
  cnn     -> "0.weight", "3.weight", "7.weight"
  cnn-bn  -> "0.weight", "1.weight"/"1.running_mean"/..., ..., "16.weight", "19.weight"
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

# How nn.Linear computes. "native" is stock PyTorch. Debian's python3-torch is built
# with BLAS_INFO=generic, so an fp32 Linear (addmm) runs on netlib's reference BLAS,
# single-threaded and unvectorised: far slower than any PyTorch built with MKL or
# OpenBLAS. "onednn" computes an fp32 Linear as the equivalent 1x1 convolution, which
# PyTorch sends to oneDNN (AVX-512) in forward and both backward passes: the fair fp32
# peer. Under bf16 autocast both settings use F.linear, which already runs on oneDNN's
# AMX matmul.
LINEAR_IMPLS = ("native", "onednn")


class Conv1x1Linear(nn.Linear):
    """nn.Linear (same parameters and state_dict names) computed as a 1x1 conv2d."""

    def forward(self, x):
        # Only the fp32 path needs the detour: under autocast (or for 16-bit inputs)
        # F.linear already runs on oneDNN's matmul, and oneDNN's bf16 1x1-conv weight
        # gradient with a 1x1 image is pathologically slow (~20x the matmul).
        if x.dtype != torch.float32 or torch.is_autocast_cpu_enabled():
            return F.linear(x, self.weight, self.bias)
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features, 1, 1)
        w = self.weight.view(self.out_features, self.in_features, 1, 1)
        return F.conv2d(x2, w, self.bias).reshape(*lead, self.out_features)


def _use_linear(model, impl):
    if impl == "native":
        return model
    if impl != "onednn":
        raise ValueError(f"unknown linear impl {impl!r}; expected one of {LINEAR_IMPLS}")
    for m in model.modules():
        if type(m) is nn.Linear:
            m.__class__ = Conv1x1Linear
    return model

MODELS = ("mlp", "cnn", "cnn-bn")


def parse_int_list(text):
    """'1024,1024' -> [1024, 1024]; '' -> []."""
    return [int(t) for t in str(text).replace(" ", "").split(",") if t]


def mlp(hidden=(1024, 1024), in_features=784, num_classes=10):
    layers = [nn.Flatten()]
    prev = in_features
    for h in hidden:
        layers += [nn.Linear(prev, h), nn.ReLU()]
        prev = h
    layers.append(nn.Linear(prev, num_classes))
    return nn.Sequential(*layers)


def cnn(channels=(8, 16), num_classes=10):
    c1, c2 = channels
    return nn.Sequential(
        nn.Conv2d(1, c1, 3, padding=1),   # 0
        nn.ReLU(),                        # 1
        nn.MaxPool2d(2),                  # 2
        nn.Conv2d(c1, c2, 3, padding=1),  # 3
        nn.ReLU(),                        # 4
        nn.MaxPool2d(2),                  # 5
        nn.Flatten(),                     # 6
        nn.Linear(c2 * 7 * 7, num_classes),  # 7
    )


def cnn_bn(num_classes=10):
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1),   # 0
        nn.BatchNorm2d(32),               # 1
        nn.ReLU(),                        # 2
        nn.Conv2d(32, 32, 3, padding=1),  # 3
        nn.BatchNorm2d(32),               # 4
        nn.ReLU(),                        # 5
        nn.MaxPool2d(2),                  # 6
        nn.Conv2d(32, 64, 3, padding=1),  # 7
        nn.BatchNorm2d(64),               # 8
        nn.ReLU(),                        # 9
        nn.Conv2d(64, 64, 3, padding=1),  # 10
        nn.BatchNorm2d(64),               # 11
        nn.ReLU(),                        # 12
        nn.MaxPool2d(2),                  # 13
        nn.Flatten(),                     # 14
        nn.Dropout(0.25),                 # 15
        nn.Linear(64 * 7 * 7, 128),       # 16
        nn.ReLU(),                        # 17
        nn.Dropout(0.25),                 # 18
        nn.Linear(128, num_classes),      # 19
    )


def build(name, hidden=(1024, 1024), channels=(8, 16), linear="native"):
    """Build a model by CLI name. hidden/channels may be lists or 'a,b' strings."""
    return _use_linear(_build(name, hidden, channels), linear)


def _build(name, hidden, channels):
    if isinstance(hidden, str):
        hidden = parse_int_list(hidden)
    if isinstance(channels, str):
        channels = parse_int_list(channels)
    if name == "mlp":
        return mlp(hidden)
    if name == "cnn":
        if len(channels) != 2:
            raise ValueError(f"cnn needs exactly 2 channels, got {channels}")
        return cnn(channels)
    if name == "cnn-bn":
        return cnn_bn()
    raise ValueError(f"unknown model {name!r}; expected one of {MODELS}")


def add_model_args(parser, extra_models=()):
    """The model flags; extra_models: more --model names the script handles itself (gpt)."""
    parser.add_argument("--model", choices=MODELS + tuple(extra_models), default="mlp")
    parser.add_argument("--hidden", default="1024,1024",
                        help="mlp hidden sizes, comma-separated (default 1024,1024)")
    parser.add_argument("--channels", default="8,16",
                        help="cnn channels c1,c2 (default 8,16)")
    parser.add_argument("--linear", choices=LINEAR_IMPLS, default="native",
                        help="how nn.Linear computes: native (Debian torch: netlib BLAS "
                             "in fp32) or onednn (fp32 Linear as a oneDNN 1x1 conv); see models.py")
