#!/usr/bin/env python3
"""zoe against DeepSpeed, side by side, on the same Hugging Face model, the same ds_config.json
and the same batches (bench/vs_deepspeed/run.sh sets up the venv and calls this).

    vs_deepspeed.py cell --out DIR --model gpt2 --offload nvme --precision fp32 [...]
        one cell of the matrix: writes DIR/configs/<cell>.json (the one ds_config.json file both
        engines read), starts one worker process per engine (worker.py), alternates them round by
        round (each round: --steps-per-round steps of one engine, then of the other; the first
        engine changes every round), and writes DIR/cells/<cell>.json with a row per engine.
        --busy N: a busy machine beside the quiet one: twice the rounds, every second one with N
        processes spinning on the CPU (stopped between those rounds); each row then also has
        busy_step_s, the median busy step.
    vs_deepspeed.py reference --out DIR --model gpt2
        the fp32 reference: the same model, batches and steps through plain torch.optim.AdamW
        (the config's lr, betas, eps, weight_decay and gradient_clipping; no ZeRO, no offload),
        written to DIR/reference/<model>-fp32.json; the report compares every fp32 row's losses
        with it (loss_max_rel_diff_torch).
    vs_deepspeed.py report --out DIR
        DIR/results.json ({"machine", "versions", "rows"}), DIR/results.md and DIR/step_time.png
        from the cells written.

Per row: the median step after --warmup steps (s/step and tokens/s), the peak RSS of the
engine's process while it trained (VmHWM, reset after initialisation; the initialisation's own
peak is init_peak_rss_bytes), the disk bytes read and written per step (/proc/<pid>/io's
read_bytes and write_bytes, the same counters for both engines), the loss of every step, and
error: null, or the engine's exception verbatim (a row with an error has no timings)."""
import argparse
import json
import os
import platform
import select
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ENGINES = ("zoe", "deepspeed")
OFFLOADS = ("none", "cpu", "nvme")
PRECISIONS = ("fp32", "bf16")
# tiny: the harness's own test; gpt2b: zoe's 2b preset's shape (2.05B), for the size check only
MODELS = ("gpt2", "llama300m", "gpt2b", "tiny")
VOCAB = {"gpt2": 50257, "llama300m": 32000, "gpt2b": 256, "tiny": 512}


def cell_name(model, offload, precision):
    return f"{model}-{offload}-{precision}"


def ds_config(batch, offload, precision, nvme_path, max_in_cpu=None):
    """The ds_config.json of a cell: ZeRO stage 3, AdamW, clipping; offload of parameters and
    optimizer states to the CPU or NVMe. max_in_cpu: offload_param.max_in_cpu when given (None:
    the key left out, so both engines take its default, 1e9 elements kept in host memory)."""
    zero = {"stage": 3}
    if offload == "cpu":
        zero["offload_param"] = {"device": "cpu"}
        zero["offload_optimizer"] = {"device": "cpu"}
    elif offload == "nvme":
        zero["offload_param"] = {"device": "nvme", "nvme_path": nvme_path}
        if max_in_cpu is not None:
            zero["offload_param"]["max_in_cpu"] = max_in_cpu
        zero["offload_optimizer"] = {"device": "nvme", "nvme_path": nvme_path}
    cfg = {"train_micro_batch_size_per_gpu": batch, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
           "optimizer": {"type": "AdamW",
                         "params": {"lr": 1e-4, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01}},
           "zero_optimization": zero, "steps_per_print": 1000000}
    if precision == "bf16":
        cfg["bf16"] = {"enabled": True}
    return cfg


def make_batches(path, model, n, batch, seq, seed):
    import torch
    g = torch.Generator().manual_seed(seed + 1)
    torch.save([torch.randint(0, VOCAB[model], (batch, seq), generator=g) for _ in range(n)], path)


class Worker:
    """One engine's process: requests and replies are JSON lines; its stderr goes to a log file."""

    def __init__(self, engine, args, config_path, batches_path, log_path, timeout):
        self.engine = engine
        self.timeout = timeout
        self.log_path = log_path
        self.log = open(log_path, "w")
        env = dict(os.environ)
        env.setdefault("PYTHONUNBUFFERED", "1")
        cmd = [sys.executable, str(HERE / "worker.py"), "--engine", engine, "--model", args.model,
               "--config", str(config_path), "--batches", str(batches_path), "--seed", str(args.seed)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
                                     text=True, env=env)
        self.error = None
        self.info = {}

    def read(self, timeout):
        """The next reply, or None with self.error set (the process died, hung or replied an error)."""
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            if not ready:
                self.error = f"no reply within {timeout:.0f} s (killed)"
                self.proc.kill()
            else:
                status = self.proc.wait()
                self.error = f"the process exited with status {status}: {self.stderr_tail()}"
            return None
        reply = json.loads(line)
        if "error" in reply:
            self.error = reply["error"]
            return None
        return reply

    def stderr_tail(self, lines=6):
        self.log.flush()
        text = Path(self.log_path).read_text(errors="replace").strip().splitlines()
        return " | ".join(text[-lines:])

    def start(self):
        reply = self.read(self.timeout)
        if reply is not None:
            self.info = reply
        return reply is not None

    def request(self, obj):
        if self.error:
            return None
        try:
            self.proc.stdin.write(json.dumps(obj) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            self.error = f"the process exited with status {self.proc.wait()}: {self.stderr_tail()}"
            return None
        return self.read(self.timeout)

    def close(self):
        reply = self.request({"quit": True}) if self.proc.poll() is None and not self.error else None
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        return reply


def median_of(steps, key):
    vals = [s[key] for s in steps]
    return statistics.median(vals) if vals else None


def make_row(args, engine, worker, steps, peak):
    """A results.json row: the measured steps are those after the warm-up (with --busy, step_s
    from the quiet rounds' and busy_step_s from the busy rounds')."""
    measured = [s for s in steps if s["i"] >= args.warmup and not s.get("busy")]
    busy = [s for s in steps if s["i"] >= args.warmup and s.get("busy")]
    tokens = args.batch * args.seq
    step_s = median_of(measured, "step_s")
    breakdown = {}
    for k in sorted({k for s in measured for k in s["breakdown"]}):
        vals = [s["breakdown"][k] for s in measured if k in s["breakdown"]]
        breakdown[k] = statistics.median(vals)
    row = {"model": args.model, "offload": args.offload, "precision": args.precision, "engine": engine,
           "step_s": step_s, "tokens_per_s": tokens / step_s if step_s else None,
           "peak_rss_bytes": peak, "init_peak_rss_bytes": worker.info.get("init_peak_rss_bytes"),
           "nvme_read_bytes": statistics.mean([s["read_bytes"] for s in measured]) if measured else None,
           "nvme_write_bytes": statistics.mean([s["write_bytes"] for s in measured]) if measured else None,
           "losses": [s["loss"] for s in steps], "error": worker.error,
           "forward_s": median_of(measured, "forward_s"), "backward_s": median_of(measured, "backward_s"),
           "optimizer_s": median_of(measured, "optimizer_s"), "init_s": worker.info.get("init_s"),
           "breakdown": breakdown, "params": worker.info.get("params"), "threads": worker.info.get("threads"),
           "batch": args.batch, "seq": args.seq, "steps": len(steps), "warmup": args.warmup,
           "step_times": [s["step_s"] for s in steps if not s.get("busy")],
           "busy_cores": args.busy, "busy_step_s": median_of(busy, "step_s") if args.busy else None,
           "busy_forward_s": median_of(busy, "forward_s") if args.busy else None,
           "busy_backward_s": median_of(busy, "backward_s") if args.busy else None,
           "busy_optimizer_s": median_of(busy, "optimizer_s") if args.busy else None,
           "busy_step_times": [s["step_s"] for s in steps if s.get("busy")]}
    if worker.error:
        for k in ("step_s", "busy_step_s", "busy_forward_s", "busy_backward_s", "busy_optimizer_s",
                  "tokens_per_s", "nvme_read_bytes", "nvme_write_bytes", "forward_s", "backward_s",
                  "optimizer_s"):
            row[k] = None
    return row


def batches_file(args, out):
    """The token batches of args' model, size and seed for rounds x steps_per_round steps: one file
    per shape under out, made once, which every cell and the reference read."""
    n = args.rounds * args.steps_per_round
    batches = out / f"batches-{args.model}-{args.batch}x{args.seq}-{n}.pt"
    if not batches.exists():
        make_batches(batches, args.model, n, args.batch, args.seq, args.seed)
    return batches


def _die_with_parent():
    """In a spinner, before it runs: the kernel kills it when the harness ends, however it ends
    (a SIGTERM or SIGKILL skips run_cell's cleanup, and a spinner left behind would hold a core)."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL


def spinners(n):
    """n processes spinning on the CPU, stopped (SIGSTOP) until a busy round continues them."""
    import signal

    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"], preexec_fn=_die_with_parent)
             for _ in range(n)]
    for p in procs:
        p.send_signal(signal.SIGSTOP)
    return procs


def set_busy(procs, on):
    import signal

    for p in procs:
        p.send_signal(signal.SIGCONT if on else signal.SIGSTOP)


def run_cell(args):
    out = Path(args.out)
    if args.busy:
        args.rounds *= 2  # quiet and busy rounds in turn
    name = cell_name(args.model, args.offload, args.precision)
    for d in ("configs", "cells", "logs"):
        (out / d).mkdir(parents=True, exist_ok=True)
    batches = batches_file(args, out)
    os.makedirs(args.nvme_path, exist_ok=True)
    nvme = tempfile.mkdtemp(prefix="zoe-vs-deepspeed-", dir=args.nvme_path)
    config_path = out / "configs" / f"{name}.json"
    cfg = ds_config(args.batch, args.offload, args.precision, nvme, args.max_in_cpu)
    config_path.write_text(json.dumps(cfg, indent=2) + "\n")
    print(f"[{name}] {args.rounds} rounds x {args.steps_per_round} steps, micro-batch {args.batch} x {args.seq} "
          f"tokens, config {config_path}", file=sys.stderr)
    engines = [e for e in ENGINES if e in args.engines.split(",")]
    workers, steps, peaks = {}, {e: [] for e in engines}, {e: 0 for e in engines}
    spin = spinners(args.busy)
    try:
        for e in engines:  # one after the other: their initialisations do not overlap
            w = Worker(e, args, config_path, batches, out / "logs" / f"{name}-{e}.log", args.timeout)
            workers[e] = w
            t0 = time.perf_counter()
            ok = w.start()
            print(f"[{name}] {e}: " + (f"ready in {time.perf_counter() - t0:.1f} s" if ok else f"error: {w.error}"),
                  file=sys.stderr)
        for r in range(args.rounds):
            busy = bool(args.busy) and r % 2 == 1
            turn = r // 2 if args.busy else r
            order = engines if turn % 2 == 0 else engines[::-1]
            idx = list(range(r * args.steps_per_round, (r + 1) * args.steps_per_round))
            set_busy(spin, busy)
            for e in order:
                reply = workers[e].request({"steps": idx})
                if reply is None:
                    continue
                for st in reply["steps"]:
                    st["busy"] = busy
                steps[e] += reply["steps"]
                peaks[e] = max(peaks[e], reply["peak_rss_bytes"])
                times = " ".join(f"{s['step_s']:.2f}" for s in reply["steps"])
                what = f" ({args.busy} busy)" if busy else ""
                print(f"[{name}] round {r + 1}{what}: {e} s/step {times}", file=sys.stderr)
    finally:
        for p in spin:
            p.kill()  # SIGKILL ends a stopped process too
            p.wait()
        for w in workers.values():
            w.close()
        import shutil
        shutil.rmtree(nvme, ignore_errors=True)
    rows = [make_row(args, e, workers[e], steps[e], peaks[e] or None) for e in engines]
    diff = loss_diff(rows[0]["losses"], rows[1]["losses"]) if len(rows) == 2 else None
    for row in rows:
        row["loss_max_rel_diff"] = diff
    cell = {"cell": name, "config": json.loads(config_path.read_text()), "rows": rows,
            "workers": {e: workers[e].info for e in engines}, "zoe_commit": git_commit()}
    (out / "cells" / f"{name}.json").write_text(json.dumps(cell, indent=2) + "\n")
    for row in rows:
        what = f"error: {row['error']}" if row["error"] else \
            f"{row['step_s']:.3f} s/step, peak RSS {row['peak_rss_bytes'] / 2**30:.2f} GiB"
        print(f"[{name}] {row['engine']}: {what}", file=sys.stderr)
    if diff is not None:
        common = min(len(r["losses"]) for r in rows)
        print(f"[{name}] largest relative loss difference over {common} steps: {diff:.2e}", file=sys.stderr)
    return 0


def run_reference(args):
    """Plain torch AdamW over the cells' batches (the same file, seed and steps), one process."""
    out = Path(args.out)
    for d in ("configs", "reference", "logs"):
        (out / d).mkdir(parents=True, exist_ok=True)
    batches = batches_file(args, out)
    name = cell_name(args.model, "none", "fp32")
    config_path = out / "configs" / f"{name}-torch.json"
    config_path.write_text(json.dumps(ds_config(args.batch, "none", "fp32", args.nvme_path), indent=2) + "\n")
    args.offload, args.precision = "none", "fp32"
    w = Worker("torch", args, config_path, batches, out / "logs" / f"{args.model}-torch.log", args.timeout)
    steps = []
    try:
        if w.start():
            reply = w.request({"steps": list(range(args.rounds * args.steps_per_round))})
            steps = reply["steps"] if reply else []
    finally:
        w.close()
    ref = {"model": args.model, "precision": "fp32", "engine": "torch", "losses": [s["loss"] for s in steps],
           "step_times": [s["step_s"] for s in steps], "error": w.error, "version": w.info.get("version")}
    (out / "reference" / f"{args.model}-fp32.json").write_text(json.dumps(ref, indent=2) + "\n")
    print(f"[{args.model}] torch AdamW reference: " + (f"error: {w.error}" if w.error else f"{len(steps)} steps"),
          file=sys.stderr)
    return 0 if not w.error else 1


def attach_reference(out, rows):
    """loss_max_rel_diff_torch on every fp32 row whose model has a reference (None otherwise)."""
    refs = {}
    for f in sorted((out / "reference").glob("*-fp32.json")):
        r = json.loads(f.read_text())
        if not r.get("error") and r.get("losses"):
            refs[r["model"]] = r["losses"]
    for row in rows:
        ref = refs.get(row["model"]) if row["precision"] == "fp32" else None
        row["loss_max_rel_diff_torch"] = loss_diff(row.get("losses") or [], ref) if ref else None


def loss_diff(a, b):
    """max |a_i - b_i| / |b_i| over the steps both have (None when they have none in common)."""
    pairs = list(zip(a, b))
    if not pairs:
        return None
    return max(abs(x - y) / max(abs(y), 1e-30) for x, y in pairs)


# -------------------------------------------------------------------------------------------------
# The report


def machine_info():
    info = {"cpu": platform.processor(), "cpus": os.cpu_count(), "kernel": platform.release()}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
        flags = next(l for l in Path("/proc/cpuinfo").read_text().splitlines() if l.startswith("flags"))
        info["avx512"] = "avx512f" in flags.split()
        info["avx512_bf16"] = "avx512_bf16" in flags.split()
        info["amx_bf16"] = "amx_bf16" in flags.split()
    except (OSError, StopIteration):
        pass
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            info["mem_bytes"] = int(line.split()[1]) * 1024
    info["openblas_env"] = {k: v for k, v in os.environ.items() if k.startswith("OPENBLAS_")}
    return info


def versions(out):
    v = {"python": platform.python_version()}
    for mod in ("torch", "transformers", "deepspeed"):
        try:
            v[mod] = __import__(mod).__version__
        except Exception as e:  # noqa: BLE001 (recorded: DeepSpeed is absent where only zoe runs)
            v[mod] = f"not importable: {type(e).__name__}"
    try:
        v["zoe"] = subprocess.run(["zoe", "--version"], capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        v["zoe"] = ""
    # The checkout each cell ran from (a cell written before cells recorded it: the report's).
    commits = []
    for f in sorted((Path(out) / "cells").glob("*.json")):
        c = json.loads(f.read_text()).get("zoe_commit") or git_commit()
        if c not in commits:
            commits.append(c)
    v["zoe_commit"] = ", ".join(commits) or git_commit()
    return v


def git_commit():
    """The zoe checkout's commit (short), "" where git cannot tell."""
    try:
        return subprocess.run(["git", "-C", str(HERE), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def gib(x):
    return "-" if x is None else f"{x / 2**30:.2f}"


def mib(x):
    return "-" if x is None else f"{x / 2**20:.0f}"


def sec(x):
    return "-" if x is None else f"{x:.3f}"


def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def mean_step(row):
    """The mean step after the warm-up: a turn's drained update (zoe's last step of a turn) and its
    next first step (no update behind it) shift time between steps, not out of the turn."""
    times = (row.get("step_times") or [])[row.get("warmup", 0):]
    return statistics.mean(times) if times and not row.get("error") else None


def cell_rows(rows):
    """{(model, offload, precision): {engine: row}} in the matrix's order."""
    cells = {}
    for r in rows:
        cells.setdefault((r["model"], r["offload"], r["precision"]), {})[r["engine"]] = r
    order = {k: i for i, k in enumerate((m, o, p) for m in MODELS for p in PRECISIONS for o in OFFLOADS)}
    return dict(sorted(cells.items(), key=lambda kv: order.get(kv[0], len(order))))


def markdown(results):
    m, v = results["machine"], results["versions"]
    lines = [f"Machine: {m.get('cpu')}, {m.get('cpus')} CPUs, {gib(m.get('mem_bytes'))} GiB RAM, Linux "
             f"{m.get('kernel')}; torch {v.get('torch')}, transformers {v.get('transformers')}, DeepSpeed "
             f"{v.get('deepspeed')} (DS_ACCELERATOR=cpu, gloo), zoe {v.get('zoe_commit')}.", "",
             "| model | offload | precision | zoe s/step | DeepSpeed s/step | zoe / DS | zoe / DS, means | zoe tokens/s | DS tokens/s "
             "| zoe peak RSS GiB | DS peak RSS GiB | zoe NVMe read / write MiB per step | DS NVMe read / write MiB "
             "per step | max relative loss difference (steps) | vs torch AdamW: zoe / DS |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    notes = []
    for (model, off, prec), e in cell_rows(results["rows"]).items():
        z, d = e.get("zoe", {}), e.get("deepspeed", {})
        rs = ratio(z.get("step_s"), d.get("step_s"))
        rm = ratio(mean_step(z), mean_step(d))
        n = min(len(z.get("losses") or []), len(d.get("losses") or []))
        diff = z.get("loss_max_rel_diff")
        tok = (lambda r: "-" if r.get("tokens_per_s") is None else f"{r['tokens_per_s']:.0f}")
        cells = [model, off, prec, sec(z.get("step_s")), sec(d.get("step_s")), "-" if rs is None else f"{rs:.2f}x",
                 "-" if rm is None else f"{rm:.2f}x", tok(z), tok(d), gib(z.get("peak_rss_bytes")), gib(d.get("peak_rss_bytes")),
                 f"{mib(z.get('nvme_read_bytes'))} / {mib(z.get('nvme_write_bytes'))}",
                 f"{mib(d.get('nvme_read_bytes'))} / {mib(d.get('nvme_write_bytes'))}",
                 "-" if diff is None else f"{diff:.1e} ({n})",
                 " / ".join("-" if r.get("loss_max_rel_diff_torch") is None else f"{r['loss_max_rel_diff_torch']:.1e}"
                            for r in (z, d))]
        for eng, r in (("zoe", z), ("DeepSpeed", d)):
            if r.get("error"):
                notes.append(f"- {model} / {off} / {prec}: {eng} failed: `{r['error']}`")
                cells[3 if eng == "zoe" else 4] = "error (below)"
        lines.append("| " + " | ".join(cells) + " |")
    busy = busy_lines(results)
    if busy:
        lines += [""] + busy
    if notes:
        lines += ["", "Errors, verbatim:", ""] + notes
    lines += ["", "Step: the median after the warm-up steps (means: the ratio of the mean steps); peak RSS: the engine's process while it trained "
              "(VmHWM reset after initialisation); NVMe bytes: /proc/<pid>/io read_bytes and write_bytes per step; "
              "vs torch AdamW: each engine's largest relative loss difference from plain torch.optim.AdamW on the same "
              "model, batches and config (fp32; vs_deepspeed.py reference)."]
    return "\n".join(lines) + "\n"


def busy_lines(results):
    """The busy machine's table (cells run with --busy): zoe / DeepSpeed quiet and busy, and how far
    the busy ratio moved from the quiet one (zoe's target: within 1.15x)."""
    lines = []
    for (model, off, prec), e in cell_rows(results["rows"]).items():
        z, d = e.get("zoe", {}), e.get("deepspeed", {})
        if not z.get("busy_cores"):
            continue
        quiet, busy = ratio(z.get("step_s"), d.get("step_s")), ratio(z.get("busy_step_s"), d.get("busy_step_s"))
        moved = ratio(busy, quiet)
        lines.append(f"| {model} | {off} | {prec} | {z['busy_cores']} | "
                     f"{sec(z.get('step_s'))} / {sec(d.get('step_s'))} | "
                     f"{sec(z.get('busy_step_s'))} / {sec(d.get('busy_step_s'))} | "
                     + " | ".join("-" if x is None else f"{x:.2f}x" for x in (quiet, busy, moved)) + " |")
    if not lines:
        return []
    return (["| model | offload | precision | busy processes | quiet s/step zoe / DS | busy s/step zoe / DS | "
             "zoe / DS quiet | zoe / DS busy | busy / quiet |", "|---|---|---|---|---|---|---|---|---|"] + lines +
            ["", "Busy: the cell's rounds alternate quiet and busy; in a busy round that many processes spin on "
             "the CPU beside both engines (each figure the median of its rounds' steps after the warm-up)."])


def plot(results, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    cells = cell_rows(results["rows"])
    panels = sorted({(m, p) for (m, _, p) in cells}, key=lambda k: (MODELS.index(k[0]), PRECISIONS.index(k[1])))
    if not panels:
        return
    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 4), squeeze=False)
    colors = {"zoe": "tab:blue", "deepspeed": "tab:orange"}
    for ax, (model, prec) in zip(axes[0], panels):
        offs = [o for o in OFFLOADS if (model, o, prec) in cells]
        for j, eng in enumerate(ENGINES):
            xs = [i + (j - 0.5) * 0.38 for i in range(len(offs))]
            ys = [cells[(model, o, prec)].get(eng, {}).get("step_s") or 0.0 for o in offs]
            ax.bar(xs, ys, width=0.38, color=colors[eng], label=eng)
            for x, o in zip(xs, offs):
                if cells[(model, o, prec)].get(eng, {}).get("error"):
                    ax.text(x, 0.02, f"{eng} failed", rotation=90, ha="center", va="bottom", fontsize=8,
                            transform=ax.get_xaxis_transform())
            ref = cells.get((model, "none", prec), {}).get(eng, {}).get("step_s")
            if ref:
                ax.axhline(ref, color=colors[eng], linestyle="--", linewidth=1,
                           label=f"{eng} no offload")
        ax.set_xticks(range(len(offs)), [f"offload {o}" for o in offs])
        ax.set_title(f"{model}, {prec}")
        ax.set_ylabel("s / step (median)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(args):
    out = Path(args.out)
    rows = []
    for f in sorted((out / "cells").glob("*.json")):
        rows += json.loads(f.read_text())["rows"]
    attach_reference(out, rows)
    results = {"machine": machine_info(), "versions": versions(out), "rows": rows}
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    md = markdown(results)
    (out / "results.md").write_text(md)
    plot(results, out / "step_time.png")
    print(md)
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("cell", help="run one (model, offload, precision) cell, both engines alternately")
    c.add_argument("--out", required=True)
    c.add_argument("--model", required=True, choices=MODELS)
    c.add_argument("--offload", required=True, choices=OFFLOADS)
    c.add_argument("--precision", required=True, choices=PRECISIONS)
    c.add_argument("--rounds", type=int, default=4)
    c.add_argument("--steps-per-round", type=int, default=5)
    c.add_argument("--warmup", type=int, default=2, help="steps of each engine left out of the median")
    c.add_argument("--batch", type=int, default=1)
    c.add_argument("--seq", type=int, default=128)
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--nvme-path", default="/var/tmp")
    c.add_argument("--max-in-cpu", type=int, default=None,
                   help="offload_param.max_in_cpu for offload nvme (default: left out, 1e9 for both engines)")
    c.add_argument("--engines", default="zoe,deepspeed", help="comma-separated: zoe, deepspeed (default both)")
    c.add_argument("--timeout", type=float, default=900, help="seconds an engine may take for one request")
    c.add_argument("--busy", type=int, default=0,
                   help="processes spinning on the CPU in every second round (a busy machine; default 0: none)")
    f = sub.add_parser("reference", help="the fp32 reference: plain torch AdamW over the cells' batches")
    f.add_argument("--out", required=True)
    f.add_argument("--model", required=True, choices=MODELS)
    for k, v in (("--rounds", 4), ("--steps-per-round", 5), ("--batch", 1), ("--seq", 128), ("--seed", 0)):
        f.add_argument(k, type=int, default=v, help="as the cells' (the same batches file)")
    f.add_argument("--nvme-path", default="/var/tmp")
    f.add_argument("--timeout", type=float, default=900)
    r = sub.add_parser("report", help="results.json, results.md and step_time.png from the cells run")
    r.add_argument("--out", required=True)
    a = ap.parse_args()
    if a.cmd == "cell":
        for k in ("rounds", "steps_per_round", "batch", "seq"):
            if getattr(a, k) < 1:
                ap.error(f"--{k.replace('_', '-')} must be at least 1")
        if a.busy < 0 or a.busy > 64:
            ap.error(f"--busy {a.busy}: give 0 (a quiet machine) to 64 spinning processes")
        if a.warmup < 0 or a.warmup >= a.rounds * a.steps_per_round:
            ap.error("--warmup must be at least 0 and below --rounds x --steps-per-round")
        bad = [e for e in a.engines.split(",") if e not in ENGINES]
        if bad or not a.engines:
            ap.error(f"--engines: {', '.join(bad) or 'none given'}: the engines are zoe and deepspeed")
        return run_cell(a)
    if a.cmd == "reference":
        return run_reference(a)
    return report(a)


if __name__ == "__main__":
    sys.exit(main())
