"""scripts/zoe_plot.py and `zoe bench io --plot`: the PNG is written with the size asked (read
from its IHDR chunk), for zoe train and zoe bench io JSON; clear failures without matplotlib or
python3, or for JSON it cannot plot."""
import json
import os
import struct
import subprocess
import sys

import pytest

pytest.importorskip("matplotlib")

from zoe_testlib import REPO, run_zoe, zoe_bin  # noqa: E402

SCRIPT = REPO / "scripts" / "zoe_plot.py"


def png_size(path):
    """(width, height) from a PNG's IHDR chunk, which must come first after the signature."""
    raw = path.read_bytes()[:33]
    assert raw[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    length, ctype = struct.unpack(">I4s", raw[8:16])
    assert ctype == b"IHDR" and length == 13
    return struct.unpack(">II", raw[16:24])


def plot(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True,
                          timeout=120)


def test_train_json_from_zoe_train(tmp_path):
    j = run_zoe("train", "--preset", "tiny", "--steps", 3, "--eval-every", 1, "--eval-batches", 1,
                "--precision", "fp32", "--quiet", "--json")
    src = tmp_path / "train.json"
    src.write_text(json.dumps(j))
    out = tmp_path / "train.png"
    p = plot("--width", 640, "--height", 480, src, out)
    assert p.returncode == 0, p.stderr
    assert png_size(out) == (640, 480)


def test_train_with_per_step_times_and_stdin(tmp_path):
    j = {"losses": [5.5, 5.0, 4.2, 3.9], "start_step": 2, "steps": 6,
         "evals": [{"step": 4, "eval_loss": 4.9}, {"step": 6, "eval_loss": 4.1}],
         "step_time_s": [{"compute": 0.1, "comm": 0.01, "io_stall": 0.02, "optimizer": 0.03}] * 4}
    out = tmp_path / "t.png"
    args = [sys.executable, str(SCRIPT), "--kind", "train", "--width", "333", "--height", "222", "-",
            str(out)]
    p = subprocess.run(args, input=json.dumps(j), capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert png_size(out) == (333, 222)


def test_bench_io_plot_through_zoe(tmp_path):
    out = tmp_path / "bw.png"
    j = run_zoe("bench", "io", "--path", tmp_path, "--size", "4MiB", "--bs", "64KiB,1MiB", "--qd", "1,4",
                "--loops", 1, "--warmup", 0, "--json", "--plot", out)
    assert len(j["rows"]) == 8
    assert png_size(out) == (1200, 800)  # write_plot's default size
    # The script alone on the same JSON, another size.
    src = tmp_path / "io.json"
    src.write_text(json.dumps(j))
    p = plot("--width", 800, "--height", 300, src, tmp_path / "io.png")
    assert p.returncode == 0, p.stderr
    assert png_size(tmp_path / "io.png") == (800, 300)


def test_unplottable_json_is_refused(tmp_path):
    src = tmp_path / "x.json"
    src.write_text('{"something": 1}')
    p = plot(src, tmp_path / "x.png")
    assert p.returncode == 2 and "pass --kind" in p.stderr
    src.write_text("{not json")
    p = plot(src, tmp_path / "x.png")
    assert p.returncode == 2 and "not JSON" in p.stderr
    assert not (tmp_path / "x.png").exists()


def test_bench_io_plot_without_matplotlib_or_python(tmp_path):
    # A matplotlib that fails to import, ahead of the real one on the path.
    fake = tmp_path / "fake" / "matplotlib"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('no matplotlib in this test')\n")
    out = tmp_path / "bw.png"
    args = [zoe_bin(), "bench", "io", "--path", str(tmp_path), "--size", "1MiB", "--bs", "1MiB", "--qd", "1",
            "--loops", "1", "--warmup", "0", "--plot", str(out)]
    env = dict(os.environ, PYTHONPATH=str(fake.parent))
    p = subprocess.run(args, capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 1
    assert "python3-matplotlib" in p.stderr and "before the benchmark" in p.stderr, p.stderr
    assert not out.exists()
    env = dict(os.environ, ZOE_PYTHON=str(tmp_path / "no-python3"))
    p = subprocess.run(args, capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 1 and "no-python3 is not an executable" in p.stderr, p.stderr
