#!/usr/bin/env python3
"""Fails when an #include points up zoe's layer map (docs/architecture.md).

Each folder may include headers of the folders listed for it (and its own). A line that includes
a header of any other zoe folder is reported as file:line with the rule it breaks. Third-party and
system headers (<...>) are not checked.
Usage: scripts/check-layers.py [repo root]
"""
import os
import re
import sys

CORE = ["include/zoe", "src/core"]
# folder -> the zoe folders it may include (besides itself)
ALLOWED = {
    "include/zoe": [],
    "src/core": ["include/zoe"],
    "io": CORE,
    "src/device": CORE,
    "src/comm": CORE,
    "src/optim": CORE,
    "src/config": CORE,
    # optim/lowbit.h's packed state formats: checkpoints store and convert them.
    "src/checkpoint": CORE + ["src/optim"],
    "src/model": CORE,
    "offload": CORE + ["io", "src/device"],
    "src/zero": CORE + ["io", "src/device", "src/comm", "src/optim", "src/config", "src/checkpoint", "offload"],
    "src/export": CORE + ["src/checkpoint", "src/model"],
    "src/plan": CORE + ["io", "src/device", "src/comm", "src/optim", "src/config", "src/checkpoint", "offload",
                        "src/zero", "src/model"],
    # The Python extension: the public API only, as a user's own binding would be.
    "python": ["include/zoe"],
    "examples": ["include/zoe"],
    "src/cli": CORE + ["io", "src/device", "src/comm", "src/optim", "src/config", "src/checkpoint", "offload",
                       "src/zero", "src/model", "src/export", "src/plan"],
    # The zoe program and `zoe train`: the public headers and the reference model's only (and its
    # own files), as a user's program would be.
    "tools": ["include/zoe", "src/model"],
    "tests": None,   # tests and benchmarks reach anything
    "bench": None,
}
SOURCES = (".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh", ".inc")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def folder_of(rel):
    parts = rel.split("/")
    if parts[0] in ("src", "include") and len(parts) > 2:
        return parts[0] + "/" + parts[1]
    return parts[0]


def target_of(inc, root):
    first = inc.split("/")[0]
    if first == "zoe":
        return "include/zoe"
    if first in ("io", "offload", "tools", "tests", "bench", "python", "examples"):
        return first
    if os.path.isdir(os.path.join(root, "src", first)):
        return "src/" + first
    return None  # a header next to the file, or not zoe's


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
    bad = []
    checked = 0
    for top in ALLOWED:
        base = os.path.join(root, top)
        if not os.path.isdir(base):
            continue
        for dirpath, dirnames, files in os.walk(base):
            dirnames[:] = [d for d in dirnames if not d.startswith("build")]
            for f in files:
                if not f.endswith(SOURCES):
                    continue
                path = os.path.join(dirpath, f)
                rel = os.path.relpath(path, root)
                src = folder_of(rel)
                allowed = ALLOWED.get(src, ALLOWED.get(top))
                checked += 1
                if allowed is None:
                    continue
                with open(path, errors="replace") as fh:
                    for n, line in enumerate(fh, 1):
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        tgt = target_of(m.group(1), root)
                        if tgt is None or tgt == src or tgt in allowed:
                            continue
                        bad.append(f"{rel}:{n}: includes \"{m.group(1)}\" ({tgt}), but {src} may include only "
                                   f"{', '.join(allowed) or 'itself'}")
    for b in bad:
        print(b, file=sys.stderr)
    if bad:
        print(f"check-layers: {len(bad)} include(s) point up the layer map (docs/architecture.md)", file=sys.stderr)
        return 1
    print(f"check-layers: {checked} files follow the layer map", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
