"""Two jobs sharing one --save-dir: the second is refused at its start (before any training) with a
message naming the holder; the first trains on, untouched."""
import subprocess
import time
from pathlib import Path

from zoe_testlib import zoe_bin


def test_second_job_on_one_save_dir_is_refused_at_start(tmp_path):
    zoe = zoe_bin()
    save = tmp_path / "ck"
    first = subprocess.Popen([zoe, "train", "--preset", "tiny", "--steps", "100000", "--quiet", "--save-every", "50",
                              "--save-dir", str(save)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 30
        while time.time() < deadline and not (save / ".zoe-lock").exists():
            time.sleep(0.1)
        assert (save / ".zoe-lock").exists(), "the first job did not claim its save dir"
        t0 = time.time()
        second = subprocess.run([zoe, "train", "--preset", "tiny", "--steps", "3", "--quiet", "--save-every", "1",
                                 "--save-dir", str(save)], capture_output=True, text=True, timeout=60)
        assert second.returncode == 1, second.stderr
        assert "zoe: error:" in second.stderr and str(save) in second.stderr, second.stderr
        assert "pid" in second.stderr, second.stderr  # names the holder
        assert not list(Path(save).glob("step-*")), "the second job saved into the first one's directory"
        assert time.time() - t0 < 30
        assert first.poll() is None, "the first job stopped"
    finally:
        first.kill()
        first.wait()
