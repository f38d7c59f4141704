"""A small safetensors reader and writer for torch tensors, written from the format's
specification (Debian has no `safetensors` module): 8-byte little-endian header length, a
UTF-8 JSON header {name: {dtype, shape, data_offsets}, "__metadata__": {str: str}}, then the
raw little-endian tensor bytes.

  tensors, metadata = load("ck.st")           # dict name -> torch.Tensor (file order), dict
  save("model.st", model.state_dict(), {"model": "mlp"})

For the interop tests and for users without the safetensors package; not a validator (mixprec's
reader is the strict one).
"""

import json
import struct

import torch

DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "I64": torch.int64,
    "U8": torch.uint8,
}
NAMES = {v: k for k, v in DTYPES.items()}


def load(path):
    """Returns ({name: tensor} in file order, {metadata key: value})."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ValueError(f"{path}: {len(data)} bytes, shorter than the 8-byte header length")
    (n,) = struct.unpack_from("<Q", data, 0)
    if 8 + n > len(data):
        raise ValueError(f"{path}: header of {n} bytes does not fit in {len(data)}")
    header = json.loads(data[8:8 + n].decode("utf-8"))
    body = memoryview(data)[8 + n:]
    metadata = header.pop("__metadata__", {}) or {}
    tensors = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        dtype = DTYPES[info["dtype"]]
        shape = list(info["shape"])
        if not 0 <= begin <= end <= len(body):
            raise ValueError(f"{path}: {name}: offsets [{begin}, {end}) outside the {len(body)} data bytes")
        raw = bytearray(body[begin:end])  # a copy: the tensor owns (and may write) its bytes
        t = torch.frombuffer(raw, dtype=dtype) if raw else torch.empty(0, dtype=dtype)
        tensors[name] = t.reshape(shape)
    return tensors, metadata


def save(path, tensors, metadata=None, order=None, pad_to=8):
    """Writes tensors (a dict or a state_dict) with metadata; `order`: the names in the order to
    store them (default: as given). The header is padded with spaces to a multiple of pad_to."""
    names = list(order) if order is not None else list(tensors.keys())
    header, chunks, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name in names:
        t = tensors[name].detach().contiguous().cpu()
        if t.dtype not in NAMES:
            raise ValueError(f"{name}: dtype {t.dtype} has no safetensors name here")
        # Bytes through a same-width integer view: numpy has no bfloat16.
        width = t.element_size()
        as_int = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[width]
        raw = t.reshape(-1).view(as_int).numpy().tobytes()
        header[name] = {"dtype": NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % pad_to)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for c in chunks:
            f.write(c)
