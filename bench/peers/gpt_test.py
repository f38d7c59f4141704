#!/usr/bin/python3
"""Checks of the GPT peer's data and model (a ctest entry, a few seconds; Debian's python3-torch).

Pins the numbers mixprec's C++ text data must reproduce (docs/design.md's corpus and batches):
splitmix64's mix, the batch offsets, the Moby Dick vocabulary and split sizes; and checks the
preprocessing rules, nanoGPT's schedule, the model's names, tie, initialisation, causality and
optimizer groups. Needs /usr/local/share/mixprec/mobydick.txt (scripts/dev.sh puts it there):
fails, never skips, without it.

  /usr/bin/python3 bench/peers/gpt_test.py [--text FILE]
"""

import argparse
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import gpt  # noqa: E402

M64 = (1 << 64) - 1


def mix_int(z):
    """splitmix64's finaliser in Python integers: the independent reference for gpt.mix."""
    z = (z + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def test_mix_and_offsets():
    # splitmix64 seeded with 0 gives 0xE220A8397B1DCDAF first (its published sequence).
    assert int(gpt.mix(0)) == 0xE220A8397B1DCDAF == mix_int(0)
    assert int(gpt.mix(1)) == 0x910A2DEC89025CC1 and int(gpt.mix(2674)) == 0x4B8ED06B0A8DBE83
    # The same numbers as tests/test_text.cpp's BatchOffsetsForSeed1337 (mixprec's side).
    want_train = [643435, 148437, 285579, 390830, 101243, 3566]
    assert gpt.offsets(1337, 0, 0, 6, 1_000_000, 128).tolist() == want_train
    assert gpt.offsets(0, 1, 0, 6, 100_000, 128).tolist() == [8190, 97507, 65771, 34519, 64131, 73746]
    n, block = 1_000_003, 128
    for seed in (0, 1, 1337, 2**63 + 5):
        for split in (0, 1):
            want = [mix_int((mix_int((seed * 2 + split) & M64) + i) & M64) % (n - block)
                    for i in range(1000, 1064)]
            assert gpt.offsets(seed, split, 1000, 64, n, block).tolist() == want, (seed, split)


def test_preprocess():
    raw = (b"\xef\xbb\xbfTitle\r\n*** START OF THE BOOK ***\r\nCall me\r\nIshmael.\r\n"
           b"*** END OF THE BOOK ***\r\nlicence\r\n")
    assert gpt.preprocess(raw) == "Call me\nIshmael.\n"
    assert gpt.preprocess("no markers\r\nat all\r".encode()) == "no markers\nat all\r"
    assert gpt.preprocess(b"x\n*** START OF it\nno end\nline") == "no end\nline"
    assert gpt.preprocess(b"*** START OF it") == ""
    assert gpt.preprocess(b"*** START OF\n*** END OF\n") == ""
    assert gpt.preprocess(b"a\n*** END OF\nb") == "a\n*** END OF\nb"  # END without START: all
    assert gpt.preprocess("\u00e9t\u00e9 \u2014 \U0001F40B".encode()) == "\u00e9t\u00e9 \u2014 \U0001F40B"
    try:
        gpt.preprocess(b"ok \xff bad", "x.txt")
    except ValueError as e:
        assert "x.txt" in str(e) and "byte 3" in str(e), e
    else:
        raise AssertionError("invalid UTF-8 accepted")


def test_corpus(path):
    c = gpt.load_corpus(path, min_split=128)
    assert len(c.vocab) == 81, len(c.vocab)
    assert (len(c.train), len(c.val)) == (1094292, 121589), (len(c.train), len(c.val))
    assert c.vocab[:3] == ["\n", " ", "!"] and c.vocab[-1] == "z"
    assert gpt.offsets(1337, 0, 0, 5, len(c.train), 128).tolist() == [40007, 183889, 21903, 76342, 999395]
    assert gpt.offsets(0, 1, 0, 5, len(c.val), 128).tolist() == [91349, 32464, 96405, 83515, 25771]
    x, y = gpt.train_batch(c.train, 1337, 1, 32, 128)  # step 1: rows i = 32 .. 63
    off = gpt.offsets(1337, 0, 32, 32, len(c.train), 128)
    assert x.shape == y.shape == (32, 128) and x.dtype == torch.int64
    assert np.array_equal(x[5].numpy(), c.train[off[5]:off[5] + 128])
    assert np.array_equal(y[5].numpy(), c.train[off[5] + 1:off[5] + 129])
    text = "".join(c.vocab[t] for t in c.train[:40])
    assert text.startswith("\n\n\n\nProduced by"), repr(text)


def test_get_lr():
    lr, low, warm, steps = 1e-3, 1e-4, 100, 2000
    assert math.isclose(gpt.get_lr(0, lr, low, warm, steps), lr / 101)
    assert math.isclose(gpt.get_lr(99, lr, low, warm, steps), lr * 100 / 101)
    assert gpt.get_lr(100, lr, low, warm, steps) == lr
    mid = gpt.get_lr(100 + 950, lr, low, warm, steps)  # half way through the cosine
    assert math.isclose(mid, (lr + low) / 2)
    last = gpt.get_lr(1999, lr, low, warm, steps)
    assert math.isclose(last, low + 0.5 * (1 + math.cos(math.pi * 1899 / 1900)) * (lr - low))


def test_model():
    torch.manual_seed(0)
    cfg = gpt.GPTConfig(vocab_size=81, block_size=32, n_layer=2, n_head=4, n_embd=64)
    m = gpt.GPT(cfg)
    names = list(m.state_dict().keys())
    want = ["transformer.wte.weight", "transformer.wpe.weight"]
    for i in range(2):
        h = f"transformer.h.{i}."
        for sub in ("ln_1", "attn.c_attn", "attn.c_proj", "ln_2", "mlp.c_fc", "mlp.c_proj"):
            want += [h + sub + ".weight", h + sub + ".bias"]
    want += ["transformer.ln_f.weight", "transformer.ln_f.bias", "lm_head.weight"]
    assert names == want, names
    assert m.lm_head.weight is m.transformer.wte.weight
    params = dict(m.named_parameters())  # each tensor once: the tied one under its first name
    assert "lm_head.weight" not in params and len(params) == len(want) - 1
    assert sum(p.numel() for p in m.parameters()) == 81 * 64 + 32 * 64 + 2 * (
        2 * 2 * 64 + 64 * 192 + 192 + 64 * 64 + 64 + 64 * 256 + 256 + 256 * 64 + 64) + 2 * 64
    for name, p in params.items():
        if name.endswith("c_proj.weight"):
            assert abs(p.std().item() - 0.02 / math.sqrt(4)) < 0.001, name
        elif name.endswith(".bias") and ".ln_" not in name:
            assert torch.all(p == 0), name
        elif ".ln_" in name:
            assert torch.all(p == (1 if name.endswith("weight") else 0)), name
        else:
            assert abs(p.std().item() - 0.02) < 0.002 and abs(p.mean().item()) < 0.002, name
    groups = gpt.optimizer(m, 1e-3).param_groups
    assert [g["weight_decay"] for g in groups] == [0.1, 0.0] and groups[0]["betas"] == (0.9, 0.95)
    assert all(p.dim() >= 2 for p in groups[0]["params"]) and all(p.dim() < 2 for p in groups[1]["params"])
    assert len(groups[0]["params"]) + len(groups[1]["params"]) == len(params)

    # Causal: changing token 20 leaves the logits of positions 0..19 as they were, in fp32 and
    # under bf16 autocast.
    m.eval()
    idx = torch.randint(0, 81, (2, 32))
    idx2 = idx.clone()
    idx2[:, 20] = (idx2[:, 20] + 1) % 81
    for amp in (False, True):
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            a, b = m(idx).float(), m(idx2).float()
        assert a.shape == (2, 32, 81)
        assert torch.equal(a[:, :20], b[:, :20]) and not torch.equal(a[:, 20:], b[:, 20:]), amp


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--text", default=gpt.DEFAULT_TEXT)
    a = p.parse_args()
    torch.set_num_threads(1)
    tests = [test_mix_and_offsets, test_preprocess, lambda: test_corpus(a.text), test_get_lr, test_model]
    names = ["mix_and_offsets", "preprocess", "corpus", "get_lr", "model"]
    failed = 0
    for name, t in zip(names, tests):
        try:
            t()
            print(f"ok      {name}")
        except Exception as e:  # noqa: BLE001 - report every check, then fail
            failed += 1
            print(f"FAILED  {name}: {type(e).__name__}: {e}")
    print(f"gpt_test: {len(tests) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
