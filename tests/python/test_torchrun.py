"""zoe under `torchrun` (issue 47): the ranks form from torch's variables and meet through the
TCPStore torchrun's agent serves; the collectives run over gloo with zoe's fixed-order reductions,
so a run gives the same bits as under `mpirun -np 2`. Both front-ends (`zoe train`, `zoe bench
comm`, `zoe.initialize`), and bad launches: no MASTER_ADDR, a rank that never comes, a port where
no store answers. Each ends with a message naming the cause, never a hang."""
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
zoe = pytest.importorskip("zoe")

HERE = Path(__file__).resolve().parent
WORKER = str(HERE / "test_torch_mpi.py")  # its worker prints losses and weights as JSON
STEPS = 6


def zoe_bin():
    return os.environ.get("ZOE_BIN") or shutil.which("zoe")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env_for_workers():
    return dict(os.environ, OMPI_MCA_btl="self,vader", OMPI_MCA_rmaps_base_oversubscribe="1",
                PYTHONPATH=os.pathsep.join(p for p in [os.path.dirname(os.path.dirname(zoe.__file__)),
                                                       os.environ.get("PYTHONPATH", "")] if p))


def torchrun(args, timeout=300):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(free_port())] + args
    return subprocess.run(cmd, env=env_for_workers(), capture_output=True, text=True, timeout=timeout)


def mpirun(args, timeout=300):
    exe = shutil.which("mpirun")
    if exe is None:
        pytest.skip("mpirun not installed (openmpi-bin)")
    cmd = [exe, "--oversubscribe", "--allow-run-as-root", "--bind-to", "none", "--mca", "btl", "self,vader", "-np",
           "2"] + args
    return subprocess.run(cmd, env=env_for_workers(), capture_output=True, text=True, timeout=timeout)


def needs_gloo():
    r = subprocess.run([zoe_bin(), "info", "--json"], capture_output=True, text=True)
    if r.returncode == 0 and not json.loads(r.stdout).get("gloo", {}).get("built", False):
        pytest.skip("zoe built without gloo (apt-get install libgloo-dev)")


def test_the_front_end_under_torchrun_gives_the_bits_of_mpirun(tmp_path):
    """The same worker (rank r trains micro-batch 2k + r, stage 3) under both launchers: the same
    losses and full weights, bit for bit, on both ranks; and within test_torch_mpi's tolerance of
    one process taking both micro-batches."""
    needs_gloo()
    runs = {}
    for name, launch in (("torchrun", torchrun), ("mpirun", mpirun)):
        out = tmp_path / name
        out.mkdir()
        p = launch([WORKER, str(out), "gpt"] if name == "torchrun" else [sys.executable, WORKER, str(out), "gpt"])
        assert p.returncode == 0, p.stderr[-3000:]
        runs[name] = [json.loads((out / f"gpt-w2-r{r}.json").read_text()) for r in (0, 1)]
    one_dir = tmp_path / "one"
    one_dir.mkdir()
    subprocess.run([sys.executable, WORKER, str(one_dir), "gpt"], check=True, env=env_for_workers(), timeout=300)
    one = json.loads((one_dir / "gpt-w1-r0.json").read_text())
    for r in (0, 1):
        assert runs["torchrun"][r]["losses"] == runs["mpirun"][r]["losses"], f"rank {r}: losses differ"
        assert runs["torchrun"][r]["weights"] == runs["mpirun"][r]["weights"], f"rank {r}: weights differ"
    t0, t1 = runs["torchrun"]
    for k in range(STEPS):
        assert abs((t0["losses"][k] + t1["losses"][k]) / 2 - one["losses"][k]) <= 1e-5 * abs(one["losses"][k])
    diffs = [abs(a - b) for n, w in one["weights"].items() for a, b in zip(w, t0["weights"][n])]
    assert max(diffs) <= 2e-4 and sum(diffs) / len(diffs) <= 2e-5


def test_zoe_train_under_torchrun_gives_the_bits_of_mpirun():
    needs_gloo()
    args = [zoe_bin(), "train", "--preset", "tiny", "--steps", "3", "--offload", "cpu", "--json", "--quiet"]
    out = {}
    for name, launch in (("torchrun", torchrun), ("mpirun", mpirun)):
        p = launch((["--no-python"] if name == "torchrun" else []) + args)
        assert p.returncode == 0, p.stderr[-3000:]
        out[name] = json.loads(p.stdout)  # rank 0's one JSON object
    assert out["torchrun"]["world_size"] == 2
    for key in ("losses", "grad_norms", "eval_loss"):
        assert out["torchrun"][key] == out["mpirun"][key], key


def test_zoe_bench_comm_runs_under_torchrun():
    needs_gloo()
    p = torchrun(["--no-python", zoe_bin(), "bench", "comm", "--backend", "host", "--sizes", "4KiB,1MiB",
                  "--iters", "3", "--json"])
    assert p.returncode == 0, p.stderr[-3000:]
    d = json.loads(p.stdout)
    assert d["ranks"] == 2
    assert {r["op"] for r in d["rows"]} == {"allreduce", "reducescatter", "allgather", "broadcast"}
    assert all(r["wrong"] == 0 for r in d["rows"])


def rank_env(**kw):
    env = {k: v for k, v in env_for_workers().items() if k not in ("MASTER_ADDR", "MASTER_PORT")}
    env.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="2", ZOE_COMM_TIMEOUT_S="3")
    env.update({k: str(v) for k, v in kw.items()})
    return env


def run_rank0(env, timeout=60):
    t0 = time.monotonic()
    p = subprocess.run([zoe_bin(), "train", "--preset", "tiny", "--steps", "1", "--quiet"], env=env,
                       capture_output=True, text=True, timeout=timeout)
    return p, time.monotonic() - t0


def test_a_launch_without_master_addr_says_so():
    needs_gloo()
    p, _ = run_rank0(rank_env())
    assert p.returncode != 0
    assert "MASTER_ADDR" in p.stderr and "MASTER_PORT" in p.stderr, p.stderr
    code = ("import zoe, torch\n"
            "try:\n    zoe.initialize(torch.nn.Linear(4, 4), config={'train_micro_batch_size_per_gpu': 1})\n"
            "except zoe.ZoeError as e:\n    print('ERR', e)\n")
    r = subprocess.run([sys.executable, "-c", code], env=rank_env(), capture_output=True, text=True, timeout=60)
    assert "ERR" in r.stdout and "MASTER_ADDR" in r.stdout, r.stdout + r.stderr


def test_a_rank_that_never_comes_ends_the_run_within_the_timeout():
    """A store is up (torch's TCPStore, as torchrun's agent serves it) but rank 1 never starts."""
    needs_gloo()
    port = free_port()
    store = torch.distributed.TCPStore("127.0.0.1", port, 2, True, wait_for_workers=False)
    p, took = run_rank0(rank_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=port))
    del store
    assert p.returncode != 0
    assert "rank 0 of 2" in p.stderr, p.stderr
    assert took < 30


def test_a_port_where_no_store_answers_is_an_error_not_a_hang():
    """MASTER_PORT in use by something else: a listener that closes every connection."""
    needs_gloo()
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    port = srv.getsockname()[1]

    def serve():
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            c.close()

    threading.Thread(target=serve, daemon=True).start()
    p, took = run_rank0(rank_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=port))
    srv.close()
    assert p.returncode != 0
    assert f"127.0.0.1:{port}" in p.stderr, p.stderr
    assert took < 30


def test_the_hf_example_under_torchrun(tmp_path):
    """The README's `torchrun --nproc_per_node 2 examples/train_hf.py`: both ranks train the same
    steps with the same losses, the loss falls, and the saved model loads."""
    needs_gloo()
    example = HERE.parent.parent / "examples" / "train_hf.py"
    p = torchrun([str(example), "--steps", "4", "--out", str(tmp_path / "out"), "--nvme-path", str(tmp_path / "nvme")])
    assert p.returncode == 0, p.stderr[-3000:]
    found = re.findall(r"step +(\d+) +loss ([\d.]+)", p.stdout)  # both ranks print (their lines may interleave)
    by_step = {}
    for k, loss in found:
        by_step.setdefault(int(k), []).append(loss)
    assert sorted(by_step) == [1, 2, 3, 4] and all(len(v) == 2 and v[0] == v[1] for v in by_step.values()), p.stdout
    assert float(by_step[4][0]) < float(by_step[1][0]), p.stdout
    assert (tmp_path / "out" / "config.json").exists()


DISAGREEING = """
import os, sys, torch, zoe
rank = int(os.environ["RANK"])
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1))
try:
    zoe.initialize(model, config={"train_micro_batch_size_per_gpu": 2,
                                  "zero_optimization": {"stage": 3 if rank == 0 else 2}})
except zoe.ZoeError as e:
    print(f"rank {rank}: {e}", file=sys.stderr)
    sys.exit(3)
print(f"rank {rank}: trained", file=sys.stderr)
"""


def test_ranks_that_disagree_on_the_config_each_get_a_clear_error(tmp_path):
    """Rank 1 asks for stage 2 where rank 0 asks for stage 3: zoe.initialize raises on both ranks,
    the differing rank naming the key and both values, before any training; nothing hangs."""
    needs_gloo()
    script = tmp_path / "disagree.py"
    script.write_text(DISAGREEING)
    p = torchrun([str(script)], timeout=120)
    assert p.returncode != 0
    assert "rank 1: " in p.stderr and "rank 1's config differs from rank 0's (zero_optimization.stage: 2 here, " \
        "3 on rank 0" in p.stderr, p.stderr[-3000:]
    assert "rank 0: " in p.stderr and "rank(s) 1 were given a config other than rank 0's" in p.stderr, \
        p.stderr[-3000:]
    assert "trained" not in p.stderr
