#!/usr/bin/env python3
"""Fails when a C++ source file of zoe is longer than the limit (default 700 lines).

A long file holds several concepts; each concept belongs in a file of its own whose first line
says what it holds (STYLE.md: one concept per file). Checked folders: src/, io/, offload/ and
tools/ (build folders skipped); checked files: C++ and CUDA sources and headers (.h, .hpp, .cpp,
.cc, .cu, .cuh). A file's length is its count of lines.
Usage: scripts/check-file-length.py [--limit N] [--list] [repo root]
  --list   print every file over the limit (and the longest ones) without failing
"""
import os
import sys

FOLDERS = ["src", "io", "offload", "tools"]
SOURCES = (".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh")


def line_count(path):
    with open(path, "rb") as f:
        data = f.read()
    return data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)


def sources(root):
    for top in FOLDERS:
        for dirpath, dirnames, files in os.walk(os.path.join(root, top)):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("build"))
            for f in sorted(files):
                if f.endswith(SOURCES):
                    yield os.path.join(dirpath, f)


def main():
    args = sys.argv[1:]
    limit = 700
    listing = False
    if "--list" in args:
        listing = True
        args.remove("--list")
    if "--limit" in args:
        k = args.index("--limit")
        limit = int(args[k + 1])
        del args[k:k + 2]
    root = os.path.abspath(args[0] if args else os.path.join(os.path.dirname(__file__), ".."))
    lengths = sorted(((line_count(p), os.path.relpath(p, root)) for p in sources(root)), reverse=True)
    long = [(n, rel) for n, rel in lengths if n > limit]
    for n, rel in (lengths[:10] if listing else long):
        print(f"{rel}: {n} lines (limit {limit})")
    if listing:
        return 0
    if long:
        print(f"check-file-length: {len(long)} of {len(lengths)} files are over {limit} lines; split each "
              "by concept, one file per concept", file=sys.stderr)
        return 1
    print(f"check-file-length: {len(lengths)} files, none over {limit} lines", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
