"""The zoe half of the zoe vs DeepSpeed harness (bench/vs_deepspeed), without DeepSpeed: one cell
with a tiny GPT-2 at stage 3 on NVMe, run by the harness's driver and worker process, must give
results.json in the names the harness promises, count the NVMe traffic of its worker, and train
like plain torch (torch.optim.AdamW with the config's clipping) on the same batches; the harness's
own torch reference (vs_deepspeed.py reference) must be that plain torch."""
import json
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("matplotlib")
pytest.importorskip("zoe")

from zoe_testlib import REPO  # noqa: E402

HARNESS = REPO / "bench" / "vs_deepspeed"
sys.path.insert(0, str(HARNESS))
import worker  # noqa: E402

STEPS = 3


def plain_torch_losses(config, batches):
    """The reference: the same model (same seed) trained by torch.optim.AdamW on the batches."""
    model = worker.build_model("tiny", 0)
    p = config["optimizer"]["params"]
    opt = torch.optim.AdamW(model.parameters(), lr=p["lr"], betas=tuple(p["betas"]), eps=p["eps"],
                            weight_decay=p["weight_decay"])
    losses = []
    for ids in batches:
        opt.zero_grad(set_to_none=True)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config["gradient_clipping"])
        opt.step()
        losses.append(loss.item())
    return losses


def test_zoe_half_of_the_harness(tmp_path):
    out = tmp_path / "out"
    nvme = tmp_path / "nvme"
    cell = [sys.executable, str(HARNESS / "vs_deepspeed.py"), "cell", "--out", str(out), "--model", "tiny",
            "--offload", "nvme", "--precision", "fp32", "--engines", "zoe", "--rounds", str(STEPS),
            "--steps-per-round", "1", "--warmup", "1", "--batch", "2", "--seq", "16", "--nvme-path", str(nvme)]
    p = subprocess.run(cell, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    p = subprocess.run([sys.executable, str(HARNESS / "vs_deepspeed.py"), "reference", "--out", str(out), "--model",
                        "tiny", "--rounds", str(STEPS), "--steps-per-round", "1", "--batch", "2", "--seq", "16"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    p = subprocess.run([sys.executable, str(HARNESS / "vs_deepspeed.py"), "report", "--out", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    results = json.loads((out / "results.json").read_text())
    assert set(results) == {"machine", "versions", "rows"}
    (row,) = results["rows"]
    for k in ("model", "offload", "precision", "engine", "step_s", "tokens_per_s", "peak_rss_bytes",
              "nvme_read_bytes", "nvme_write_bytes", "losses", "error"):
        assert k in row, k
    assert (row["model"], row["offload"], row["precision"], row["engine"]) == ("tiny", "nvme", "fp32", "zoe")
    assert row["error"] is None
    assert row["step_s"] > 0 and row["tokens_per_s"] == pytest.approx(2 * 16 / row["step_s"])
    assert row["peak_rss_bytes"] > 0
    # Parameters and optimizer states live on NVMe: every step writes the updated states back.
    assert row["nvme_write_bytes"] > 0
    assert (out / "results.md").read_text().count("| tiny | nvme | fp32 |") == 1
    assert (out / "step_time.png").stat().st_size > 0
    # The same batches, file for file, through plain torch: the same losses.
    config = json.loads((out / "configs" / "tiny-nvme-fp32.json").read_text())
    assert config["zero_optimization"]["offload_param"]["device"] == "nvme"
    (batches_file,) = out.glob("batches-tiny-*.pt")
    ref = plain_torch_losses(config, torch.load(batches_file))
    assert len(row["losses"]) == STEPS
    for got, want in zip(row["losses"], ref):
        assert got == pytest.approx(want, rel=1e-5)
    # The harness's own reference (vs_deepspeed.py reference) is that plain torch, and the report
    # compares the row with it.
    harness_ref = json.loads((out / "reference" / "tiny-fp32.json").read_text())
    assert harness_ref["error"] is None and len(harness_ref["losses"]) == STEPS
    for got, want in zip(harness_ref["losses"], ref):
        assert got == pytest.approx(want, rel=1e-6)
    assert row["loss_max_rel_diff_torch"] is not None and row["loss_max_rel_diff_torch"] < 1e-5


def test_busy_rounds_alternate_with_quiet_ones(tmp_path):
    """--busy 1: twice the rounds, every second one with a process spinning beside the engine: the
    row has the quiet and the busy medians (step_times quiet, busy_step_times busy, one a round),
    the report has the busy table, and no spinning process outlives the cell."""
    out = tmp_path / "out"
    cell = [sys.executable, str(HARNESS / "vs_deepspeed.py"), "cell", "--out", str(out), "--model", "tiny",
            "--offload", "cpu", "--precision", "fp32", "--engines", "zoe", "--rounds", "2",
            "--steps-per-round", "1", "--warmup", "0", "--batch", "2", "--seq", "16", "--busy", "1",
            "--nvme-path", str(tmp_path / "nvme")]
    p = subprocess.run(cell, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stderr.count("(1 busy)") == 2, p.stderr
    p = subprocess.run([sys.executable, str(HARNESS / "vs_deepspeed.py"), "report", "--out", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    (row,) = json.loads((out / "results.json").read_text())["rows"]
    assert row["busy_cores"] == 1 and len(row["step_times"]) == 2 and len(row["busy_step_times"]) == 2
    assert row["busy_step_s"] > 0 and row["step_s"] > 0 and len(row["losses"]) == 4
    assert "| tiny | cpu | fp32 | 1 |" in (out / "results.md").read_text()
    spinning = subprocess.run(["pgrep", "-f", "while True: pass"], capture_output=True, text=True)
    assert spinning.stdout.strip() == "", spinning.stdout
    bad = subprocess.run(cell[:-4] + ["--busy", "-1"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--busy -1" in bad.stderr
