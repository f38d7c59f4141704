"""The character-level GPT in PyTorch 1.13: corpus, batches, model, recipe (the peer of `mixprec train
--model gpt`), bit for bit the data of docs/design.md's text corpus.

  corpus = gpt.load_corpus("/usr/local/share/mixprec/mobydick.txt")   # .vocab, .train, .val
  x, y = gpt.train_batch(corpus.train, seed=1337, step=0, batch_size=32, block_size=128)
  model = gpt.GPT(gpt.GPTConfig(vocab_size=len(corpus.vocab)))
  /usr/bin/python3 bench/peers/gpt.py --check-data       # vocabulary size, first offsets

Data: strip a UTF-8 BOM, CRLF -> LF, keep the text strictly between the line containing
`*** START OF` and the line containing `*** END OF`; vocabulary = sorted distinct code points;
first floor(90%) of the tokens train, the rest validation. Batch rows start at
    offset(seed, split, i) = mix(mix(seed * 2 + split) + i) % (n_split - block_size)
(splitmix64's finaliser, uint64 wrapping), training step s row b: i = s * batch + b, split 0;
validation batch j row b: i = j * 32 + b, split 1, seed 0.
Model: nanoGPT's names (transformer.wte, .wpe, .h.<i>.ln_1/.attn.c_attn/.attn.c_proj/.ln_2/
.mlp.c_fc/.mlp.c_proj, .ln_f, lm_head tied to wte), GELU tanh, GPT-2 initialisation. Torch 1.13
has no scaled_dot_product_attention: attention is written out there; a newer torch (the GPU
machine's) runs its fused F.scaled_dot_product_attention, the peer at its best.
"""

import argparse
import math
import os
import sys
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

DEFAULT_TEXT = "/usr/local/share/mixprec/mobydick.txt"
VAL_BATCHES, VAL_BATCH_SIZE, VAL_SEED = 50, 32, 0  # the fixed validation set (issue 11)

# splitmix64's constants (Steele, Lea, Flood 2014; java.util.SplittableRandom).
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


@dataclass
class Corpus:
    vocab: list  # the distinct characters, sorted by code point; token = index
    train: np.ndarray  # int64 tokens
    val: np.ndarray


def preprocess(raw, path="text"):
    """Bytes of a UTF-8 file -> the text the vocabulary is built from (raises ValueError)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: invalid UTF-8 at byte {e.start}") from e
    if text.startswith("\ufeff"):
        text = text[1:]
    text = text.replace("\r\n", "\n")  # a lone CR stays
    start = text.find("*** START OF")
    if start < 0:
        return text
    eol = text.find("\n", start)  # the text begins after the START line's LF
    begin = len(text) if eol < 0 else eol + 1
    end = len(text)  # no END line: to the end of the text
    end_marker = text.find("*** END OF", begin)
    if end_marker >= 0:  # the END line starts after the last LF before its marker
        lf = text.rfind("\n", 0, end_marker)
        end = begin if lf < begin else lf + 1
    return text[begin:end]


def load_corpus(path=DEFAULT_TEXT, min_split=None):
    """The corpus of `path`, split 90/10; min_split: each split must have more tokens than this."""
    with open(path, "rb") as f:
        text = preprocess(f.read(), path)
    if not text:
        raise ValueError(f"{path}: no text (empty file, or nothing between the START/END lines)")
    vocab = sorted(set(text))
    index = {c: i for i, c in enumerate(vocab)}
    tokens = np.fromiter((index[c] for c in text), dtype=np.int64, count=len(text))
    n_train = len(tokens) * 9 // 10
    corpus = Corpus(vocab, tokens[:n_train], tokens[n_train:])
    for name, split in (("training", corpus.train), ("validation", corpus.val)):
        if min_split is not None and len(split) <= min_split:
            raise ValueError(f"{path}: its {name} split holds {len(split)} characters, fewer than "
                             f"--block-size {min_split} + 1 (the text has {len(tokens)} characters)")
    return corpus


def mix(z):
    """splitmix64's finaliser on uint64 (a numpy array or scalar); wraps modulo 2^64."""
    z = np.asarray(z, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = z + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def offsets(seed, split, first, count, n_split, block_size):
    """Start offsets of rows i = first .. first + count - 1 of a split (int64 array)."""
    with np.errstate(over="ignore"):
        base = mix(np.uint64(seed % 2**64) * np.uint64(2) + np.uint64(split))
        i = np.arange(first, first + count, dtype=np.uint64)
        return (mix(base + i) % np.uint64(n_split - block_size)).astype(np.int64)


def batch_at(tokens, offs, block_size):
    """x, y int64 tensors [len(offs), block_size] from the start offsets."""
    idx = offs[:, None] + np.arange(block_size + 1, dtype=np.int64)[None, :]
    rows = torch.from_numpy(tokens[idx])
    return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()


def train_batch(tokens, seed, step, batch_size, block_size):
    offs = offsets(seed, 0, step * batch_size, batch_size, len(tokens), block_size)
    return batch_at(tokens, offs, block_size)


def val_batch(tokens, j, block_size):
    offs = offsets(VAL_SEED, 1, j * VAL_BATCH_SIZE, VAL_BATCH_SIZE, len(tokens), block_size)
    return batch_at(tokens, offs, block_size)


@dataclass
class GPTConfig:
    vocab_size: int
    block_size: int = 128
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0
    bias: bool = True


class CausalSelfAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        assert c.n_embd % c.n_head == 0, "n_embd must be a multiple of n_head"
        self.n_head = c.n_head
        self.c_attn = nn.Linear(c.n_embd, 3 * c.n_embd, bias=c.bias)
        self.c_proj = nn.Linear(c.n_embd, c.n_embd, bias=c.bias)
        self.attn_dropout = nn.Dropout(c.dropout)
        self.resid_dropout = nn.Dropout(c.dropout)
        self.register_buffer("mask", torch.ones(c.block_size, c.block_size, dtype=torch.bool)
                             .triu(1), persistent=False)  # True above the diagonal: masked

    def forward(self, x):
        B, T, C = x.shape  # x is (B, T, C)
        q, k, v = self.c_attn(x).split(C, dim=2)
        hd = C // self.n_head
        q, k, v = (t.view(B, T, self.n_head, hd).transpose(1, 2) for t in (q, k, v))  # (B, H, T, hd)
        if hasattr(F, "scaled_dot_product_attention"):  # torch >= 2.0: its fused (flash) attention
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.attn_dropout.p if self.training else 0.0,
                                               is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))  # (B, H, T, T)
            att = att.masked_fill(self.mask[:T, :T], float("-inf"))
            y = self.attn_dropout(F.softmax(att, dim=-1)) @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_fc = nn.Linear(c.n_embd, 4 * c.n_embd, bias=c.bias)
        self.c_proj = nn.Linear(4 * c.n_embd, c.n_embd, bias=c.bias)
        self.dropout = nn.Dropout(c.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x), approximate="tanh")))


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln_1 = nn.LayerNorm(c.n_embd)
        self.attn = CausalSelfAttention(c)
        self.ln_2 = nn.LayerNorm(c.n_embd)
        self.mlp = MLP(c)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.config = c
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(c.vocab_size, c.n_embd),
            wpe=nn.Embedding(c.block_size, c.n_embd),
            drop=nn.Dropout(c.dropout),
            h=nn.ModuleList([Block(c) for _ in range(c.n_layer)]),
            ln_f=nn.LayerNorm(c.n_embd),
        ))
        self.lm_head = nn.Linear(c.n_embd, c.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # tied: one tensor, two names
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):  # GPT-2's scaled residual projections
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * c.n_layer))

    @staticmethod
    def _init_weights(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)
        # nn.LayerNorm starts at weight 1, bias 0 already.

    def forward(self, idx):
        B, T = idx.shape  # idx is (B, T) int64
        if T > self.config.block_size:
            raise ValueError(f"sequence of {T} longer than the block size {self.config.block_size}")
        pos = torch.arange(T, dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))  # (B, T, V)


def loss_of(logits, y):
    """Mean cross-entropy over [B, T, V] logits (class dim last), in f32."""
    return F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.view(-1))


def optimizer(model, lr, weight_decay=0.1, betas=(0.9, 0.95)):
    """AdamW with nanoGPT's two groups: decay on parameters of dim >= 2, none on the rest."""
    params = [p for p in model.parameters() if p.requires_grad]  # each tied tensor once
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=betas)


def get_lr(it, lr, min_lr, warmup, steps):
    """nanoGPT's schedule: linear warm-up, then cosine from lr to min_lr at the last step."""
    if it < warmup:
        return lr * (it + 1) / (warmup + 1)
    # Rounded in the order of mixprec's LrSchedule::lr_at, so the metrics' lr values agree exactly.
    span = float(max(1, steps - warmup))
    return min_lr + (lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * min(float(it - warmup), span) / span))


@torch.no_grad()
def val_loss(model, tokens, block_size, amp, batches=VAL_BATCHES):
    """Mean of the per-batch mean losses over the fixed validation batches, in eval mode."""
    was_training = model.training
    model.eval()
    total = 0.0
    for j in range(batches):
        x, y = val_batch(tokens, j, block_size)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            total += loss_of(model(x), y).item()
    model.train(was_training)
    return total / batches


def add_args(p):
    """The model and data flags of `mixprec train/bench --model gpt` (same names and defaults)."""
    p.add_argument("--text", default=DEFAULT_TEXT, help=f"UTF-8 corpus (default {DEFAULT_TEXT})")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--block-size", type=int, default=128)
    p.add_argument("--dropout", type=float, default=0.0)


def config_of(a, vocab_size):
    if a.layers < 1 or a.heads < 1 or a.d_model % a.heads or a.block_size < 1:
        raise ValueError(f"--layers {a.layers} --heads {a.heads} --d-model {a.d_model} --block-size "
                         f"{a.block_size}: need layers, heads, block >= 1 and d-model a multiple of heads")
    return GPTConfig(vocab_size=vocab_size, block_size=a.block_size, n_layer=a.layers, n_head=a.heads,
                     n_embd=a.d_model, dropout=a.dropout)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check-data", action="store_true",
                   help="print the vocabulary size, split sizes and the first offsets, the numbers "
                        "mixprec's tests pin")
    p.add_argument("--text", default=DEFAULT_TEXT)
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--block-size", type=int, default=128)
    a = p.parse_args(argv)
    if not a.check_data:
        p.error("nothing to do: pass --check-data")
    try:
        c = load_corpus(a.text, min_split=a.block_size)
    except (OSError, ValueError) as e:
        print(f"gpt.py: {e}", file=sys.stderr)
        return 1
    n = len(c.train) + len(c.val)
    print(f"text {os.path.abspath(a.text)}: {n} characters, vocabulary {len(c.vocab)}, "
          f"train {len(c.train)}, val {len(c.val)}")
    print(f"mix(0) = {int(mix(0))}, mix(1) = {int(mix(1))}")
    tr = offsets(a.seed, 0, 0, 5, len(c.train), a.block_size)
    print(f"train offsets seed {a.seed} step 0 rows 0..4 (block {a.block_size}): {tr.tolist()}")
    tr1 = offsets(a.seed, 0, a.batch_size, 2, len(c.train), a.block_size)
    print(f"train offsets seed {a.seed} step 1 rows 0..1 (batch {a.batch_size}): {tr1.tolist()}")
    va = offsets(VAL_SEED, 1, 0, 5, len(c.val), a.block_size)
    print(f"val offsets batch 0 rows 0..4: {va.tolist()}")
    x, y = train_batch(c.train, a.seed, 0, a.batch_size, a.block_size)
    print(f"train step 0 row 0 tokens 0..9: x {x[0, :10].tolist()}, y {y[0, :10].tolist()}")
    print(f"vocabulary: {''.join(c.vocab)!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
