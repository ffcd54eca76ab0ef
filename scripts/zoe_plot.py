#!/usr/bin/python3
"""zoe_plot: draws zoe's --json output as a PNG with matplotlib.

  train     (zoe train --json): the loss per step with the evaluations, and the time of a step
            split into compute, communication, I/O stall and optimizer (per step when the JSON has
            `step_time_s`, a list of {compute, comm, io_stall, optimizer}; else the run's mean).
  bench-io  (zoe bench io --json): GB/s against the block size (one line per engine, rw, queue
            depth) and against the queue depth (one line per engine, rw, block size).
  tune      (zoe tune --verify K --json, or its {"verified": [...], "io_sweep": [...]}): predicted
            against measured step time per verified candidate, as bars and as a scatter around the
            y = x line; with the calibration's I/O sweep, read and write GB/s as heat maps over
            aio.block_size x aio.queue_depth.

usage: zoe_plot.py [--kind auto|train|bench-io|tune] [--width PX] [--height PX] IN.json|- OUT.png
       zoe_plot.py --check      (exit 0 when matplotlib imports, else 3)
Exit codes: 0 written; 2 bad arguments or JSON; 3 matplotlib missing (Debian: python3-matplotlib)."""
import argparse
import json
import sys

EXIT_USAGE, EXIT_NO_MATPLOTLIB = 2, 3
DPI = 100
TIME_PARTS = [("compute", "compute"), ("comm", "communication"), ("io_stall", "I/O stall"),
              ("optimizer", "optimizer")]


def die(code, msg):
    print(f"zoe_plot: {msg}", file=sys.stderr)
    sys.exit(code)


def detect(j):
    if isinstance(j, dict) and "losses" in j:
        return "train"
    if isinstance(j, dict) and isinstance(j.get("verified"), list):
        return "tune"
    if isinstance(j, dict) and isinstance(j.get("rows"), list) and all("gbps" in r for r in j["rows"]):
        return "bench-io"
    die(EXIT_USAGE, "cannot tell the kind of this JSON (expected zoe train --json with 'losses' or "
                    "zoe bench io --json with 'rows'): pass --kind")


def human_bytes(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:g} {unit}" if unit == "B" else f"{n:.0f} {unit}" if n == int(n) else f"{n:.1f} {unit}"
        n /= 1024


def plot_train(plt, j, fig):
    losses = j.get("losses")
    if not isinstance(losses, list) or not losses:
        die(EXIT_USAGE, "train JSON: 'losses' must be a non-empty list of numbers")
    start = int(j.get("start_step", 0))
    ax1, ax2 = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})
    steps = list(range(start + 1, start + 1 + len(losses)))
    ax1.plot(steps, losses, label="train loss", color="tab:blue")
    evals = [e for e in j.get("evals", []) if isinstance(e, dict) and "eval_loss" in e]
    if evals:
        ax1.plot([e["step"] for e in evals], [e["eval_loss"] for e in evals], "o-", color="tab:orange",
                 label="eval loss")
    elif isinstance(j.get("eval_loss"), (int, float)):
        ax1.plot([steps[-1]], [j["eval_loss"]], "o", color="tab:orange", label="eval loss (end)")
    ax1.set_xlabel("step")
    ax1.set_ylabel("loss (mean cross-entropy)")
    model = j.get("model", {})
    ax1.set_title(f"zoe train: {j.get('params', '?')} parameters, {model.get('layers', '?')} layers, "
                  f"{j.get('precision', '?')}", fontsize=10)
    ax1.grid(alpha=0.3)
    ax1.legend()

    per_step = j.get("step_time_s")
    if isinstance(per_step, list) and per_step:
        xs = list(range(start + 1, start + 1 + len(per_step)))
        ys = [[float(s.get(k, 0)) * 1e3 for s in per_step] for k, _ in TIME_PARTS]
        ax2.stackplot(xs, ys, labels=[n for _, n in TIME_PARTS])
        ax2.set_xlabel("step")
        ax2.set_title("time per step", fontsize=10)
    else:
        t = j.get("time_s", {})
        n = max(1, int(j.get("steps", len(losses))) - start)
        bottom = 0.0
        for k, name in TIME_PARTS:
            v = float(t.get(k, 0)) / n * 1e3
            ax2.bar(["mean step"], [v], bottom=[bottom], label=name)
            bottom += v
        ax2.set_title(f"time per step (mean of {n})", fontsize=10)
    ax2.set_ylabel("ms")
    ax2.legend(fontsize=8)
    ax2.grid(alpha=0.3, axis="y")


def plot_bench_io(plt, j, fig):
    rows = j.get("rows")
    if not rows:
        die(EXIT_USAGE, "bench-io JSON: 'rows' is empty")
    ax1, ax2 = fig.subplots(1, 2)
    series = {}
    for r in rows:
        series.setdefault((r["engine"], r["rw"], r["qd"]), []).append((r["bs"], r["gbps"]))
    for (eng, rw, qd), pts in sorted(series.items()):
        pts.sort()
        ax1.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=f"{eng} {rw} qd {qd}")
    ax1.set_xscale("log", base=2)
    bss = sorted({r["bs"] for r in rows})
    ax1.set_xticks(bss)
    ax1.set_xticklabels([human_bytes(b) for b in bss], rotation=30, fontsize=8)
    ax1.set_xlabel("block size")
    ax1.set_ylabel("GB/s")
    ax1.set_title("bandwidth against block size", fontsize=10)
    ax1.grid(alpha=0.3)
    ax1.legend(fontsize=7)
    series = {}
    for r in rows:
        series.setdefault((r["engine"], r["rw"], r["bs"]), []).append((r["qd"], r["gbps"]))
    for (eng, rw, bs), pts in sorted(series.items()):
        pts.sort()
        ax2.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=f"{eng} {rw} bs {human_bytes(bs)}")
    ax2.set_xscale("log", base=2)
    qds = sorted({r["qd"] for r in rows})
    ax2.set_xticks(qds)
    ax2.set_xticklabels([str(q) for q in qds])
    ax2.set_xlabel("queue depth")
    ax2.set_title("bandwidth against queue depth", fontsize=10)
    ax2.grid(alpha=0.3)
    ax2.legend(fontsize=7)
    cfg = j.get("config", {})
    fig.suptitle(f"zoe bench io: {human_bytes(cfg.get('size', 0))}, O_DIRECT "
                 f"{'on' if cfg.get('direct') else 'off'}", fontsize=11)


def plot_io_heat(fig, ax, sweep, key, title):
    bss = sorted({int(p["block_size"]) for p in sweep})
    qds = sorted({int(p["queue_depth"]) for p in sweep})
    grid = [[float("nan")] * len(bss) for _ in qds]
    for p in sweep:
        grid[qds.index(int(p["queue_depth"]))][bss.index(int(p["block_size"]))] = float(p[key])
    im = ax.imshow(grid, origin="lower", aspect="auto", cmap="viridis")
    ax.set_xticks(range(len(bss)))
    ax.set_xticklabels([human_bytes(b) for b in bss], fontsize=8)
    ax.set_yticks(range(len(qds)))
    ax.set_yticklabels([str(q) for q in qds], fontsize=8)
    ax.set_xlabel("aio.block_size")
    ax.set_ylabel("aio.queue_depth")
    ax.set_title(f"calibration: {title}", fontsize=10)
    for yi, row in enumerate(grid):
        for xi, v in enumerate(row):
            if v == v:
                ax.text(xi, yi, f"{v:.2f}", ha="center", va="center", fontsize=8, color="white")
    fig.colorbar(im, ax=ax)


def plot_tune(plt, j, fig):
    runs = j.get("verified")
    if not runs:
        die(EXIT_USAGE, "tune JSON: 'verified' is empty (run zoe tune with --verify K)")
    sweep = j.get("io_sweep") or []
    if sweep:
        axes = fig.subplots(2, 2, gridspec_kw={"width_ratios": [3, 2]})
        (ax1, ax2), (ax3, ax4) = axes
        plot_io_heat(fig, ax3, sweep, "read_gbps", "NVMe read GB/s")
        plot_io_heat(fig, ax4, sweep, "write_gbps", "NVMe write GB/s")
    else:
        ax1, ax2 = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})
    pred = [float(r["predicted_step_s_as_measured"]) for r in runs]
    whole = all(r.get("with_compute") for r in runs)
    meas = [float(r["measured_step_s"]) for r in runs]
    names = [f"{i + 1}. {r['placement']}" for i, r in enumerate(runs)]
    xs = range(len(runs))
    w = 0.4
    ax1.bar([x - w / 2 for x in xs], pred, w, label="predicted", color="tab:blue")
    ax1.bar([x + w / 2 for x in xs], meas, w, label="measured", color="tab:orange")
    ax1.set_xticks(list(xs))
    ax1.set_xticklabels(names, rotation=20, ha="right", fontsize=7)
    ax1.set_ylabel("step time (s)" if whole else "step time without the model's compute (s)")
    ax1.set_title("verified candidates, in predicted order", fontsize=10)
    ax1.grid(axis="y", alpha=0.3)
    ax1.legend(fontsize=8)
    ax2.scatter(pred, meas, color="tab:purple")
    for i, (p, m) in enumerate(zip(pred, meas)):
        ax2.annotate(str(i + 1), (p, m), textcoords="offset points", xytext=(4, 4), fontsize=8)
    hi = max(pred + meas) * 1.1
    ax2.plot([0, hi], [0, hi], "--", color="gray", label="y = x")
    ax2.plot([0, hi], [0, hi * 1.2], ":", color="gray", label="+-20 %")
    ax2.plot([0, hi], [0, hi / 1.2], ":", color="gray")
    ax2.set_xlim(0, hi)
    ax2.set_ylim(0, hi)
    ax2.set_xlabel("predicted (s)")
    ax2.set_ylabel("measured (s)")
    ax2.set_title("measured against predicted", fontsize=10)
    ax2.grid(alpha=0.3)
    ax2.legend(fontsize=8)
    fig.suptitle("zoe tune --verify", fontsize=11)


def import_pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        die(EXIT_NO_MATPLOTLIB, f"matplotlib is not installed for {sys.executable} ({e}); Debian: "
                                "apt-get install python3-matplotlib")
    return plt


def main():
    if sys.argv[1:] == ["--check"]:
        import_pyplot()
        return 0
    ap = argparse.ArgumentParser(description="Plot zoe's --json output.")
    ap.add_argument("--kind", default="auto", choices=["auto", "train", "bench-io", "tune"])
    ap.add_argument("--width", type=int, default=1200, help="PNG width in pixels")
    ap.add_argument("--height", type=int, default=800, help="PNG height in pixels")
    ap.add_argument("input", help="the JSON file, or - for stdin")
    ap.add_argument("output", help="the PNG to write")
    a = ap.parse_args()
    if not (16 <= a.width <= 20000 and 16 <= a.height <= 20000):
        die(EXIT_USAGE, f"--width {a.width} --height {a.height}: expected 16 .. 20000 pixels each")
    try:
        text = sys.stdin.read() if a.input == "-" else open(a.input, encoding="utf-8").read()
    except OSError as e:
        die(EXIT_USAGE, f"cannot read {a.input}: {e.strerror}")
    try:
        j = json.loads(text)
    except json.JSONDecodeError as e:
        die(EXIT_USAGE, f"{a.input}: not JSON ({e.msg} at line {e.lineno}, column {e.colno})")
    kind = detect(j) if a.kind == "auto" else a.kind
    plt = import_pyplot()
    fig = plt.figure(figsize=(a.width / DPI, a.height / DPI), dpi=DPI)
    try:
        {"train": plot_train, "bench-io": plot_bench_io, "tune": plot_tune}[kind](plt, j, fig)
    except (KeyError, TypeError, ValueError) as e:
        die(EXIT_USAGE, f"{a.input}: not the JSON of {kind} ({type(e).__name__}: {e})")
    fig.tight_layout()
    try:
        fig.savefig(a.output, dpi=DPI, format="png")  # no bbox_inches: the PNG keeps the size asked
    except OSError as e:
        die(EXIT_USAGE, f"cannot write {a.output}: {e.strerror}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
