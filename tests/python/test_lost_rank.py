"""A rank lost under mpirun: the surviving rank removes its swap files at once when mpirun stops
it (SIGTERM, then SIGKILL within a second), says so on stderr, and the next run on the same path
reclaims the killed rank's files (found unlocked: their process is gone). The lost-rank heartbeat
is off here (ZOE_COMM_TIMEOUT_S=0), so that mpirun's signal is what stops the survivor; with it,
the survivor finds the loss first (tests/multinode/run.sh, cases kill and link)."""
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from zoe_testlib import zoe_bin


def swap_files(d):
    return sorted(p.name for p in Path(d).glob("*.swap"))


def child_pids(pid):
    try:
        out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    except FileNotFoundError:
        pytest.skip("pgrep is missing")
    return [int(x) for x in out.split()]


def zoe_ranks(mpirun_pid):
    """The zoe processes under mpirun (its children, or their children)."""
    found = []
    for c in child_pids(mpirun_pid):
        try:
            exe = os.readlink(f"/proc/{c}/exe")
        except OSError:
            continue
        if exe.endswith("/zoe"):
            found.append(c)
        else:
            found += [g for g in child_pids(c) if os.readlink(f"/proc/{g}/exe").endswith("/zoe")]
    return sorted(found)


def test_survivor_removes_its_swap_files_and_the_next_run_reclaims_the_lost_ones(tmp_path):
    mpirun = shutil.which("mpirun")
    if not mpirun:
        pytest.skip("mpirun is missing")
    zoe = zoe_bin()
    nvme = tmp_path / "nvme"
    nvme.mkdir()
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_btl="self,vader", ZOE_COMM_TIMEOUT_S="0")
    cmd = [mpirun, "--oversubscribe", "--bind-to", "none", "-np", "2", zoe, "train", "--preset", "tiny",
           "--steps", "100000", "--offload", "nvme", "--nvme-path", str(nvme), "--device-budget", "1MiB",
           "--threads", "1"]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.time() + 60
        ranks = []
        while time.time() < deadline and (len(ranks) < 2 or len(swap_files(nvme)) < 2):
            time.sleep(0.2)
            ranks = zoe_ranks(p.pid)
        assert len(ranks) == 2 and len(swap_files(nvme)) >= 2, f"ranks {ranks}, swap files {swap_files(nvme)}"
        time.sleep(1.0)  # training
        os.kill(ranks[-1], signal.SIGKILL)  # one rank is lost
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode != 0
    assert "stopping at the next step boundary" in err and "swap file(s) unlinked now" in err, err
    left = swap_files(nvme)
    assert len(left) == 1, f"the survivor left its swap files: {left}"  # only the killed rank's
    # The next run on the same path reclaims the lost rank's file.
    r = subprocess.run([zoe, "train", "--preset", "tiny", "--steps", "1", "--quiet", "--offload", "nvme",
                        "--nvme-path", str(nvme), "--device-budget", "1MiB"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert swap_files(nvme) == [], swap_files(nvme)
