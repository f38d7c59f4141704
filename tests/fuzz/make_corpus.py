#!/usr/bin/python3
"""Writes the fuzz targets' seed corpus (tests/fuzz/corpus/): small valid and invalid safetensors and
idx files, each a different path through the reader. Rerun after changing it: python3 make_corpus.py"""
import gzip
import json
import os
import struct

here = os.path.dirname(os.path.abspath(__file__))


def write(kind, name, data):
    os.makedirs(os.path.join(here, "corpus", kind), exist_ok=True)
    with open(os.path.join(here, "corpus", kind, name), "wb") as f:
        f.write(data)


def safetensors(entries, data, metadata=None, pad=None, order=None):
    """entries: [(name, dtype, shape, begin, end)], header in `order` (default as given)."""
    header = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, begin, end in (order or entries):
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8 if pad is None else pad)
    return struct.pack("<Q", len(text)) + text + data


f32 = struct.pack("<3f", 1.0, -2.5, 3.0)
write("safetensors", "two_f32", safetensors([("a", "F32", [2], 0, 8), ("b", "F32", [1], 8, 12)], f32,
                                            metadata={"precision": "amp-bf16", "epoch": "3"}))
every = [("f64", "F64", [1], 0, 8), ("f32", "F32", [2], 8, 16), ("bf16", "BF16", [2], 16, 20),
         ("f16", "F16", [1, 2], 20, 24), ("i64", "I64", [], 24, 32), ("u8", "U8", [3], 32, 35),
         ("empty", "F32", [0, 4], 35, 35)]
write("safetensors", "every_dtype", safetensors(every, bytes(range(35))))
write("safetensors", "out_of_order_padded",
      safetensors([("a", "F32", [2], 0, 8), ("b", "F32", [1], 8, 12)], f32, metadata={"x": "y"}, pad=13,
                  order=[("b", "F32", [1], 8, 12), ("a", "F32", [2], 0, 8)]))
write("safetensors", "empty", safetensors([], b""))
write("safetensors", "overlap", safetensors([("a", "F32", [2], 0, 8), ("b", "F32", [1], 4, 8)], f32[:8]))
write("safetensors", "truncated", safetensors([("a", "F32", [2], 0, 8), ("b", "F32", [1], 8, 12)], f32[:10]))
write("safetensors", "f8", safetensors([("a", "F8_E4M3", [4], 0, 4)], b"\x01\x02\x03\x04"))


def idx(dims, payload):
    return bytes([0, 0, 8, len(dims)]) + b"".join(struct.pack(">I", d) for d in dims) + payload


labels = idx([10], bytes(range(10)))
images = idx([2, 3, 3], bytes(range(18)))
write("idx", "labels", labels)
write("idx", "images", images)
write("idx", "labels.gz", gzip.compress(labels, mtime=0))
write("idx", "images.gz", gzip.compress(images, mtime=0))
write("idx", "two_members.gz", gzip.compress(images[:10], mtime=0) + gzip.compress(images[10:], mtime=0))
write("idx", "truncated", images[:-3])
