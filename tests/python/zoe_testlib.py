"""Helpers for zoe's Python tests: finding and running the zoe binary, reading safetensors."""
import json
import os
import struct
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def zoe_bin():
    """The zoe binary: $ZOE_BIN (set by ctest), else build-dev/bin/zoe of this checkout."""
    path = os.environ.get("ZOE_BIN") or str(REPO / "build-dev" / "bin" / "zoe")
    if not os.access(path, os.X_OK):
        pytest.skip(f"zoe binary {path} not built (set ZOE_BIN)")
    return path


def run_zoe(*args, json_out=True, check=True, timeout=300):
    """Runs `zoe args...`; returns its parsed JSON stdout (or the CompletedProcess)."""
    p = subprocess.run([zoe_bin(), *map(str, args)], capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"zoe {' '.join(map(str, args))} exited {p.returncode}:\n{p.stderr}")
    return json.loads(p.stdout) if json_out and p.returncode == 0 else p


def read_safetensors(path):
    """{name: numpy array} and the metadata of a safetensors file, parsed by hand: an 8-byte
    little-endian header length, the JSON header, then the raw little-endian data."""
    import numpy as np

    raw = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    data = raw[8 + n :]
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        a, b = e["data_offsets"]
        buf = data[a:b]
        if e["dtype"] == "F32":
            arr = np.frombuffer(buf, dtype="<f4")
        elif e["dtype"] == "F16":
            arr = np.frombuffer(buf, dtype="<f2").astype(np.float32)
        elif e["dtype"] == "BF16":
            arr = (np.frombuffer(buf, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            raise AssertionError(f"{path}: tensor {name}: unexpected dtype {e['dtype']}")
        out[name] = arr.reshape(e["shape"]).copy()
    return out, header.get("__metadata__", {})
