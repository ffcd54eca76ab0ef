"""Progress of the long commands on stderr when it is not a terminal: a line when they start, then at
most one line per 5 seconds (not one per chunk or pass), and nothing of it on stdout."""
import json

from zoe_testlib import run_zoe


def stderr_lines(p):
    return [line for line in p.stderr.splitlines() if line.strip()]


def test_bench_swap_progress_is_throttled(tmp_path):
    # 8M parameters in 1 MiB buffers: hundreds of chunks per pass, three passes per repeat.
    p = run_zoe("bench", "swap", "--params", "8M", "--sub-group", "2M", "--path", tmp_path, "--repeats", 2,
                "--buffers", 4, "--buffer-size", "1MiB", "--json", json_out=False)
    assert p.returncode == 0, p.stderr
    lines = stderr_lines(p)
    assert lines and lines[0].startswith("registering 8000000 parameters"), p.stderr
    assert len(lines) <= 3, f"{len(lines)} progress lines for a run of a few seconds:\n{p.stderr}"
    assert json.loads(p.stdout)["repeats"] == 2


def test_bench_io_progress_is_throttled(tmp_path):
    p = run_zoe("bench", "io", "--path", tmp_path, "--size", "4MiB", "--bs", "64KiB,128KiB,1MiB",
                "--qd", "1,2,4", "--loops", 2, "--warmup", 1, "--json", json_out=False)
    assert p.returncode == 0, p.stderr
    lines = stderr_lines(p)
    assert 1 <= len(lines) <= 3, p.stderr  # 18 rows x 3 passes would be 54 lines unthrottled
    assert len(json.loads(p.stdout)["rows"]) == 18
