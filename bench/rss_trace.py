#!/usr/bin/env python3
"""Traces a process's resident memory until it exits, and breaks its peak down by mapping.

Every half second: /proc/PID/smaps_rollup's Rss, Anonymous and file-backed parts (one line of the
trace: seconds since the start, anonymous kB, file kB). Whenever the resident total passes its
previous peak by 16 MiB or more, the whole /proc/PID/smaps is read and kept: at the end the peak's
mappings are grouped (the heap, glibc's per-thread arenas (64 MiB reservations), thread stacks,
other anonymous mappings by size, files) and printed as JSON on stdout.

Usage: bench/rss_trace.py PID T0 TRACE_FILE
"""
import json
import re
import sys
import time

HEAD = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) (\S+) \S+ \S+ \S+\s*(.*)$")


def rollup(pid):
    v = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 2 and parts[0].endswith(":") and parts[1].isdigit():
                v[parts[0][:-1]] = int(parts[1])
    return v


def mappings(pid):
    out, cur = [], None
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            m = HEAD.match(line)
            if m:
                cur = {"size_kb": (int(m.group(2), 16) - int(m.group(1), 16)) // 1024, "perms": m.group(3),
                       "name": m.group(4).strip(), "rss_kb": 0, "start": int(m.group(1), 16)}
                out.append(cur)
            elif cur is not None and line.startswith("Rss:"):
                cur["rss_kb"] = int(line.split()[1])
    return out


def group(maps):
    """Resident kB by kind. An arena is a 64 MiB-aligned reservation split into its used part and
    a PROT_NONE rest; both halves are attributed to it."""
    kinds = {}
    arena_starts = {m["start"] for m in maps if m["start"] % (64 << 20) == 0 and not m["name"]}

    def add(kind, kb):
        kinds[kind] = kinds.get(kind, 0) + kb

    prev_end_arena = None
    for m in maps:
        name, kb = m["name"], m["rss_kb"]
        if name == "[heap]":
            add("heap (brk)", kb)
        elif name.startswith("[stack"):
            add("main stack", kb)
        elif name.startswith("/"):
            add("files (" + ("executable" if "zoe" in name.rsplit("/", 1)[-1] else "libraries") + ")", kb)
        elif name:
            add(name, kb)
        elif m["start"] in arena_starts or (prev_end_arena == m["start"] and m["perms"].startswith("---")):
            add("malloc arenas", kb)
        elif m["size_kb"] <= 8200:
            add("anonymous <= 8 MiB (thread stacks, small mmaps)", kb)
        else:
            add("anonymous > 8 MiB (buffers)", kb)
        in_arena = m["start"] in arena_starts
        prev_end_arena = m["start"] + m["size_kb"] * 1024 if in_arena else None
    big = sorted((m for m in maps if m["rss_kb"] >= 32 << 10), key=lambda m: -m["rss_kb"])
    return kinds, [{"rss_mb": round(m["rss_kb"] / 1024, 1), "size_mb": round(m["size_kb"] / 1024, 1),
                    "name": m["name"] or "anonymous"} for m in big[:24]]


def main():
    pid, t0, trace = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
    peak_kb, peak = 0, None
    with open(trace, "a") as out:
        while True:
            try:
                r = rollup(pid)
                t = time.time() - t0
                total = r.get("Rss", 0)
                out.write(f"{t:.2f} {r.get('Anonymous', 0)} {total - r.get('Anonymous', 0)}\n")
                if total >= peak_kb + (16 << 10):
                    peak_kb, maps = total, mappings(pid)
                    peak = {"t": round(t, 1), "rss_kb": total, "maps": maps}
            except (FileNotFoundError, ProcessLookupError, PermissionError):
                break
            time.sleep(0.5)
    if peak is None:
        print("{}")
        return
    kinds, big = group(peak["maps"])
    print(json.dumps({"t": peak["t"], "rss_mb": round(peak["rss_kb"] / 1024, 1),
                      "kinds_mb": {k: round(v / 1024, 1) for k, v in sorted(kinds.items(), key=lambda x: -x[1])},
                      "largest": big}))


if __name__ == "__main__":
    main()
