"""zoe's PyTorch front-end under `mpirun -np 2` against 1 rank (test 4 of issue 13).

Rank r trains on micro-batches 2k + r; the 1-rank run takes both with gradient accumulation 2, so
both average the same gradients. Tolerance as the C++ engine tests (tests/zero/test_engine.cpp)
for fp32: final weights within 2e-4 (largest) / 2e-5 (mean), summation order only; the losses
(the mean of the two micro-batches) within 1e-5 relative. Run as a script, this file is the
worker: it prints its losses and weights as JSON."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
STEPS = 6


def expert_of(j):
    """The expert micro-batch j goes through: 0 for the first of each step; the second's
    alternates, so expert 1 gets a gradient on one rank only, or on none, in a step."""
    return 0 if j % 2 == 0 else (j // 2) % 2


def worker(out_dir, mode):
    sys.path.insert(0, str(HERE))
    import torch

    import zoe
    from zoe_torch_models import Experts, config, gpt_batches, make_model

    rank, world = zoe.rank_and_world()
    data = gpt_batches(2 * STEPS)
    if mode == "experts":
        data = [(x, y, expert_of(j)) for j, (x, y) in enumerate(data)]
    if mode == "divergent":
        # Each expert a unit of its own, and rank r runs expert r: the ranks reduce different units.
        torch.manual_seed(0)
        eng = zoe.initialize(Experts(), config=config(Path(out_dir), stage=2, opt="cpu", param="none"),
                             unit_params=2000)
        x, y = data[0]
        eng.backward(eng(x, y, rank))
        try:
            eng.step()
            result = {"error": None}
        except zoe.ZoeError as e:
            result = {"error": str(e)}
        with open(Path(out_dir) / f"{mode}-w{world}-r{rank}.json", "w") as f:
            json.dump(result, f)
        return
    swap = Path(out_dir) / f"swap-{mode}-{world}-{rank}"
    swap.mkdir(parents=True, exist_ok=True)
    if mode in ("hf-layer-major", "hf-layer-major-bf16"):
        # train_batch in both schedules on an HF Llama and a GPT-2 (stage 3, NVMe, G = 3 per rank):
        # the losses and masters of each, per rank.
        from test_hf_models import BUDGET, batches, build
        out = {}
        for arch in ("llama", "gpt2"):
            data = [{"input_ids": ids, "labels": ids} for ids in batches(12, seed=1 + rank)]
            for schedule in ("micro-batch", "layer-major"):
                d = swap / f"{arch}-{schedule}"
                d.mkdir()
                cfg = config(d, stage=3, gas=3, micro=2, device_budget=BUDGET, schedule=schedule,
                             dtype="bf16" if mode.endswith("bf16") else "fp32",
                             zero={"stage3_param_persistence_threshold": 0, "stage3_prefetch_bucket_size": 0})
                eng = zoe.initialize(build(arch), config=cfg)
                losses = []
                for k in range(0, 12, 3):
                    losses += eng.train_batch(data[k:k + 3])
                    assert eng.last_step_stats.schedule == schedule
                out[f"{arch}/{schedule}"] = {"losses": losses, "weights": {
                    n: t.reshape(-1).tolist() for n, t in eng.master_params().items()}}
                eng.close()
        with open(Path(out_dir) / f"{mode}-w{world}-r{rank}.json", "w") as f:
            json.dump(out, f)
        return
    if mode == "experts":
        torch.manual_seed(0)
        model = Experts()
        model.emb.weight.requires_grad_(False)
        # Both experts in one unit: every rank reduces the same zoe modules in the same order.
        eng = zoe.initialize(model, config=config(swap, stage=2, opt="cpu", param="none", gas=2 // world),
                             zoe_units=[model.emb, model.moe, model.head])
    else:
        c = config(swap, stage=3, gas=2 // world)
        if mode == "adagrad":
            # eps 2^-10: test_torch_optimizers.py says why (the key bias's rounding-noise gradients).
            c["optimizer"] = {"type": "Adagrad", "params": {"lr": 2.0 ** -7, "eps": 2.0 ** -10}}
        if mode == "adam_mini":
            c["optimizer"] = {"type": "AdamMini", "params": {"lr": 3e-3, "weight_decay": 0.1, "dim": 32, "n_heads": 4}}
        if mode.startswith("muon"):
            c["optimizer"] = {"type": "Muon", "params": {"muon_lr": 0.02, "adam_lr": 3e-3, "weight_decay": 0.1}}
            if mode == "muon-flat-shard":  # Newton-Schulz on each rank's flat shard (the test hook)
                os.environ["ZOE_TEST_MUON_FLAT_SHARD"] = "1"
        eng = zoe.initialize(make_model("gpt"), config=c)
    losses = []
    for k in range(STEPS):
        mine = data[2 * k:2 * k + 2] if world == 1 else [data[2 * k + rank]]
        total = 0.0
        for args in mine:
            loss = eng(*args)
            eng.backward(loss)
            eng.step()
            total += loss.item()
            if mode == "gpt-sleep":  # engine.sleep()/wake() after every step: the bits of never sleeping
                eng.sleep()
                assert eng.memory_in_use()["device"] == 0
                eng.wake()
        losses.append(total / len(mine))
    weights = {n: t.reshape(-1).tolist() for n, t in eng.state_dict().items()}
    # engine.gathered_parameters: every rank gets the full tensors; with rank0_only rank 0 only.
    gathered = {n: t.reshape(-1).tolist() for n, t in eng.gathered_parameters()}
    rank0_only = [n for n, _ in eng.gathered_parameters(rank0_only=True)]
    with open(Path(out_dir) / f"{mode}-w{world}-r{rank}.json", "w") as f:
        json.dump({"losses": losses, "weights": weights, "gathered": gathered, "rank0_only": rank0_only}, f)
    del torch


def run_workers(tmp_path, mode, one_rank=False):
    """This file as the worker: under `mpirun -np 2` (and first as one process with one_rank)."""
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("mpirun not installed (openmpi-bin)")
    zoe = pytest.importorskip("zoe")
    env = dict(os.environ, OMPI_MCA_btl="self,vader", OMPI_MCA_rmaps_base_oversubscribe="1",
               PYTHONPATH=os.pathsep.join(p for p in [os.path.dirname(os.path.dirname(zoe.__file__)),
                                                      os.environ.get("PYTHONPATH", "")] if p))
    me = str(Path(__file__).resolve())
    if one_rank:
        subprocess.run([sys.executable, me, str(tmp_path), mode], check=True, env=env, timeout=120)
    p = subprocess.run([mpirun, "--oversubscribe", "--allow-run-as-root", "--bind-to", "none", "--mca", "btl",
                        "self,vader", "-np", "2", sys.executable, me, str(tmp_path), mode], env=env, timeout=120,
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-3000:]


@pytest.mark.parametrize("mode", ["gpt", "experts", "adagrad", "muon", "adam_mini"])
def test_two_ranks_match_one(mode, tmp_path):
    """mode adagrad: optimizer.type Adagrad at stage 3 on NVMe (its state is one per parameter).
    mode adam_mini: optimizer.type AdamMini at stage 3 on NVMe: blocks (whole tensors, the embedding's
    rows) straddle the two ranks' partitions, and their sums of g^2 are summed over both.
    mode muon: optimizer.type Muon at stage 3 on NVMe: each matrix straddles the two ranks'
    partitions, and Newton-Schulz runs on the whole matrix gathered from both.
    mode experts: an expert gets a gradient on one rank only in some steps, on none in others,
    and the embedding is frozen: the ranks agree on which parameters a step leaves as they are
    (each rank owns part of both experts' states at stage 2)."""
    run_workers(tmp_path, mode, one_rank=True)
    one = json.loads((tmp_path / f"{mode}-w1-r0.json").read_text())
    r0 = json.loads((tmp_path / f"{mode}-w2-r0.json").read_text())
    r1 = json.loads((tmp_path / f"{mode}-w2-r1.json").read_text())
    for k in range(STEPS):
        two = (r0["losses"][k] + r1["losses"][k]) / 2
        assert abs(two - one["losses"][k]) <= 1e-5 * abs(one["losses"][k]), f"step {k + 1}"
    assert r0["weights"] == r1["weights"], "the two ranks hold different full weights"
    for r in (r0, r1):
        assert r["gathered"] and all(r["gathered"][n] == r["weights"][n] for n in r["gathered"])
    assert list(r0["gathered"]) == r0["rank0_only"] and r1["rank0_only"] == []
    diffs = []
    for n, w in one["weights"].items():
        diffs += [abs(a - b) for a, b in zip(w, r0["weights"][n])]
    # The two runs sum each gradient in another order (per-rank halves of the batch); Muon's
    # orthogonalization carries those roundings into every element of a matrix, by amounts that
    # depend on the CPU's kernels (2.45e-4 at most on an AVX-512 Xeon, under 2e-4 on an EPYC).
    assert max(diffs) <= (5e-4 if mode == "muon" else 2e-4) and sum(diffs) / len(diffs) <= 2e-5


def test_muon_on_flat_shards_leaves_the_one_rank_run(tmp_path):
    """What DeepSpeed's offloaded Muon computes (RFC #8463: each rank orthogonalizes its flattened
    shard; zoe's test hook ZOE_TEST_MUON_FLAT_SHARD does the same) leaves the one-rank run by far
    more than the 2e-4 that test_two_ranks_match_one allows: that test would catch the bug."""
    run_workers(tmp_path, "muon", one_rank=True)
    run_workers(tmp_path, "muon-flat-shard")
    one = json.loads((tmp_path / "muon-w1-r0.json").read_text())
    flat = json.loads((tmp_path / "muon-flat-shard-w2-r0.json").read_text())
    worst = max(abs(a - b) for n, w in one["weights"].items() for a, b in zip(w, flat["weights"][n]))
    assert worst > 1e-2, worst


def test_two_ranks_that_sleep_after_every_step_give_the_bits_of_never_sleeping(tmp_path):
    run_workers(tmp_path, "gpt")
    run_workers(tmp_path, "gpt-sleep")
    for k in (0, 1):
        plain = json.loads((tmp_path / f"gpt-w2-r{k}.json").read_text())
        slept = json.loads((tmp_path / f"gpt-sleep-w2-r{k}.json").read_text())
        assert slept["losses"] == plain["losses"], f"rank {k}"
        assert slept["weights"] == plain["weights"], f"rank {k}"


@pytest.mark.parametrize("mode", ["hf-layer-major", "hf-layer-major-bf16"])
def test_two_ranks_layer_major_gives_the_micro_batch_bits(mode, tmp_path):
    """engine.train_batch under mpirun -np 2 with zoe.schedule "layer-major" (an HF Llama and GPT-2,
    stage 3 on NVMe, 3 micro-batches a rank a step, fp32 and bf16): on each rank the same losses and
    masters, bit for bit, as the micro-batch schedule; both ranks hold the same masters."""
    pytest.importorskip("transformers")
    run_workers(tmp_path, mode)
    r = [json.loads((tmp_path / f"{mode}-w2-r{k}.json").read_text()) for k in (0, 1)]
    for arch in ("llama", "gpt2"):
        for k in (0, 1):
            mb, lm = r[k][f"{arch}/micro-batch"], r[k][f"{arch}/layer-major"]
            assert lm["losses"] == mb["losses"], (arch, k)
            assert lm["weights"] == mb["weights"], (arch, k)
        assert r[0][f"{arch}/layer-major"]["weights"] == r[1][f"{arch}/layer-major"]["weights"], arch


def test_ranks_that_run_different_units_are_refused(tmp_path):
    """Rank 0 runs expert 0's unit and rank 1 expert 1's (same size): their reductions would meet
    and mix the two experts' gradients. step() refuses on every rank, saying why."""
    run_workers(tmp_path, "divergent")
    for r in (0, 1):
        err = json.loads((tmp_path / f"divergent-w2-r{r}.json").read_text())["error"]
        assert err and "the ranks reduced different modules in this step" in err, err


if __name__ == "__main__":
    worker(sys.argv[1], sys.argv[2])
