#!/usr/bin/env python3
"""The two paths side by side at one shape: zoe's own GPT (`zoe train --preset 2b`) and the same
shape as a Hugging Face GPT-2 through the PyTorch front-end (`zoe.initialize`), alternated in one
run, with bf16 compute, parameters and optimizer states on NVMe, the same device budget, micro-batch
and sequence.

For each path: initialisation (the front-end's: `zoe.initialize` of the meta-built model;
building it on the meta device, transformers' own part, is `model_build_s` beside it), every
step, the steady step's I/O lower bound (its NVMe bytes at the rates `zoe bench io` measures beside
each round), and peak RSS. For the front-end also a profile of its last step: zoe's own clocks (I/O
stall, collectives, the optimizer), the rest of the step (the caller's forward and backward: Python,
torch's ops, the copies), and cProfile's top functions.

usage: python bench/hf_at_scale.py --nvme-path DIR --json OUT [--quick] [--rounds 2] [--steps 3] [--init-only]
                                   [--rss-sweep] [--precision bf16|fp32] [--activation-checkpointing]
                                   [--io-size 1GiB]
  --quick: a shape of about 300M parameters (24 layers, width 1024) instead of the 2b preset's.
  --rss-sweep: the front-end alone at four depths of the shape's width (the 2b shape: 13, 19, 26
    and 31 layers, 1.0B to 2.4B parameters), --steps steps each: rss_by_size holds each one's peak
    RSS, and ratios.rss_largest_over_smallest how flat it is.
  --precision fp32: both paths compute in fp32 (torch's bf16 matmuls are slow on CPUs without AVX-512:
    a 2b-width layer's backward takes 20 s there).
  --activation-checkpointing: both paths recompute each block in the backward from its input.
  --io-size: the `zoe bench io` file size behind the I/O bound (a virtio drive whose host caches a
    1 GiB file shows rates a step's tens of GB do not get).
Each front-end run's RSS is split into the imports (torch, transformers, zoe), zoe's device and
host high-water marks (the CPU device's memory is host memory) and the rest (torch's activations
and autograd, allocator slack).
(with zoe and transformers importable: scripts/python-venv.sh's venv; run it alone:
 flock -x /tmp/zoe-heavy.lock python bench/hf_at_scale.py ...)

OUT: {"params", "front_end": {...}, "preset": {...}, "rss_by_size": [{"params", "peak_rss_bytes"}],
      "rounds": [...], "profile": {...}}; each path's object has init_s, step_s (the median steady
step), io_bound_s and peak_rss_bytes."""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

SHAPES = {"2b": dict(layers=26, d=2560, heads=20), "quick": dict(layers=24, d=1024, heads=16)}
VOCAB, SEQ = 256, 64


def zoe_bin(a):
    if a.zoe:
        return a.zoe
    found = shutil.which("zoe")
    if not found:
        sys.exit("hf_at_scale: no zoe binary (pass --zoe build/bin/zoe)")
    return found


def io_rates(zoe, path, size="1GiB"):
    """The drive's read and write rates now, bytes/s (1 MiB requests, queue depth 8, a file of
    `size`: a file the size of a step's swap traffic shows what a step gets from a disk whose host
    caches a small one)."""
    p = subprocess.run([zoe, "bench", "io", "--path", path, "--size", size, "--bs", "1MiB", "--qd", "8",
                        "--rw", "read,write", "--loops", "2", "--json"], capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"hf_at_scale: `zoe bench io --size {size}` (--io-size) failed: {p.stderr.strip()[-400:]}")
    out = p.stdout
    rows = {r["rw"]: r["gbps"] * 1e9 for r in json.loads(out)["rows"]}
    return rows["read"], rows["write"]


def run_measured(cmd, env=None):
    """Runs cmd; returns (stdout, peak RSS bytes of the child)."""
    with tempfile.TemporaryFile() as out:
        p = subprocess.Popen(cmd, stdout=out, env=env)
        _, status, usage = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        text = out.read().decode()
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited with {p.returncode}")
    return text, usage.ru_maxrss * 1024


def run_preset(a, zoe, scratch):
    s = SHAPES[a.shape]
    cmd = [zoe, "train", "--preset", "2b", "--layers", str(s["layers"]), "--d-model", str(s["d"]), "--heads",
           str(s["heads"]), "--context", str(SEQ), "--seq", str(SEQ), "--steps", str(a.steps), "--micro-batch", "1",
           "--offload", "nvme", "--nvme-path", scratch, "--device-budget", a.device_budget, "--precision", a.precision,
           "--json", "--quiet"]
    if a.host_budget:
        cmd += ["--host-budget", a.host_budget]
    if a.activation_checkpointing:
        cmd += ["--activation-checkpointing"]
    text, rss = run_measured(cmd)
    d = json.loads(text)
    n = d["params"]
    steps = [x["wall"] for x in d["step_time_s"]]
    per = d["step_bytes_per_param"][-1]
    return {"params": n, "init_s": d["time_s"]["initialize"], "steps_s": steps, "peak_rss_bytes": rss,
            "read_bytes": per["nvme->host"] * n, "write_bytes": per["host->nvme"] * n,
            "model_state_bytes": d["model_state_bytes"]}


def proc_status_bytes(key):
    """VmRSS or VmHWM of this process, bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def child(a):
    """The front-end path, in its own process (its peak RSS is its own)."""
    import cProfile
    import pstats
    import io

    import torch
    import transformers

    import zoe
    rss_imports = proc_status_bytes("VmRSS")
    s = dict(SHAPES[a.shape], **({"layers": a.layers} if a.layers else {}))
    cfg = transformers.GPT2Config(n_embd=s["d"], n_layer=s["layers"], n_head=s["heads"], vocab_size=VOCAB,
                                  n_positions=SEQ, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                  bos_token_id=0, eos_token_id=0)
    ds = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
          "bf16": {"enabled": a.precision == "bf16"},
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.0}},
          "zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": a.child_nvme},
                                "offload_optimizer": {"device": "nvme", "nvme_path": a.child_nvme}},
          "zoe": {"device_budget": a.device_budget}}
    if a.host_budget:
        ds["zoe"]["host_budget"] = a.host_budget
    t0 = time.perf_counter()
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    if a.activation_checkpointing:
        if hasattr(model, "activation_checkpointing_enable"):  # transformers 5.x's name
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False  # no key/value cache in training (transformers warns otherwise)
    t_built = time.perf_counter()
    eng = zoe.initialize(model, config=ds)
    init_s = time.perf_counter() - t_built
    rss_init = proc_status_bytes("VmHWM")
    build_s = t_built - t0
    g = torch.Generator().manual_seed(0)
    steps, stats, prof = [], [], None
    for k in range(a.steps):
        ids = torch.randint(0, VOCAB, (1, SEQ), generator=g)
        last = k == a.steps - 1
        if last:
            prof = cProfile.Profile()
            prof.enable()
        t1 = time.perf_counter()
        out = eng(input_ids=ids, labels=ids)
        t_fwd = time.perf_counter() - t1
        eng.backward(out.loss)
        st = eng.step()
        steps.append(time.perf_counter() - t1)
        if last:
            prof.disable()
        stats.append({"t_compute": st.t_compute, "t_io_stall": st.t_io_stall, "t_comm": st.t_comm,
                      "t_optimizer": st.t_optimizer, "t_update_overlapped": st.t_update_overlapped,
                      "forward_s": t_fwd, "read_bytes": st.step_bytes_nvme_read,
                      "write_bytes": st.step_bytes_nvme_write})
        print(f"front-end step {k + 1}: {steps[-1]:.1f} s", file=sys.stderr)
    n, state = eng.num_params(), eng.model_state_bytes()
    hw = eng.high_water()
    rss = {"imports_bytes": rss_imports, "peak_after_init_bytes": rss_init, "peak_bytes": proc_status_bytes("VmHWM"),
           "zoe_device_high_water_bytes": hw["device"], "zoe_host_high_water_bytes": hw["host"]}
    rss["rest_bytes"] = rss["peak_bytes"] - rss_imports - hw["device"] - hw["host"]
    eng.close()
    top = []
    if prof is not None:
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(12)
        top = [line.strip() for line in buf.getvalue().splitlines() if line.strip()[:1].isdigit()][:12]
    json.dump({"params": n, "model_state_bytes": state, "init_s": init_s, "build_s": build_s, "steps_s": steps,
               "stats": stats, "profile_top": top, "rss": rss}, open(a.child_json, "w"))


def run_front_end(a, scratch):
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [sys.executable, os.path.abspath(__file__), "--child", "--child-nvme", scratch, "--child-json",
               out.name, "--steps", str(a.steps), "--device-budget", a.device_budget,
               "--shape", a.shape, "--precision", a.precision]
        cmd += ["--activation-checkpointing"] if a.activation_checkpointing else []
        cmd += ["--host-budget", a.host_budget] if a.host_budget else []
        cmd += ["--layers", str(a.layers)] if a.layers else []
        _, rss = run_measured(cmd)
        d = json.load(open(out.name))
    last = d["stats"][-1] if d["stats"] else {"read_bytes": 0, "write_bytes": 0}
    d.update(peak_rss_bytes=rss, read_bytes=last["read_bytes"], write_bytes=last["write_bytes"])
    return d


def init_only(a, zoe):
    """--init-only: each path's initialisation, alternated, against the write bound of its model
    states at the write rate measured beside it (the preset runs one step: its command has no
    zero-step run; the front-end none)."""
    rows = []
    for r in range(a.rounds):
        for path in (("preset", "front_end") if r % 2 == 0 else ("front_end", "preset")):
            scratch = tempfile.mkdtemp(prefix="zoe-hf-at-scale-", dir=a.nvme_path)
            try:
                before = io_rates(zoe, scratch, a.io_size)[1]
                print(f"round {r + 1}: {path} initialisation ...", file=sys.stderr)
                if path == "preset":
                    res = run_preset(argparse.Namespace(**{**vars(a), "steps": 1}), zoe, scratch)
                else:
                    res = run_front_end(argparse.Namespace(**{**vars(a), "steps": 0}), scratch)
                after = io_rates(zoe, scratch, a.io_size)[1]
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
            rate = (before + after) / 2
            bound = res["model_state_bytes"] / rate
            rows.append({"round": r + 1, "path": path, "init_s": res["init_s"], "model_build_s": res.get("build_s"),
                         "write_bound_s": bound, "over_write_bound": res["init_s"] / bound,
                         "write_gbps": rate / 1e9, "peak_rss_bytes": res["peak_rss_bytes"],
                         "model_state_bytes": res["model_state_bytes"], "params": res["params"]})
            print(f"  init {res['init_s']:.1f} s = {res['init_s'] / bound:.2f}x its write bound "
                  f"({bound:.1f} s at {rate / 1e9:.2f} GB/s)", file=sys.stderr)
    med = {p: statistics.median(x["over_write_bound"] for x in rows if x["path"] == p) for p in ("preset", "front_end")}
    return {"shape": a.shape, "init_only": True, "rounds": rows,
            "ratios": {"init_preset_over_write_bound": med["preset"], "init_front_end_over_write_bound": med["front_end"]}}


SWEEP_LAYERS = {"2b": (13, 19, 26, 31), "quick": (6, 12, 18, 24)}


def rss_sweep(a):
    """--rss-sweep: the front-end at each depth of SWEEP_LAYERS, smallest first; its peak RSS by
    size (the process's whole peak: initialisation and steps)."""
    rows = []
    for layers in SWEEP_LAYERS[a.shape]:
        scratch = tempfile.mkdtemp(prefix="zoe-hf-at-scale-", dir=a.nvme_path)
        try:
            print(f"rss sweep: {layers} layers ...", file=sys.stderr)
            res = run_front_end(argparse.Namespace(**{**vars(a), "layers": layers}), scratch)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        rows.append({"params": res["params"], "layers": layers, "peak_rss_bytes": res["peak_rss_bytes"],
                     "init_s": res["init_s"], "steps_s": res["steps_s"], "rss": res["rss"]})
        print(f"  {res['params'] / 1e9:.2f}B parameters: peak RSS {res['peak_rss_bytes'] / 1e9:.2f} GB "
              f"({rss_parts(res)}), init {res['init_s']:.1f} s, steps "
              f"{', '.join(f'{x:.1f}' for x in res['steps_s'])} s", file=sys.stderr)
    peaks = [r["peak_rss_bytes"] for r in rows]
    return {"shape": a.shape, "precision": a.precision, "activation_checkpointing": a.activation_checkpointing,
            "rss_sweep": True, "rss_by_size": rows,
            "ratios": {"rss_largest_over_smallest": max(peaks) / min(peaks)}}


def rss_parts(res):
    r = res["rss"]
    return (f"imports {r['imports_bytes'] / 1e9:.2f}, zoe device {r['zoe_device_high_water_bytes'] / 1e9:.2f}, "
            f"zoe host {r['zoe_host_high_water_bytes'] / 1e9:.2f}, the rest {r['rest_bytes'] / 1e9:.2f} GB")


def summary(runs, rates):
    """The median steady step (every step after the first) and its I/O bound over the rounds."""
    steady = [s for r in runs for s in r["steps_s"][1:]] or [r["steps_s"][-1] for r in runs]
    bounds = [r["read_bytes"] / rd + r["write_bytes"] / wr for r, (rd, wr) in zip(runs, rates)]
    return {"init_s": statistics.median(r["init_s"] for r in runs), "step_s": statistics.median(steady),
            "io_bound_s": statistics.median(bounds), "peak_rss_bytes": max(r["peak_rss_bytes"] for r in runs),
            "steps_s": [r["steps_s"] for r in runs], "init_runs_s": [r["init_s"] for r in runs],
            "model_build_s": statistics.median(r.get("build_s", 0.0) for r in runs),
            "read_bytes": runs[-1]["read_bytes"], "write_bytes": runs[-1]["write_bytes"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nvme-path", default=os.environ.get("ZOE_SCRATCH", "/var/tmp"))
    ap.add_argument("--json", default=None)
    ap.add_argument("--quick", action="store_true", help="a shape of about 300M parameters")
    ap.add_argument("--rounds", type=int, default=2, help="rounds, each path once per round, alternated")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--device-budget", default="2GiB")
    ap.add_argument("--host-budget", default=None, help="zoe.host_budget for both paths (default zoe's)")
    ap.add_argument("--precision", choices=("bf16", "fp32"), default="bf16",
                    help="compute precision of both paths (default bf16; fp32 where torch's bf16 matmuls are "
                         "slow, as on CPUs without AVX-512)")
    ap.add_argument("--activation-checkpointing", action="store_true",
                    help="both paths keep only each block's input for the backward and recompute the block "
                         "(the front-end: transformers' gradient_checkpointing_enable()); a micro-batch's "
                         "activations then stay one block's, whatever the depth")
    ap.add_argument("--io-size", default="1GiB",
                    help="file size of the `zoe bench io` runs that give the I/O bound (default 1GiB; the size "
                         "of a step's swap traffic shows what a step gets from the drive)")
    ap.add_argument("--zoe", default=None, help="the zoe binary (default: zoe on PATH)")
    ap.add_argument("--init-only", action="store_true",
                    help="each path's initialisation only, against its write bound (no steps on the front-end)")
    ap.add_argument("--rss-sweep", action="store_true",
                    help="the front-end alone at four depths (1.0B-2.4B at the 2b width): peak RSS by size")
    ap.add_argument("--shape", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--layers", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--child-nvme", help=argparse.SUPPRESS)
    ap.add_argument("--child-json", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.rounds < 1:
        ap.error(f"--rounds {a.rounds}: at least 1")
    if a.steps < 1 and not a.child:
        ap.error(f"--steps {a.steps}: at least 1 (2 or more for a steady step)")
    if not a.child and not os.path.isdir(a.nvme_path):
        ap.error(f"--nvme-path {a.nvme_path}: not a folder")
    if a.rss_sweep and a.init_only:
        ap.error("--rss-sweep and --init-only: give one (the sweep runs the front-end's steps too)")
    a.shape = a.shape or ("quick" if a.quick else "2b")
    if a.child:
        return child(a)
    zoe = zoe_bin(a)
    if a.init_only:
        return emit(a, init_only(a, zoe))
    if a.rss_sweep:
        return emit(a, rss_sweep(a))
    runs = {"preset": [], "front_end": []}
    rates = {"preset": [], "front_end": []}
    rounds = []
    for r in range(a.rounds):
        for path in (("preset", "front_end") if r % 2 == 0 else ("front_end", "preset")):
            scratch = tempfile.mkdtemp(prefix="zoe-hf-at-scale-", dir=a.nvme_path)
            try:
                before = io_rates(zoe, scratch, a.io_size)
                print(f"round {r + 1}: {path} ...", file=sys.stderr)
                res = run_preset(a, zoe, scratch) if path == "preset" else run_front_end(a, scratch)
                after = io_rates(zoe, scratch, a.io_size)
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
            rate = ((before[0] + after[0]) / 2, (before[1] + after[1]) / 2)
            runs[path].append(res)
            rates[path].append(rate)
            rounds.append({"round": r + 1, "path": path, "init_s": res["init_s"], "steps_s": res["steps_s"],
                           "peak_rss_bytes": res["peak_rss_bytes"], "read_gbps": rate[0] / 1e9,
                           "write_gbps": rate[1] / 1e9})
            print(f"  init {res['init_s']:.1f} s, steps {', '.join(f'{x:.1f}' for x in res['steps_s'])} s, "
                  f"peak RSS {res['peak_rss_bytes'] / 1e9:.2f} GB; drive {rate[0] / 1e9:.2f} / "
                  f"{rate[1] / 1e9:.2f} GB/s", file=sys.stderr)
    pre, fe = summary(runs["preset"], rates["preset"]), summary(runs["front_end"], rates["front_end"])
    write_rate = statistics.median(w for p in rates.values() for _, w in p)
    state = runs["preset"][-1]["model_state_bytes"]
    last = runs["front_end"][-1]
    fe_state = last["model_state_bytes"]
    ls = last["stats"][-1]
    zoe_s = ls["t_io_stall"] + ls["t_comm"] + ls["t_optimizer"]
    out = {
        "params": runs["preset"][-1]["params"], "front_end_params": last["params"], "shape": a.shape,
        "precision": a.precision, "io_size": a.io_size, "activation_checkpointing": a.activation_checkpointing,
        "front_end_rss": last["rss"],
        "preset": pre, "front_end": fe,
        "rss_by_size": [{"params": last["params"], "peak_rss_bytes": fe["peak_rss_bytes"]}],
        "ratios": {"step_front_end_over_preset": fe["step_s"] / pre["step_s"],
                   "step_front_end_over_io_bound": fe["step_s"] / fe["io_bound_s"],
                   "step_preset_over_io_bound": pre["step_s"] / pre["io_bound_s"],
                   "init_front_end_over_write_bound": fe["init_s"] / (fe_state / write_rate),
                   "init_and_build_front_end_over_write_bound":
                       (fe["init_s"] + fe["model_build_s"]) / (fe_state / write_rate),
                   "init_preset_over_write_bound": pre["init_s"] / (state / write_rate)},
        "profile": {"step_s": last["steps_s"][-1], "forward_s": ls["forward_s"], "zoe_waits_s": zoe_s,
                    "t_io_stall": ls["t_io_stall"], "t_comm": ls["t_comm"], "t_optimizer": ls["t_optimizer"],
                    "t_update_overlapped": ls["t_update_overlapped"],
                    "caller_s": last["steps_s"][-1] - zoe_s, "cprofile_top_by_own_time": last["profile_top"]},
        "rounds": rounds,
    }
    return emit(a, out)


def emit(a, out):
    text = json.dumps(out, indent=2)
    print(text)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
