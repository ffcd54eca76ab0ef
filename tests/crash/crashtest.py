#!/usr/bin/python3
"""zoe's crash test: random kills and injected faults over a checkpointed NVMe-offloaded training
run, each verified and resumed against an uninterrupted run, then a config fuzzer through the CLI.

Modelled on RocksDB's db_crashtest.py. Standard library only. See tests/crash/README.md.

    python3 tests/crash/crashtest.py --zoe build/bin/zoe --kills 20 --fuzz 500 --seed 1 [--minutes M]

Exit status: 0 when every trial verified and resumed bit-identically and the fuzzer saw no crash and
no hang; 1 when anything failed (the table says what, the kept scratch folder has the evidence);
2 on bad usage or an environment that cannot run the test (no zoe, no reference run).
"""

import argparse
import concurrent.futures
import json
import os
import random
import re
import resource
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time

# ---- processes ----------------------------------------------------------------------------------


class Proc:
    """A child process with stdout/stderr in files (no pipe can fill up) and its own rusage.

    Reaped with os.wait4 so that each run's peak RSS is its own; wait() kills it with SIGKILL
    after `timeout` seconds and marks it timed out (a HANG).
    """

    def __init__(self, cmd, log_prefix, preexec_fn=None, env=None):
        self.cmd = cmd
        self.out_path = log_prefix + ".out"
        self.err_path = log_prefix + ".err"
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            # A session of its own: a timeout kills its whole process group.
            self.p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                      preexec_fn=preexec_fn, env=env, close_fds=True, start_new_session=True)
        self.t0 = time.monotonic()
        self.rc = None
        self.wall = None
        self.maxrss_kb = 0
        self.timed_out = False

    def poll(self):
        if self.rc is not None:
            return self.rc
        pid, status, ru = os.wait4(self.p.pid, os.WNOHANG)
        if pid == 0:
            return None
        self._reaped(status, ru)
        return self.rc

    def _reaped(self, status, ru):
        self.rc = os.waitstatus_to_exitcode(status)  # -N: killed by signal N
        self.p.returncode = self.rc  # Popen must not wait for it again
        self.wall = time.monotonic() - self.t0
        self.maxrss_kb = ru.ru_maxrss

    def signal(self, sig):
        if self.rc is None:
            try:
                os.kill(self.p.pid, sig)
            except ProcessLookupError:
                pass

    def wait(self, timeout):
        deadline = self.t0 + timeout
        nap = 0.0005
        while self.poll() is None:
            if time.monotonic() > deadline:
                self.timed_out = True
                try:
                    os.killpg(self.p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                _, status, ru = os.wait4(self.p.pid, 0)
                self._reaped(status, ru)
                break
            time.sleep(nap)
            nap = min(nap * 1.5, 0.02)
        return self.rc

    def stdout(self):
        with open(self.out_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def stderr(self):
        with open(self.err_path, "rb") as f:
            return f.read().decode("utf-8", "replace")


def run(cmd, log_prefix, timeout, preexec_fn=None, env=None):
    p = Proc(cmd, log_prefix, preexec_fn, env)
    p.wait(timeout)
    return p


def last_line(text):
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else ""


# Signs of a crash that an exit status alone may hide.
CRASH_MARKERS = ("terminate called", "Aborted", "Segmentation fault", "AddressSanitizer",
                 "runtime error:", "ThreadSanitizer", "internal check failed", "core dumped")


def crash_marker(err):
    for m in CRASH_MARKERS:
        if m in err:
            return m
    return None


def error_message(err):
    """The `zoe: error: ...` message that ends stderr (its first line and the indented context
    lines under it, "  while ..."), joined with " / "; "" when stderr does not end in one."""
    lines = [ln for ln in err.splitlines() if ln.strip()]
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("zoe: error: "):
            rest = lines[i + 1:]
            if all(ln.startswith("  ") for ln in rest):
                return " / ".join([lines[i]] + [ln.strip() for ln in rest])
            return ""
    return ""


def strip_launcher(err):
    """stderr of a run under mpirun without mpirun's own notices (blocks between lines of dashes)."""
    out, inside = [], False
    for ln in err.splitlines():
        if re.fullmatch(r"-{20,}", ln.strip()):
            inside = not inside
        elif not inside:
            out.append(ln)
    return "\n".join(out) + "\n"


def said(err):
    """What stderr ended with, for a report: the error message, else the last line."""
    return (error_message(err) or last_line(err))[:300]


def clean_error(rc, err):
    """rc 1/2 ending in one `zoe: error: ...` message, and no crash marker: a clean refusal."""
    return rc in (1, 2) and bool(error_message(err)) and crash_marker(err) is None


def describe_rc(rc):
    if rc is None:
        return "not run"
    if rc < 0:
        try:
            return "killed by %s" % signal.Signals(-rc).name
        except ValueError:
            return "killed by signal %d" % -rc
    return "rc %d" % rc


# ---- scratch: leftovers, tmpfs ------------------------------------------------------------------


def tmp_leftovers(save_dir):
    """Temporaries of unfinished saves: <tag>.tmp-XXXXXX directories, latest.tmp-<pid> files."""
    if not os.path.isdir(save_dir):
        return []
    return sorted(n for n in os.listdir(save_dir) if ".tmp-" in n)


def swap_files(nvme_dir):
    out = []
    for root, _, files in os.walk(nvme_dir):
        out += [os.path.join(root, f) for f in files if f.endswith(".swap")]
    return sorted(out)


def latest_step(save_dir):
    """The step `latest` names (step-NNNNNN), None without `latest`, -1 when it names no step."""
    try:
        with open(os.path.join(save_dir, "latest"), "rb") as f:
            tag = f.read().decode("utf-8", "replace").strip()
    except FileNotFoundError:
        return None
    m = re.fullmatch(r"step-(\d+)", tag)
    return int(m.group(1)) if m else -1


class Tmpfs:
    """A tmpfs of a given size mounted on a directory (root only); resized by remount."""

    available = None  # probed once

    @classmethod
    def probe(cls, scratch):
        if cls.available is None:
            d = os.path.join(scratch, "tmpfs-probe")
            os.makedirs(d, exist_ok=True)
            ok = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", d],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0
            if ok:
                subprocess.run(["umount", d], stderr=subprocess.DEVNULL)
            os.rmdir(d)
            cls.available = ok
        return cls.available

    def __init__(self, path, size_bytes):
        self.path = path
        os.makedirs(path, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=%d" % size_bytes, "tmpfs", path],
                       check=True, stdout=subprocess.DEVNULL)
        self.mounted = True

    def resize(self, size_bytes):
        subprocess.run(["mount", "-o", "remount,size=%d" % size_bytes, self.path], check=True)

    def unmount(self):
        if self.mounted:
            subprocess.run(["umount", "-l", self.path], stderr=subprocess.DEVNULL)
            self.mounted = False


# ---- the training run ---------------------------------------------------------------------------


class TrainRun:
    """The run every trial interrupts: `zoe train --preset tiny`, all states on NVMe behind a
    small device budget, a checkpoint every `save_every` steps."""

    def __init__(self, zoe, steps, save_every, seed, budget):
        self.zoe = zoe
        self.steps = steps
        self.save_every = save_every
        self.seed = seed
        self.budget = budget

    def cmd(self, save_dir, nvme_dirs, async_save, resume=False, ranks=1):
        c = mpirun_prefix(ranks) + [self.zoe, "train", "--preset", "tiny", "--steps", str(self.steps), "--seed",
                                    str(self.seed), "--offload", "nvme"]
        for d in nvme_dirs:
            c += ["--nvme-path", d]
        c += ["--device-budget", self.budget, "--save-every", str(self.save_every), "--save-dir", save_dir,
              "--eval-batches", "1", "--json", "--quiet"]
        if async_save:
            c.append("--save-async")
        if resume:
            c.append("--resume")
        return c


# Runs of several ranks: mpirun on this host (shared memory), the heartbeat's bound set small so that
# a job that does not end within it after one rank is signalled counts as a hang.
RANKS_BOUND_S = 10
RANKS_ENV = dict(os.environ, ZOE_COMM_TIMEOUT_S=str(RANKS_BOUND_S), OMPI_MCA_rmaps_base_oversubscribe="1")


def mpirun_prefix(ranks):
    if ranks <= 1:
        return []
    return [shutil.which("mpirun") or "mpirun", "--allow-run-as-root", "--bind-to", "none", "--mca", "btl",
            "self,vader", "-np", str(ranks)]


def rank_pid(mpirun_pid, zoe, rank):
    """The pid of zoe rank `rank` under a local mpirun (a child whose environment names the rank)."""
    want = b"OMPI_COMM_WORLD_RANK=%d" % rank
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name, "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
            if ppid != mpirun_pid or os.readlink("/proc/%s/exe" % name) != zoe:
                continue
            with open("/proc/%s/environ" % name, "rb") as f:
                if want in f.read().split(b"\0"):
                    return int(name)
        except (OSError, IndexError, ValueError):
            continue
    return None


def parse_summary(stdout):
    """The run's JSON summary with every float kept as its text (compared bit for bit)."""
    try:
        return json.loads(stdout, parse_float=lambda s: s)
    except ValueError:
        return None


def verify(zoe, save_dir, log_prefix, timeout):
    """`zoe ckpt verify` on what `latest` names: (proc, {file: xxh64})."""
    p = run([zoe, "ckpt", "verify", save_dir], log_prefix, timeout)
    hashes = {}
    for ln in p.stdout().splitlines():
        m = re.match(r"^OK\s+(\S+)\s.*\s([0-9a-f]{16})\s*$", ln)
        if m:
            hashes[m.group(1)] = m.group(2)
    return p, hashes


class Reference:
    def __init__(self, losses, hashes, wall):
        self.losses = losses  # the losses' JSON texts
        self.hashes = hashes  # the final checkpoint's files and xxh64s
        self.wall = wall


def reference_run(tr, scratch, async_save, timeout, ranks=1):
    d = os.path.join(scratch, "reference-" + ("async" if async_save else "sync") + ("-%dranks" % ranks if ranks > 1
                                                                                      else ""))
    save, nvme = os.path.join(d, "ck"), os.path.join(d, "nv")
    os.makedirs(nvme)
    p = run(tr.cmd(save, [nvme], async_save, ranks=ranks), os.path.join(d, "train"), timeout,
            env=RANKS_ENV if ranks > 1 else None)
    j = parse_summary(p.stdout()) if p.rc == 0 else None
    if j is None or len(j.get("losses", [])) != tr.steps:
        raise SystemExit("crashtest: the uninterrupted reference run failed (%s): %s\n  %s" %
                         (describe_rc(p.rc), last_line(p.stderr()), " ".join(p.cmd)))
    v, hashes = verify(tr.zoe, save, os.path.join(d, "verify"), timeout)
    if v.rc != 0 or not hashes or latest_step(save) != tr.steps:
        raise SystemExit("crashtest: the reference run's final checkpoint does not verify: %s" %
                         last_line(v.stderr()))
    return Reference(j["losses"], hashes, p.wall)


# ---- kill / fault trials ------------------------------------------------------------------------

# What a trial ends in (the table's columns); only IDENTICAL passes.
IDENTICAL = "identical"
OUTCOMES = [IDENTICAL, "mismatch", "verify-failed", "inconsistent", "resume-failed", "leftovers", "unclear",
            "crash", "hang"]
# What a fault's error message must say, one of (besides the path of the file it failed on).
EFBIG_SAYS, ENOSPC_SAYS = ("File too large",), ("No space left", "are free")
TRUNCATED_SAYS = ("truncated", "Short read", "lost its guard page")
HOLES_SAY = ("has holes",)
FAULT_SAYS = {"efbig-save": EFBIG_SAYS, "efbig-swap": EFBIG_SAYS, "enospc-save": ENOSPC_SAYS,
              "enospc-nvme": ENOSPC_SAYS, "truncate-swap": TRUNCATED_SAYS, "punch-swap": HOLES_SAY}

KILL_PATTERN = ["kill9", "kill9-save", "sigterm", "kill9-chain", "sigterm", "kill9-save", "kill9", "sigint",
                "sigterm-rank", "sigint-rank"]
FAULT_PATTERN = ["efbig-save", "enospc-save", "efbig-swap", "enospc-nvme", "truncate-swap", "punch-swap"]
KINDS = ["kill9", "kill9-save", "kill9-chain", "sigterm", "sigint", "sigterm-rank", "sigint-rank", "efbig-save",
         "efbig-swap", "enospc-save", "enospc-nvme", "truncate-swap", "punch-swap"]
# A signal to one rank of a 2-rank run (mpirun on this host): every rank must stop after the same
# step within RANKS_BOUND_S of it.
RANK_KINDS = ("sigterm-rank", "sigint-rank")
FAULT_KINDS = ("efbig", "enospc", "truncate", "punch")


class Trial:
    def __init__(self, index, kind, async_save, rng):
        self.index = index
        self.kind = kind
        self.async_save = async_save
        self.rng = rng
        self.ended = []  # how each interrupted run ended, e.g. "killed by SIGKILL at 0.21s"
        self.outcome = None
        self.detail = ""
        self.checkpoint = None  # the step `latest` named before the final resume
        self.reclaimed = 0  # stale swap files the resume said it removed
        self.tmp_before = 0  # <tag>.tmp-* left in the save dir for the resume to clean up
        self.swap_before = 0  # swap files left in the NVMe path for the resume to reclaim
        self.dir = None
        self.nvme_dirs = []
        self.pids = []  # of the interrupted runs (swap file names carry them)
        self.ranks = 2 if kind in RANK_KINDS else 1
        self.signalled_rank = None  # the rank a *-rank trial signals

    def fail(self, outcome, detail):
        if self.outcome is None:
            self.outcome = outcome
            self.detail = detail
        return False


class TrialRunner:
    def __init__(self, tr, refs, scratch, timeout, log, refs2=None):
        self.tr = tr
        self.refs = refs  # {False: sync reference, True: async}
        self.refs2 = refs2  # the same for 2 ranks (None: no rank trials)
        self.scratch = scratch
        self.timeout = timeout
        self.log = log

    def _refs(self, t):
        return self.refs2 if t.ranks > 1 else self.refs

    # A 2-rank run whose rank t.signalled_rank alone gets `sig` at a random moment of the run.
    def _signal_rank_run(self, t, cmd, name, sig):
        delay = t.rng.uniform(0.0, 0.95 * min(r.wall for r in self.refs2.values()))
        p = Proc(cmd, os.path.join(t.dir, name), env=RANKS_ENV)
        pid = None
        while p.poll() is None and (pid is None or time.monotonic() - p.t0 < delay):
            if pid is None:
                pid = rank_pid(p.p.pid, self.tr.zoe, t.signalled_rank)
            time.sleep(0.001)
        signalled = time.monotonic()
        if pid is not None and p.poll() is None:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        p.wait(self.timeout)
        return p, delay, p.t0 + p.wall - signalled

    # A run killed with `sig` at a random moment of an uninterrupted run's length.
    def _signal_run(self, t, cmd, name, sig, preexec_fn=None):
        # The warm reference's length: a kill late in it still hits the run before it exits.
        delay = t.rng.uniform(0.0, 0.95 * min(r.wall for r in self.refs.values()))
        p = Proc(cmd, os.path.join(t.dir, name), preexec_fn)
        while p.poll() is None and time.monotonic() - p.t0 < delay:
            time.sleep(0.001)
        p.signal(sig)
        p.wait(self.timeout)
        return p, delay

    # A run killed with SIGKILL while a chosen save is in flight (its <tag>.tmp-* exists).
    def _kill_at_save(self, t, cmd, name, save_dir):
        n = t.rng.randint(1, self.tr.steps // self.tr.save_every)
        prefix = "step-%06d.tmp-" % (n * self.tr.save_every)
        extra = t.rng.uniform(0.0, 0.004)  # into the save: the rank file, its fsync, the renames
        p = Proc(cmd, os.path.join(t.dir, name))
        seen = None
        while p.poll() is None and time.monotonic() - p.t0 < self.timeout:
            try:
                names = os.listdir(save_dir)
            except FileNotFoundError:
                names = []
            if any(x.startswith(prefix) for x in names):
                seen = time.monotonic()
                break
            step = latest_step(save_dir)
            if step is not None and step >= n * self.tr.save_every:
                break  # missed its window: kill now
            time.sleep(0.0003)
        if seen is not None:
            while p.poll() is None and time.monotonic() - seen < extra:
                time.sleep(0.0002)
        p.signal(signal.SIGKILL)
        p.wait(self.timeout)
        return p, n * self.tr.save_every, seen is not None

    # A run whose swap files are cut to 0 bytes at a random moment of its start-up and first steps
    # (once they exist): it must stop with an error naming a swap file, or finish exactly as the
    # reference did (the cut came after the last read of what it destroyed). Never rc 0 with other
    # losses: the holes read back as zeros once later writes extend the files again.
    def _truncate_swap_run(self, t, cmd, name, nvme):
        delay = t.rng.uniform(0.0, 0.5 * min(r.wall for r in self.refs.values()))
        p = Proc(cmd, os.path.join(t.dir, name))
        seen, cut = None, []
        while p.poll() is None and time.monotonic() - p.t0 < self.timeout:
            if seen is None and swap_files(nvme):
                seen = time.monotonic()
            if seen is not None and time.monotonic() - seen >= delay:
                for f in swap_files(nvme):
                    try:
                        os.truncate(f, 0)
                        cut.append(f)
                    except OSError:
                        pass  # removed in between: the run is ending
                break
            time.sleep(0.0003)
        p.wait(self.timeout)
        how = ("truncated %d swap file(s) %.3fs after they appeared" % (len(cut), delay) if cut
               else "ended before the cut")
        return p, how

    # Holes punched over the whole of every live swap file (its size kept), three times 5-50 ms
    # apart, starting at a random moment of the start-up and first steps: the run must fail naming
    # a file that "has holes", or finish with the reference's losses (every punched byte written
    # again before it was read). Never rc 0 with other losses: the holes read back as zeros.
    def _punch_swap_run(self, t, cmd, name, nvme):
        delay = t.rng.uniform(0.0, 0.5 * min(r.wall for r in self.refs.values()))
        p = Proc(cmd, os.path.join(t.dir, name))
        seen, punched, rounds = None, 0, 0
        while p.poll() is None and time.monotonic() - p.t0 < self.timeout and rounds < 3:
            if seen is None and swap_files(nvme):
                seen = time.monotonic()
            if seen is not None and time.monotonic() - seen >= delay:
                for f in swap_files(nvme):
                    try:
                        subprocess.run(["fallocate", "--punch-hole", "--offset", "0", "--length",
                                        str(max(4096, os.path.getsize(f))), f], check=True,
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                        punched += 1
                    except (OSError, subprocess.CalledProcessError):
                        pass  # removed in between: the run is ending
                rounds += 1
                delay += t.rng.uniform(0.005, 0.05)
            time.sleep(0.0003)
        p.wait(self.timeout)
        how = ("punched %d hole(s) over whole swap files in %d round(s) from %.3fs after they appeared" %
               (punched, rounds, delay) if punched else "ended before the holes")
        return p, how

    # The first run of a trial and what its end must look like. False: the trial failed.
    def _interrupted_run(self, t, save, nvme, name, kind, preexec_fn=None, resume=False):
        cmd = self.tr.cmd(save, t.nvme_dirs, t.async_save, resume, ranks=t.ranks)
        sig = {"kill9": signal.SIGKILL, "sigterm": signal.SIGTERM, "sigint": signal.SIGINT,
               "sigterm-rank": signal.SIGTERM, "sigint-rank": signal.SIGINT}.get(kind)
        after = None  # rank trials: seconds from the signal to the job's end
        if kind in RANK_KINDS:
            t.signalled_rank = t.rng.randint(0, t.ranks - 1)
            p, delay, after = self._signal_rank_run(t, cmd, name, sig)
            how = "%s to rank %d at %.3fs" % (signal.Signals(sig).name, t.signalled_rank, delay)
        elif kind == "kill9-save":
            p, target, hit = self._kill_at_save(t, cmd, name, save)
            how = "in save step-%06d" % target if hit else "after save step-%06d (missed)" % target
        elif sig is not None:
            p, delay = self._signal_run(t, cmd, name, sig, preexec_fn)
            how = "%s at %.3fs" % (signal.Signals(sig).name, delay)
        elif kind == "truncate-swap":
            p, how = self._truncate_swap_run(t, cmd, name, nvme)
        elif kind == "punch-swap":
            p, how = self._punch_swap_run(t, cmd, name, nvme)
        else:
            p = run(cmd, os.path.join(t.dir, name), self.timeout, preexec_fn)
            how = kind
        err = strip_launcher(p.stderr()) if t.ranks > 1 else p.stderr()
        t.ended.append("%s: %s" % (how, describe_rc(p.rc)))
        t.pids.append(p.p.pid)
        where = "%s (%s)" % (os.path.join(t.dir, name + ".err"), " ".join(cmd))
        if p.timed_out:
            return t.fail("hang", "%s did not end within %ds: %s" % (name, self.timeout, where))
        if after is not None and after > RANKS_BOUND_S:
            return t.fail("hang", "%s ended %.1fs after the signal to rank %d, beyond the heartbeat's bound "
                          "(ZOE_COMM_TIMEOUT_S=%d): %s" % (name, after, t.signalled_rank, RANKS_BOUND_S, where))
        marker = crash_marker(err)
        if marker:
            return t.fail("crash", "%s printed '%s': %s" % (name, marker, where))
        ok_rcs = {0}
        if sig == signal.SIGKILL or kind == "kill9-save":
            ok_rcs.add(-signal.SIGKILL)
        elif sig is not None:
            # 128+N once zoe handles it; -N when it came before zoe installed its handler.
            ok_rcs |= {128 + sig, -sig}
        if p.rc not in ok_rcs and not clean_error(p.rc, err):
            return t.fail("crash", "%s ended with %s, last stderr line '%s': %s" %
                          (name, describe_rc(p.rc), said(err), where))
        if p.rc in (1, 2) and not kind.startswith(FAULT_KINDS):
            return t.fail("crash", "%s failed without a fault: %s: %s" % (name, said(err), where))
        if p.rc == 0:
            j = parse_summary(p.stdout())
            if j is None:
                return t.fail("crash", "%s exited 0 without its JSON summary: %s" % (name, where))
            first = int(j.get("start_step", -1))
            if first < 0 or j.get("losses") != self._refs(t)[t.async_save].losses[first:]:
                return t.fail("mismatch", "%s finished (rc 0) with losses that differ from the reference "
                              "from step %d: %s" % (name, first + 1, where))
        # A run that exits by itself removes its swap files (kill -9 leaves them to the next run).
        if p.rc >= 0 and swap_files(nvme):
            return t.fail("leftovers", "%s exited (%s) leaving swap files %s" %
                          (name, describe_rc(p.rc), ", ".join(swap_files(nvme))))
        # Stopped by a signal at a step boundary: `latest` names that step (SIGTERM saves it) or the
        # last periodic save before it (SIGINT).
        # A rank killed by the signal itself (it came before zoe installed its handler, at start-up):
        # mpirun says so and ends the job with 128 + N, as a single rank ends with -N. Accepted like
        # that case, when no rank stopped at a boundary (the resume below still checks the bits).
        pre_handler = (kind in RANK_KINDS and p.rc == 128 + (sig or 0) and "stopped by SIG" not in err and
                       re.search(r"process rank %d with PID \d+ on node \S+ exited on signal %d\b" %
                                 (t.signalled_rank, sig or 0), p.stderr()) is not None)
        if pre_handler:
            t.ended[-1] += " (pre-handler)"
        # mpirun aborts the job at the first rank's exit status 128 + N and may drop the ranks'
        # last lines of stderr with it (seen for signals in the first step): the stop is then
        # checked by the resume below (bit for bit), not by the messages.
        elif (kind in RANK_KINDS and p.rc == 128 + (sig or 0) and "stopped by SIG" not in err and
              "the job has been aborted" in p.stderr()):
            pre_handler = True
            t.ended[-1] += " (mpirun's abort cut the ranks' messages)"
        if sig in (signal.SIGTERM, signal.SIGINT) and p.rc == 128 + sig and not pre_handler:
            m = re.search(r"stopped by SIG\w+ after step (\d+) of", err)
            if not m:
                return t.fail("crash", "%s exited %d without saying where it stopped: '%s'" %
                              (name, p.rc, last_line(err)[:300]))
            done = int(m.group(1))
            if t.ranks > 1:
                # Every rank stopped after the same step and names the rank the signal reached.
                steps = re.findall(r"stopped by SIG\w+ after step (\d+) of", err)
                named = "(the signal reached rank %d of %d;" % (t.signalled_rank, t.ranks)
                if len(steps) != t.ranks or len(set(steps)) != 1 or named not in err:
                    return t.fail("inconsistent", "%s: the ranks stopped after steps %s (expected %d ranks "
                                  "after one step, naming rank %d): %s" %
                                  (name, steps, t.ranks, t.signalled_rank, where))
            want = done if sig == signal.SIGTERM else done // self.tr.save_every * self.tr.save_every
            got = latest_step(save)
            if (got or 0) != want:
                return t.fail("inconsistent", "%s stopped after step %d but latest names %s (expected "
                              "step %d)" % (name, done, got, want))
        if p.rc in (1, 2):
            msg = error_message(err)
            t.ended[-1] += " '%s'" % msg[:200]
            # The error names the file (under the trial's directories) and the errno's text.
            if t.dir + "/" not in msg or not any(x in msg for x in FAULT_SAYS[kind]):
                return t.fail("unclear", "%s's error names no file under %s or lacks any of %s: %s" %
                              (name, t.dir, FAULT_SAYS[kind], msg))
            # A save that failed is never what `latest` names.
            m = re.search(r"saving a checkpoint after step (\d+)", err)
            got = latest_step(save)
            if m and got is not None and got >= int(m.group(1)):
                return t.fail("inconsistent", "the save after step %s failed, yet latest names step %d" %
                              (m.group(1), got))
        return True

    # `zoe ckpt verify` on `latest`, when there is one. Returns its step, 0 without, None on failure.
    def _verify(self, t, save, name):
        step = latest_step(save)
        if step is None:
            return 0
        v, _ = verify(self.tr.zoe, save, os.path.join(t.dir, name), self.timeout)
        if v.timed_out:
            t.fail("hang", "zoe ckpt verify %s did not end" % save)
            return None
        if v.rc != 0 or step < 0:
            t.fail("verify-failed", "latest names step %s and zoe ckpt verify %s says (%s): %s" %
                   (step, save, describe_rc(v.rc), last_line(v.stderr())))
            return None
        return step

    # The final resume to the full step count and every check on its result.
    def _resume_and_compare(self, t, save, nvme, step):
        ref = self._refs(t)[t.async_save]
        t.checkpoint = step
        t.tmp_before, t.swap_before = len(tmp_leftovers(save)), len(swap_files(nvme))
        cmd = self.tr.cmd(save, t.nvme_dirs, t.async_save, resume=step > 0, ranks=t.ranks)
        p = run(cmd, os.path.join(t.dir, "resume"), self.timeout, env=RANKS_ENV if t.ranks > 1 else None)
        err = strip_launcher(p.stderr()) if t.ranks > 1 else p.stderr()
        where = "%s (%s)" % (os.path.join(t.dir, "resume.err"), " ".join(cmd))
        m = re.search(r"removed (\d+) stale swap file", err)
        t.reclaimed = int(m.group(1)) if m else 0
        if p.timed_out:
            return t.fail("hang", "the resume did not end within %ds: %s" % (self.timeout, where))
        if p.rc < 0 or p.rc > 2 or crash_marker(err):
            return t.fail("crash", "the resume ended with %s: '%s': %s" %
                          (describe_rc(p.rc), said(err), where))
        if step == self.tr.steps:
            # The killed run had saved its last step: nothing to train, said clearly; the final
            # checkpoint must be the reference's, byte for byte.
            if not (clean_error(p.rc, err) and "leaves nothing to train" in err):
                return t.fail("resume-failed", "resuming a finished run should say 'leaves nothing to "
                              "train', got %s '%s': %s" % (describe_rc(p.rc), said(err), where))
        elif p.rc != 0:
            return t.fail("resume-failed", "the resume from step %d failed: '%s': %s" %
                          (step, said(err), where))
        else:
            j = parse_summary(p.stdout())
            if j is None:
                return t.fail("crash", "the resume exited 0 without its JSON summary: %s" % where)
            if int(j.get("start_step", -1)) != step:
                return t.fail("mismatch", "the resume started at step %s, latest names step %d" %
                              (j.get("start_step"), step))
            got, want = j.get("losses", []), ref.losses[step:]
            if got != want:
                n = min(len(got), len(want))
                k = next((i for i in range(n) if got[i] != want[i]), n)
                return t.fail("mismatch", "resumed from step %d: step %d's loss is %s, the reference's "
                              "%s: %s" % (step, step + k + 1, got[k] if k < len(got) else "missing",
                                          want[k] if k < len(want) else "missing", where))
        v, hashes = verify(self.tr.zoe, save, os.path.join(t.dir, "verify-final"), self.timeout)
        if v.rc != 0:
            return t.fail("verify-failed", "the final checkpoint does not verify: %s" % last_line(v.stderr()))
        if hashes != ref.hashes:
            return t.fail("mismatch", "the final checkpoint's files %s differ from the reference's %s" %
                          (hashes, ref.hashes))
        left = tmp_leftovers(save) if step < self.tr.steps else []
        if left:
            return t.fail("leftovers", "after the resume %s still holds %s" % (save, ", ".join(left)))
        if swap_files(nvme):
            return t.fail("leftovers", "after the resume %s still holds %s" %
                          (nvme, ", ".join(swap_files(nvme))))
        return True

    def run(self, t):
        t.dir = os.path.join(self.scratch, "trial-%03d-%s" % (t.index, t.kind))
        save, nvme = os.path.join(t.dir, "ck"), os.path.join(t.dir, "nv")
        os.makedirs(nvme)
        # Three stripes keep each swap file smaller than the checkpoint's rank file, so that a
        # file-size limit between the two hits the save, not the swap space.
        t.nvme_dirs = [os.path.join(nvme, x) for x in "abc"] if t.kind == "efbig-save" else [nvme]
        for d in t.nvme_dirs:
            os.makedirs(d, exist_ok=True)
        mounts = []
        try:
            ok = self._run_kind(t, save, nvme, mounts)
            if ok:
                step = self._verify(t, save, "verify")
                if step is not None:
                    for m in mounts:
                        m.resize(256 << 20)  # room for the resume
                    if self._resume_and_compare(t, save, nvme, step):
                        t.outcome = IDENTICAL
        finally:
            for m in mounts:
                m.unmount()
        if t.outcome == IDENTICAL:
            shutil.rmtree(t.dir, ignore_errors=True)
        return t

    def _run_kind(self, t, save, nvme, mounts):
        k = t.kind
        if k in ("kill9", "kill9-save", "sigterm", "sigint") + RANK_KINDS:
            return self._interrupted_run(t, save, nvme, "train", k)
        if k == "kill9-chain":
            # Three kill -9s in a row on the same directories, each run resuming from what the one
            # before left (checkpoints, temporaries, swap files); each checkpoint must verify.
            for n in range(3):
                step = latest_step(save)
                if step == self.tr.steps:
                    break
                if not self._interrupted_run(t, save, nvme, "train-%d" % n, "kill9", resume=step is not None):
                    return False
                if n < 2 and self._verify(t, save, "verify-%d" % n) is None:
                    return False
            return True
        if k in ("efbig-save", "efbig-swap"):
            # A killed run first (a checkpoint may exist), then a resume under `ulimit -f` small
            # enough that the next checkpoint's rank file (1.67 MiB; the swap files, striped over
            # three paths, stay below 1.1 MiB) or a swap file hits EFBIG: it must fail with a clear
            # message and leave `latest` on a checkpoint that verifies.
            if not self._interrupted_run(t, save, nvme, "train", "kill9"):
                return False
            if latest_step(save) == self.tr.steps:
                # The kill came after the run's last checkpoint: there is nothing left to save
                # under the limit, and the resume check already passed on the complete run.
                t.ended.append("finished before the fault")
                return True
            if k == "efbig-save":
                limit = t.rng.randint(1200 << 10, 1650 << 10)
            else:
                limit = int(2 ** t.rng.uniform(12, 20))  # 4 KiB .. 1 MiB
            t.ended.append("ulimit -f %d bytes" % limit)

            def fsize():
                resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

            resume = latest_step(save) is not None
            return self._interrupted_run(t, save, nvme, "train-efbig", k, fsize, resume=resume)
        if k == "enospc-save":
            # The save dir on a tmpfs that holds one to three checkpoints: a save fails with ENOSPC,
            # the previous checkpoint stays; the resume gets room.
            size = t.rng.randint(1 << 20, 6 << 20)
            mounts.append(Tmpfs(save, size))
            t.ended.append("save dir tmpfs %d KiB" % (size >> 10))
            return self._interrupted_run(t, save, nvme, "train", "enospc-save")
        if k == "enospc-nvme":
            # The NVMe path on a tmpfs smaller than the swap files need (sometimes large enough).
            size = t.rng.randint(64 << 10, 4 << 20)
            mounts.append(Tmpfs(nvme, size))
            t.ended.append("nvme tmpfs %d KiB" % (size >> 10))
            return self._interrupted_run(t, save, nvme, "train", "enospc-nvme")
        if k in ("truncate-swap", "punch-swap"):
            return self._interrupted_run(t, save, nvme, "train", k)
        raise ValueError(k)


# ---- config fuzzer ------------------------------------------------------------------------------


class Obj(list):
    """A JSON object as a list of (key, value) pairs: keys may repeat, order is kept."""


class Raw(str):
    """Text spliced into the JSON as it is (numbers no float64 holds: 1e400, 2^64)."""


NASTY_NUMBERS = ["1e400", "-1e400", "-1", "0", "-0.0", "0.5", "1.5", "2147483647", "2147483648", "4294967295",
                 "4294967296", "4294967297", "9007199254740993", "9223372036854775807", "9223372036854775808",
                 "18446744073709551615", "18446744073709551616", "-9223372036854775809", "1e19", "1e308",
                 "-1e308", "1e-300", "5e-324", "1073741824", "4398046511104", "1e999999", "123456789e-999",
                 "0.000000000000000000000000000000000000000000001", "1" + "0" * 400]
NASTY_STRINGS = ["NaN", "nan", "inf", "-inf", "Infinity", "1e400", "-1", "", " ", "auto", "true", "null",
                 "1MiB", "-1MiB", "0B", "256GiB", "99999999999999999999GiB", "1.5.5MiB", "\u0000", "a\u0000b",
                 "\ud800", "\u202e", "../../../../etc/passwd", "/", "/proc", "/dev/null", "%s%s%n",
                 "\\", "\""]
NASTY_VALUES = [None, True, False, [], Obj(), [1, 2, 3], Obj([("enabled", True)]), Obj([("device", "nvme")]),
                0, -1, 3.5]
KNOWN_KEYS = ["stage", "device", "nvme_path", "enabled", "lr", "betas", "eps", "type", "params",
              "buffer_count",
              "buffer_size", "queue_depth", "block_size", "thread_count", "sub_group_size",
              "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size",
              "zero_optimization", "offload_optimizer", "offload_param", "aio", "zoe", "device_budget",
              "host_budget", "optimizer_threads", "loss_scale", "initial_scale_power", "scheduler",
              "warmup_num_steps", "total_num_steps", "gradient_clipping", "fp16", "bf16", "ratio"]


def to_tree(v):
    """A copy of v's containers (iterative: a mutation nests 100,000 deep)."""
    if not isinstance(v, list):
        return v
    root = Obj() if isinstance(v, Obj) else []
    stack = [(v, root)]
    while stack:
        src, dst = stack.pop()
        for item in src:
            k, x = item if isinstance(src, Obj) else (None, item)
            if isinstance(x, list):
                copy = Obj() if isinstance(x, Obj) else []
                stack.append((x, copy))
                x = copy
            dst.append((k, x) if isinstance(src, Obj) else x)
    return root


def load_seed(text):
    return json.loads(text, object_pairs_hook=lambda pairs: Obj(pairs))


def dump(v, out):
    """Serialises a tree iteratively (a mutation nests 100,000 deep)."""
    stack = [v]
    while stack:
        x = stack.pop()
        if isinstance(x, Raw):
            out.append(str(x))
        elif isinstance(x, Obj):
            out.append("{")
            items = []
            for i, (k, val) in enumerate(x):
                if i:
                    items.append(Raw(","))
                items.append(Raw(json.dumps(k) + ":"))
                items.append(val)
            items.append(Raw("}"))
            stack.extend(reversed(items))
        elif isinstance(x, list):
            items = [Raw("[")]
            for i, val in enumerate(x):
                if i:
                    items.append(Raw(","))
                items.append(val)
            items.append(Raw("]"))
            stack.extend(reversed(items))
        else:
            out.append(json.dumps(x))
    return out


def nodes_of(tree):
    """Every container in the tree with each slot: (container, index) pairs."""
    out, stack = [], [tree]
    while stack:
        c = stack.pop()
        for i in range(len(c)):
            out.append((c, i))
            child = c[i][1] if isinstance(c, Obj) else c[i]
            if isinstance(child, list):
                stack.append(child)
    return out


def get_slot(c, i):
    return c[i][1] if isinstance(c, Obj) else c[i]


def set_slot(c, i, v):
    if isinstance(c, Obj):
        c[i] = (c[i][0], v)
    else:
        c[i] = v


def put_path(tree, path, v):
    """Sets the key at `path` (a tuple of keys) in the object `tree`, making the objects on the way."""
    c = tree
    for k in path[:-1]:
        at = next((j for j, (key, _) in enumerate(c) if key == k), None)
        if at is None or not isinstance(c[at][1], Obj):
            child = Obj()
            if at is None:
                c.append((k, child))
            else:
                c[at] = (k, child)
        c = next(val for key, val in c if key == k)
    at = next((j for j, (key, _) in enumerate(c) if key == path[-1]), None)
    if at is None:
        c.append((path[-1], v))
    else:
        c[at] = (path[-1], v)


# Keys zoe computes in fp32, and numbers at and past the edges of that precision (and of a double's:
# 1e-400 reads as 0): each must be refused naming the key, or train.
FLOAT_KEYS = [("optimizer", "params", "lr"), ("optimizer", "params", "eps"), ("optimizer", "params", "weight_decay"),
              ("fp16", "loss_scale"), ("fp16", "min_loss_scale"), ("gradient_clipping",), ("zoe", "offload_ratio"),
              ("zero_optimization", "offload_optimizer", "ratio"), ("scheduler", "params", "warmup_max_lr")]
FLOAT_EDGES = ["1e308", "3e38", "3.4e38", "3.5e38", "1e-300", "1e-400", "-1e-400", "1e-38", "1.2e-38", "1e-45",
               "0e-400", "-0.0", "1e-30"]
# Keys whose null must not silently mean the default.
NULL_KEYS = [("zero_optimization", "stage"), ("optimizer", "params", "lr"), ("bf16", "enabled"),
             ("fp16", "enabled"), ("fp16", "loss_scale"), ("zero_optimization", "offload_optimizer", "buffer_count"),
             ("train_batch_size",), ("train_micro_batch_size_per_gpu",), ("gradient_accumulation_steps",),
             ("zoe", "offload_ratio"), ("amp", "enabled"), ("zero_optimization", "offload_optimizer", "nvme_path")]
# Batch values: small ones, and ones past the keys' bound (2^20) that a derived value reaches too.
# (2^20 itself is legal and would make a one-step run of 2^20 micro-batches: not a fuzz case.)
BATCH_VALUES = [1, 2, 3, 7, (1 << 20) + 1, 1 << 30, 1 << 31, (1 << 32) + 1, 1 << 42, 1 << 62, 2 ** 63]


def mutate_semantic(tree, op, rng):
    """The batch triple with derived values, a float key at a precision edge, or a key set to null."""
    if op == "batch":
        # Any one or two of the three given (the third derived), or all three.
        keys = ["train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"]
        given = rng.sample(keys, rng.choice([1, 2, 2, 3]))
        for k in keys:
            at = next((j for j, (key, _) in enumerate(tree) if key == k), None)
            if at is not None:
                del tree[at]
        for k in given:
            tree.append((k, rng.choice(BATCH_VALUES) if k == "train_batch_size" or rng.random() < 0.3 else
                         rng.choice([1, 2, 4])))
    elif op == "float":
        put_path(tree, rng.choice(FLOAT_KEYS), Raw(rng.choice(FLOAT_EDGES)))
    elif op == "null":
        put_path(tree, rng.choice(NULL_KEYS), None)


def mutate_tree(tree, rng):
    """1-3 edits of the parsed config; returns the names of the edits made."""
    names = []
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        slots = nodes_of(tree)
        if not slots:
            break
        c, i = rng.choice(slots)
        v = get_slot(c, i)
        op = rng.choice(["number", "number", "plausible", "plausible", "string", "type", "delete",
                         "duplicate", "rename", "nest", "add", "scale", "huge-string", "batch", "float", "null"])
        if op in ("batch", "float", "null"):
            if not isinstance(tree, Obj):
                continue
            mutate_semantic(tree, op, rng)
        elif op == "plausible":
            # A value in range, or nearly: these configs train, through the engine's less used paths.
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                choices = [0, 1, 2, 3, 4, 7, 8, 16, 64, 1024, 4096, 65536, 1e5, 0.5, 1e-3, 1e-6, 0.999]
                set_slot(c, i, rng.choice(choices + [v * 2, v / 2, int(v) + 1]))
            else:
                set_slot(c, i, rng.choice([True, False, 1, 2, 3, 0.5, "cpu", "nvme", "none", "1MiB", "64MiB",
                                           "WarmupLR", "AdamW", "Adam", "linear", "log", "int8", "int4", "bf16",
                                           "fp32"]))
        elif op == "number":
            set_slot(c, i, Raw(rng.choice(NASTY_NUMBERS)))
        elif op == "string":
            set_slot(c, i, rng.choice(NASTY_STRINGS))
        elif op == "type":
            set_slot(c, i, to_tree(rng.choice(NASTY_VALUES)) if rng.random() < 0.7 else
                     ([v] if rng.random() < 0.5 else Obj([("value", v)])))
        elif op == "delete":
            del c[i]
        elif op == "duplicate":
            if isinstance(c, Obj):
                c.insert(rng.randint(0, len(c)), (c[i][0], to_tree(rng.choice(NASTY_VALUES + [v]))))
            else:
                c.insert(i, v)
        elif op == "rename":
            if isinstance(c, Obj):
                k = c[i][0]
                k2 = rng.choice([k.upper(), k[:-1], k + "_", k.replace("_", "-"), rng.choice(KNOWN_KEYS),
                                 " " + k, k + "\u0000", ""])
                c[i] = (k2, c[i][1])
            else:
                op = "type"
                set_slot(c, i, Obj([(rng.choice(KNOWN_KEYS), v)]))
        elif op == "nest":
            depth = rng.choice([3, 30, 200, 1000, 100000])
            obj = rng.random() < 0.5
            for _ in range(depth):
                v = Obj([("a", v)]) if obj else [v]
            set_slot(c, i, v)
            op = "nest-%d" % depth
        elif op == "add":
            if isinstance(c, Obj):
                value = rng.choice(NASTY_VALUES + [Raw(rng.choice(NASTY_NUMBERS))])
                c.append((rng.choice(KNOWN_KEYS), to_tree(value)))
            else:
                c.append(Raw(rng.choice(NASTY_NUMBERS)))
        elif op == "scale":
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                set_slot(c, i, Raw(repr(float(v) * rng.choice([-1, 1e12, 1e300, 1e-12, 2 ** 31, 0.999999]))))
            else:
                set_slot(c, i, Raw(rng.choice(NASTY_NUMBERS)))
        elif op == "huge-string":
            set_slot(c, i, rng.choice("AZ/%\\") * rng.choice([4096, 1 << 20]))
        names.append(op.split("-")[0] if op.startswith("nest") else op)
    return names


def mutate_text(data, rng):
    """A mutation of the bytes; returns (bytes, name)."""
    op = rng.choice(["truncate", "bytes", "nul", "nul-prefix", "insert", "garbage", "empty", "random", "bom",
                     "comment", "huge"])
    n = len(data)
    if op == "truncate":
        data = data[:rng.randint(0, max(0, n - 1))]
    elif op == "bytes":
        b = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            if b:
                byte = rng.choice([0, 0xFF, 0x80, ord('"'), ord("{"), ord("]"), rng.randrange(256)])
                b[rng.randrange(len(b))] = byte
        data = bytes(b)
    elif op == "nul":
        at = rng.randint(0, n)
        data = data[:at] + b"\0" + data[at:]
    elif op == "nul-prefix":
        data = b'{"zoe":{}}\0' + data  # a NUL must not end the config silently
    elif op == "insert":
        at = rng.randint(0, n)
        data = data[:at] + rng.choice([b"1e400", b",", b"}", b"[", b'"', b"\\u0000", b"\xc3\x28"]) + data[at:]
    elif op == "garbage":
        data = data + rng.choice([b"}", b"{}", b" x", b"\n\n[1]", b"\0"])
    elif op == "empty":
        data = rng.choice([b"", b" ", b"\n", b"null", b"[]", b"0", b'""', b"true"])
    elif op == "random":
        data = bytes(rng.randrange(256) for _ in range(rng.randint(1, 4096)))
    elif op == "bom":
        data = b"\xef\xbb\xbf" + data
    elif op == "comment":
        data = b"// DeepSpeed config\n" + data
    elif op == "huge":
        data = b" " * (rng.choice([4, 64]) << 20) + data  # past any sane size cap
    return data, "text-" + op


# @FIFO@: a FIFO with no writer as --config (a plain open waited for one forever).
SPECIAL_INPUTS = ["/dev/zero", "/dev/urandom", "/dev/null", "@DIR@", "@MISSING@", "@FIFO@"]

# Output flags pointed at what is not a regular file, or inside a save directory: (name, how the
# path is made, the command's arguments after the zoe binary, with @PATH@ and @SAVE@). zoe must
# refuse at once and leave the path as it was (outputs were renamed over device nodes).
NODE_CASES = [
    ("train-trace-fifo", "fifo", ["train", "--preset", "tiny", "--steps", "1", "--eval-batches", "1", "--quiet",
                                  "--trace", "@PATH@"]),
    ("train-trace-chardev", "chardev", ["train", "--preset", "tiny", "--steps", "1", "--eval-batches", "1",
                                        "--quiet", "--trace", "@PATH@"]),
    ("consolidate-out-fifo", "fifo", ["ckpt", "consolidate", "@SAVE@", "--out", "@PATH@"]),
    ("consolidate-out-chardev", "chardev", ["ckpt", "consolidate", "@SAVE@", "--out", "@PATH@"]),
    ("consolidate-out-latest", "latest", ["ckpt", "consolidate", "@SAVE@", "--out", "@PATH@"]),
]


def make_node(path, how, save):
    """Makes the path of a node case; returns its file type (stat.S_IFMT), None when not permitted."""
    if how == "fifo":
        os.mkfifo(path)
        return stat.S_IFIFO
    if how == "chardev":
        try:
            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # /dev/null's numbers
        except PermissionError:
            return None  # only root may make one
        return stat.S_IFCHR
    return stat.S_IFREG  # "latest": the save directory's own pointer


def file_type(path):
    try:
        return stat.S_IFMT(os.lstat(path).st_mode)
    except FileNotFoundError:
        return None


def classify(case, p, err, nvme, timeout, loader_refusal=False):
    """Sets case's rc, times, message and outcome (ran, refused, crash, hang, leftovers) from its
    finished run p (stderr err) and its NVMe folder."""
    case.rc, case.wall, case.maxrss_kb = p.rc, p.wall, p.maxrss_kb
    case.message = said(err)
    if p.timed_out:
        case.outcome, case.detail = "hang", "no end within %ds" % timeout
    elif loader_refusal and p.rc == 127 and "error while loading shared libraries" in err:
        case.outcome = "refused"
    elif crash_marker(err) or p.rc not in (0, 1, 2):
        case.outcome = "crash"
        case.detail = "%s, last stderr line '%s'" % (describe_rc(p.rc), case.message)
    elif p.rc == 0:
        case.outcome = "ran"
    elif clean_error(p.rc, err):
        case.outcome = "refused"
    else:
        case.outcome = "crash"
        case.detail = "rc %d without a 'zoe: error:' line (last stderr line '%s')" % (p.rc, case.message)
    if case.outcome in ("ran", "refused") and swap_files(nvme):
        case.outcome = "leftovers"
        case.detail = "exited (%s) leaving %s" % (describe_rc(p.rc), swap_files(nvme))


class FuzzCase:
    def __init__(self, index, seed_name, ops, path):
        self.index = index
        self.seed_name = seed_name
        self.ops = ops
        self.path = path
        self.outcome = None  # ran, refused, crash, hang, leftovers
        self.detail = ""
        self.rc = None
        self.wall = 0.0
        self.maxrss_kb = 0
        self.message = ""


class Fuzzer:
    def __init__(self, zoe, seeds, scratch, seed, timeout, mem_limit):
        self.zoe = zoe
        self.seeds = seeds  # [(name, text)]
        self.scratch = os.path.join(scratch, "fuzz")
        os.makedirs(self.scratch)
        self.seed = seed
        self.timeout = timeout
        self.mem_limit = mem_limit

    def make(self, i):
        """Case i, the same for a given --seed whatever the order they run in."""
        rng = random.Random("%d/%d" % (self.seed, i))
        d = os.path.join(self.scratch, "%05d" % i)
        nvme = os.path.join(d, "nv")
        os.makedirs(nvme)
        if i < len(SPECIAL_INPUTS):
            s = SPECIAL_INPUTS[i]
            path = {"@DIR@": d, "@MISSING@": os.path.join(d, "missing.json"),
                    "@FIFO@": os.path.join(d, "fifo.json")}.get(s, s)
            if s == "@FIFO@":
                os.mkfifo(path)
            return FuzzCase(i, "-", ["special:" + os.path.basename(path)], path), d, nvme
        name, text = self.seeds[rng.randrange(len(self.seeds))]
        tree = load_seed(text.replace("@NVME@", nvme))
        ops = mutate_tree(tree, rng) if rng.random() < 0.85 else []
        data = "".join(dump(tree, [])).encode("utf-8", "surrogatepass")
        if not ops or rng.random() < 0.3:
            data, op = mutate_text(data, rng)
            ops.append(op)
        path = os.path.join(d, "config.json")
        with open(path, "wb") as f:
            f.write(data)
        return FuzzCase(i, name, ops, path), d, nvme

    def run_case(self, i):
        case, d, nvme = self.make(i)
        cmd = [self.zoe, "train", "--config", case.path, "--preset", "tiny", "--steps", "1",
               "--eval-batches", "1", "--quiet"]
        limit = self.mem_limit

        def limits():
            if limit:
                resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

        env = dict(os.environ, ZOE_SCRATCH=nvme)
        p = run(cmd, os.path.join(d, "train"), self.timeout, limits, env)
        err = p.stderr()
        classify(case, p, err, nvme, self.timeout)
        case.cmd = " ".join(cmd)
        if case.ops == ["special:fifo.json"] and file_type(case.path) != stat.S_IFIFO:
            case.outcome, case.detail = "clobbered", "the FIFO is gone"
        if case.outcome in ("ran", "refused"):
            shutil.rmtree(d, ignore_errors=True)
        else:
            case.detail += "; kept in %s" % d
        return case


    def node_case(self, i, name, how, args, ref_save):
        """NODE_CASES[i]: the command must end in a clean refusal and leave the path as it was."""
        d = os.path.join(self.scratch, "node-%d" % i)
        os.makedirs(d)
        save = ref_save
        path = os.path.join(d, "node")
        if how == "latest":  # a copy of the reference's save directory: its pointer is the target
            save = os.path.join(d, "save")
            shutil.copytree(ref_save, save)
            path = os.path.join(save, "latest")
        want = make_node(path, how, save)
        if want is None:
            return None
        case = FuzzCase(i, "-", ["node:" + name], path)
        cmd = [self.zoe] + [save if a == "@SAVE@" else path if a == "@PATH@" else a for a in args]
        env = dict(os.environ, ZOE_SCRATCH=d)
        p = run(cmd, os.path.join(d, "run"), self.timeout, None, env)
        err = p.stderr()
        case.rc, case.wall, case.maxrss_kb = p.rc, p.wall, p.maxrss_kb
        case.message, case.cmd = said(err), " ".join(cmd)
        if p.timed_out:
            case.outcome, case.detail = "hang", "no end within %ds" % self.timeout
        elif crash_marker(err) or p.rc not in (0, 1, 2):
            case.outcome, case.detail = "crash", "%s, last stderr line '%s'" % (describe_rc(p.rc), case.message)
        elif file_type(path) != want:
            case.outcome, case.detail = "clobbered", "%s is no longer what it was" % path
        elif how == "latest" and verify(self.zoe, save, os.path.join(d, "verify"), self.timeout)[0].rc != 0:
            case.outcome, case.detail = "clobbered", "the save directory no longer verifies"
        elif p.rc == 0 or not clean_error(p.rc, err):
            case.outcome, case.detail = "crash", "%s, not a refusal (last stderr line '%s')" % (
                describe_rc(p.rc), case.message)
        else:
            case.outcome = "refused"
        if case.outcome == "refused":
            shutil.rmtree(d, ignore_errors=True)
        else:
            case.detail += "; kept in %s" % d
        return case

    def node_cases(self, ref_save):
        cases = [self.node_case(i, *c, ref_save) for i, c in enumerate(NODE_CASES)]
        return [c for c in cases if c is not None]


FUZZ_OUTCOMES = ["ran", "refused", "crash", "hang", "leftovers", "clobbered"]


# ---- a tight address-space limit ----------------------------------------------------------------


class AddressSpaceRuns:
    """`zoe train` of a preset and an offload under a random RLIMIT_AS (`ulimit -v`) between 150
    MiB and 2 GiB: each run ends within its timeout, finished (rc 0) or refused with one
    `zoe: error:` line (rc 1/2), with no crash marker and no swap file left behind. Below about
    200 MiB the dynamic loader cannot map zoe's libraries (rc 127): that is counted as refused."""

    PRESETS = ["tiny", "small"]
    OFFLOADS = ["none", "cpu", "nvme"]

    def __init__(self, zoe, scratch, seed, timeout):
        self.zoe = zoe
        self.scratch = os.path.join(scratch, "ulimit")
        os.makedirs(self.scratch)
        self.seed = seed
        self.timeout = timeout

    def run_case(self, i):
        rng = random.Random("%d/ulimit/%d" % (self.seed, i))
        preset, offload = rng.choice(self.PRESETS), rng.choice(self.OFFLOADS)
        limit_mib = rng.randint(150, 2048)
        threads = rng.choice([1, 2])
        d = os.path.join(self.scratch, "%04d" % i)
        nvme = os.path.join(d, "nv")
        os.makedirs(nvme)
        cmd = [self.zoe, "train", "--preset", preset, "--offload", offload, "--nvme-path", nvme, "--steps", "2",
               "--threads", str(threads), "--eval-batches", "1", "--quiet"]
        if offload != "nvme":
            cmd[cmd.index("--nvme-path"):cmd.index("--nvme-path") + 2] = []
        case = FuzzCase(i, "-", ["%s/%s" % (preset, offload)], "")
        limit = limit_mib << 20

        def limits():
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

        p = run(cmd, os.path.join(d, "train"), self.timeout, limits, dict(os.environ, ZOE_SCRATCH=nvme))
        err = p.stderr()
        # rc 127 from the dynamic loader (zoe's libraries do not fit the limit): refused before zoe runs.
        classify(case, p, err, nvme, self.timeout, loader_refusal=True)
        case.cmd = "ulimit -v %d; %s" % (limit >> 10, " ".join(cmd))
        case.detail += "" if case.outcome in ("ran", "refused") else "; kept in %s" % d
        if case.outcome in ("ran", "refused"):
            shutil.rmtree(d, ignore_errors=True)
        return case

# ---- report -------------------------------------------------------------------------------------

ENDS = ["killed", "stopped", "pre-handler", "finished", "refused"]


def count(items, pred):
    return sum(1 for x in items if pred(x))


def report(a, trials, cases, limited, skipped, refs, n_seeds, elapsed, scratch):
    """Prints the tables (stdout, or stderr with --json) and the JSON object; True when all passed."""
    f = sys.stderr if a.json else sys.stdout
    rows, by_kind = [], {}
    for k in KINDS:
        ts = [t for t in trials if t.kind == k]
        if not ts and k not in skipped:
            continue
        # How the interrupted run ended; for a fault, the run under it (efbig: after a kill -9).
        fault = k in FAULT_PATTERN
        first = [ended_kind(t.ended[-1] if fault else t.ended[0]) for t in ts if t.ended]
        ckpt = count(ts, lambda t: t.checkpoint)
        outcomes = {o: count(ts, lambda t: t.outcome == o) for o in OUTCOMES}
        name = k + (" (%d skipped)" % skipped[k] if k in skipped else "")
        rows.append([name, len(ts)] + [first.count(e) for e in ENDS] + [ckpt] + list(outcomes.values()))
        by_kind[k] = {"trials": len(ts), "skipped": skipped.get(k, 0),
                      "ended": {e: first.count(e) for e in ENDS}, "resumed_from_checkpoint": ckpt,
                      "outcomes": outcomes}
    columns = range(2, 2 + len(ENDS) + 1 + len(OUTCOMES))
    rows.append(["total", len(trials)] + [sum(r[c] for r in rows) for c in columns])
    title = ("# zoe crash test: %d steps of `zoe train --preset tiny --offload nvme --device-budget %s`, "
             "a checkpoint every %d, seed %d, %.0fs" %
             (a.steps, a.device_budget, a.save_every, a.seed, elapsed))
    print_table(title, ["kind", "trials"] + ENDS + ["ckpt"] + OUTCOMES, rows, f)
    reclaimed = sum(t.reclaimed for t in trials)
    tmp_before = count(trials, lambda t: t.tmp_before)
    swap_before = count(trials, lambda t: t.swap_before)
    print("(ended: how the interrupted run ended; ckpt: resumed from a checkpoint, not from scratch; "
          "%d trials left <tag>.tmp-* for the resume to remove, %d left swap files, %d reclaimed by the "
          "resumes)" %
          (tmp_before, swap_before, reclaimed), file=f)

    by_op = {}
    for c in cases:
        for op in set(c.ops):
            by_op.setdefault(op.split(":")[0] if ":" in op else op, []).append(c)
    fuzz_rows = [[op, len(cs)] + [count(cs, lambda c: c.outcome == o) for o in FUZZ_OUTCOMES]
                 for op, cs in sorted(by_op.items())]
    totals = [count(cases, lambda c: c.outcome == o) for o in FUZZ_OUTCOMES]
    fuzz_rows.append(["total (configs)", len(cases)] + totals)
    print("", file=f)
    title = ("# config fuzzer: %d mutated configs of %d seeds (tests/crash/configs) through `zoe train "
             "--config F --preset tiny --steps 1`, %gs timeout, %d at once" %
             (len(cases), n_seeds, a.fuzz_timeout, a.jobs))
    print_table(title, ["mutation", "configs"] + FUZZ_OUTCOMES, fuzz_rows, f)
    if cases:
        slowest = max(cases, key=lambda c: c.wall)
        biggest = max(cases, key=lambda c: c.maxrss_kb)
        oom = count(cases, lambda c: "out of memory" in c.message)
        print("(a config can carry several mutations; slowest %.1fs (config %d), largest RSS %d MiB "
              "(config %d), %d refused as out of memory under the %d MiB limit)" %
              (slowest.wall, slowest.index, biggest.maxrss_kb >> 10, biggest.index, oom, a.fuzz_mem), file=f)

    if limited:
        by_run = {}
        for c in limited:
            by_run.setdefault(c.ops[0], []).append(c)
        rows = [[r, len(cs)] + [count(cs, lambda c: c.outcome == o) for o in FUZZ_OUTCOMES]
                for r, cs in sorted(by_run.items())]
        rows.append(["total (runs)", len(limited)] + [count(limited, lambda c: c.outcome == o)
                                                      for o in FUZZ_OUTCOMES])
        print("", file=f)
        print_table("# a tight address-space limit: `zoe train --preset P --offload O --steps 2` under ulimit -v "
                    "of 150 MiB .. 2 GiB, %gs timeout" % a.ulimit_timeout,
                    ["preset/offload", "runs"] + FUZZ_OUTCOMES, rows, f)
    bad_trials = [t for t in trials if t.outcome != IDENTICAL]
    bad_cases = [c for c in cases + limited if c.outcome not in ("ran", "refused")]
    ok = not bad_trials and not bad_cases
    runs = cases + limited
    print("\n%s: %d trials (%d identical), %d configs and %d runs under ulimit -v (%d crashes, %d hangs, %d "
          "left swap files)" %
          ("OK" if ok else "FAILED", len(trials), len(trials) - len(bad_trials), len(cases), len(limited),
           count(runs, lambda c: c.outcome == "crash"), count(runs, lambda c: c.outcome == "hang"),
           count(runs, lambda c: c.outcome == "leftovers")), file=f)
    for t in bad_trials:
        mode = "async" if t.async_save else "sync"
        print("  trial %d %s %s: %s: %s" % (t.index, t.kind, mode, t.outcome, t.detail), file=f)
    for c in bad_cases[:50]:
        print("  config %d [%s]: %s: %s\n    %s" % (c.index, ",".join(c.ops), c.outcome, c.detail, c.cmd),
              file=f)
    if a.json:
        trial_failures = [{"index": t.index, "kind": t.kind, "async": t.async_save, "outcome": t.outcome,
                           "detail": t.detail, "ended": t.ended} for t in bad_trials]
        fuzz_failures = [{"index": c.index, "seed": c.seed_name, "mutations": c.ops, "outcome": c.outcome,
                          "detail": c.detail, "command": c.cmd} for c in bad_cases]
        out = {
            "ok": ok,
            "seed": a.seed,
            "elapsed_s": round(elapsed, 1),
            "scratch": scratch if (not ok or a.keep) else None,
            "run": {"steps": a.steps, "save_every": a.save_every, "device_budget": a.device_budget,
                    "reference_losses": [float(x) for x in refs[False].losses]},
            "trials": {"total": len(trials), "by_kind": by_kind, "stale_swap_files_reclaimed": reclaimed,
                       "left_tmp_dirs": tmp_before, "left_swap_files": swap_before,
                       "failures": trial_failures},
            "fuzz": {"total": len(cases),
                     "outcomes": {o: count(cases, lambda c: c.outcome == o) for o in FUZZ_OUTCOMES},
                     "by_mutation": {op: {o: count(cs, lambda c: c.outcome == o) for o in FUZZ_OUTCOMES}
                                     for op, cs in by_op.items()},
                     "failures": fuzz_failures},
            "ulimit_v": {"total": len(limited),
                         "outcomes": {o: count(limited, lambda c: c.outcome == o) for o in FUZZ_OUTCOMES}},
        }
        print(json.dumps(out, indent=1, sort_keys=True))
    return ok


# ---- main ---------------------------------------------------------------------------------------


def print_table(title, header, rows, f):
    widths = [max(len(str(r[c])) for r in [header] + rows) for c in range(len(header))]
    print(title, file=f)
    for r in [header] + rows:
        cells = [str(v).rjust(widths[c]) if c else str(v).ljust(widths[c]) for c, v in enumerate(r)]
        print("  ".join(cells), file=f)


def ended_kind(text):
    """A trial's first run, in one word: how it ended."""
    if "SIGKILL" in text and "killed" in text:
        return "killed"
    if "killed by SIGTERM" in text or "killed by SIGINT" in text or "(pre-handler)" in text:
        return "pre-handler"
    if "rc 143" in text or "rc 130" in text:
        return "stopped"
    if "rc 0" in text:
        return "finished"
    if "rc 1" in text or "rc 2" in text:
        return "refused"
    return "other"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--zoe", default="build/bin/zoe", help="the zoe binary (default build/bin/zoe)")
    ap.add_argument("--kills", type=int, default=40,
                    help="kill trials: kill -9 at random, during a save, three in a row; SIGTERM, SIGINT; "
                    "SIGTERM, SIGINT to one rank of 2 under mpirun (default 40)")
    ap.add_argument("--faults", type=int, default=12,
                    help="fault trials: EFBIG under ulimit -f in a save or in the swap space, ENOSPC on a "
                    "small tmpfs for the save dir or the NVMe path, swap files truncated while in use "
                    "(default 12)")
    ap.add_argument("--fuzz", type=int, default=2000, help="mutated configs through zoe train (default 2000)")
    ap.add_argument("--seed", type=int, default=1, help="seed of every random choice (default 1)")
    ap.add_argument("--minutes", type=float, default=0, help="keep going (kills, faults and configs in the "
                    "same proportions) until M minutes have passed; the counts are then minimums")
    ap.add_argument("--kinds", default=",".join(KINDS),
                    help="the trial kinds to run, comma-separated (default: all of %s)" % ", ".join(KINDS))
    ap.add_argument("--steps", type=int, default=12, help="steps of the training run (default 12)")
    ap.add_argument("--save-every", type=int, default=2, help="checkpoint interval (default 2)")
    ap.add_argument("--device-budget", default="1MiB", help="the run's device budget (default 1MiB)")
    ap.add_argument("--jobs", type=int, default=max(1, min(2, os.cpu_count() or 1)),
                    help="fuzzed configs run at once (default: min(2, cores))")
    ap.add_argument("--fuzz-timeout", type=float, default=20, help="seconds per fuzzed config (default 20)")
    ap.add_argument("--fuzz-mem", type=int, default=4096,
                    help="address-space limit per fuzzed run in MiB, 0 for none (default 4096: an unbounded "
                    "allocation fails instead of taking the machine)")
    ap.add_argument("--ulimit-runs", type=int, default=12,
                    help="runs of zoe train under a random ulimit -v of 150 MiB .. 2 GiB (default 12)")
    ap.add_argument("--ulimit-timeout", type=float, default=30,
                    help="seconds per run under ulimit -v (default 30)")
    ap.add_argument("--scratch", default=None, help="scratch folder (default $ZOE_SCRATCH or /var/tmp)")
    ap.add_argument("--keep", action="store_true", help="keep the scratch folder even when all passed")
    ap.add_argument("--json", action="store_true", help="print one JSON object on stdout (tables on stderr)")
    ap.add_argument("--verbose", action="store_true", help="one line per trial on stderr")
    a = ap.parse_args()
    if a.kills < 0 or a.faults < 0 or a.fuzz < 0 or a.ulimit_runs < 0 or a.steps < 2 or a.save_every < 1 or a.jobs < 1:
        ap.error("--kills/--faults/--fuzz/--ulimit-runs >= 0, --steps >= 2, --save-every >= 1, --jobs >= 1")
    wanted = [k for k in a.kinds.split(",") if k]
    if not wanted or any(k not in KINDS for k in wanted):
        ap.error("--kinds %s: expected some of %s" % (a.kinds, ",".join(KINDS)))
    kill_pattern = [k for k in KILL_PATTERN if k in wanted]
    fault_pattern = [k for k in FAULT_PATTERN if k in wanted]
    zoe = os.path.abspath(a.zoe)
    if not os.access(zoe, os.X_OK):
        ap.error("--zoe %s is not an executable" % a.zoe)
    base = a.scratch or os.environ.get("ZOE_SCRATCH") or "/var/tmp"
    scratch = tempfile.mkdtemp(prefix="zoe-crashtest-", dir=base)
    t_start = time.monotonic()
    deadline = t_start + a.minutes * 60

    def say(msg):
        print("crashtest: " + msg, file=sys.stderr, flush=True)

    tr = TrainRun(zoe, a.steps, a.save_every, a.seed, a.device_budget)
    say("scratch %s; reference runs (%d steps, a checkpoint every %d, sync and async)" %
        (scratch, a.steps, a.save_every))
    refs = {False: reference_run(tr, scratch, False, 120), True: reference_run(tr, scratch, True, 120)}
    if refs[False].losses != refs[True].losses or refs[False].hashes != refs[True].hashes:
        say("FAILED: the sync and async reference runs differ: %s vs %s" %
            (refs[False].losses, refs[True].losses))
        return 1
    # 2-rank references for the single-rank signal trials (mpirun on this host), when there is one.
    refs2 = None
    if any(k in RANK_KINDS for k in kill_pattern):
        if shutil.which("mpirun"):
            refs2 = {False: reference_run(tr, scratch, False, 120, ranks=2),
                     True: reference_run(tr, scratch, True, 120, ranks=2)}
        else:
            say("mpirun is missing: the single-rank signal trials (%s) are skipped" % ", ".join(RANK_KINDS))
    timeout = max(30.0, 30 * max(r.wall for r in list(refs.values()) + list((refs2 or {}).values())))
    runner = TrialRunner(tr, refs, scratch, timeout, say, refs2)
    tmpfs_ok = Tmpfs.probe(scratch)
    if not tmpfs_ok:
        say("mount -t tmpfs is not permitted here: the ENOSPC trials are skipped")

    seeds_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")
    seeds = []
    for n in sorted(os.listdir(seeds_dir)):
        if n.endswith(".json"):
            with open(os.path.join(seeds_dir, n)) as f:
                seeds.append((n, f.read()))
    mem = a.fuzz_mem << 20
    fuzzer = Fuzzer(zoe, seeds, scratch, a.seed, a.fuzz_timeout, mem)

    limiter = AddressSpaceRuns(zoe, scratch, a.seed, a.ulimit_timeout)
    trials, cases, limited, skipped = [], [], [], {}
    n_kill = n_fault = n_fuzz = 0

    def trial(kind, index):
        t = Trial(index, kind, async_save=bool((index + index // len(KILL_PATTERN)) % 2),
                  rng=random.Random("%d/trial/%d" % (a.seed, index)))
        runner.run(t)
        trials.append(t)
        if a.verbose or t.outcome != IDENTICAL:
            mode = "async" if t.async_save else "sync"
            say("trial %3d %-11s %-5s pids %s: %s -> %s%s" %
                (t.index, t.kind, mode, t.pids, "; ".join(t.ended), t.outcome,
                 (": " + t.detail) if t.detail else ""))

    def fuzz_batch(lo, hi):
        with concurrent.futures.ThreadPoolExecutor(max_workers=a.jobs) as pool:
            for c in pool.map(fuzzer.run_case, range(lo, hi)):
                cases.append(c)
                if c.outcome not in ("ran", "refused"):
                    say("config %5d %s [%s] -> %s: %s" %
                        (c.index, c.seed_name, ",".join(c.ops), c.outcome, c.detail))

    # Rounds: the counts first, then (with --minutes) more of each in the same proportions.
    round_kills, round_faults, round_fuzz = a.kills, a.faults, a.fuzz
    while True:
        for _ in range(round_kills if kill_pattern else 0):
            kind = kill_pattern[n_kill % len(kill_pattern)]
            n_kill += 1
            if kind in RANK_KINDS and refs2 is None:
                skipped[kind] = skipped.get(kind, 0) + 1
                continue
            trial(kind, len(trials))
        for _ in range(round_faults if fault_pattern else 0):
            kind = fault_pattern[n_fault % len(fault_pattern)]
            n_fault += 1
            if kind.startswith("enospc") and not tmpfs_ok:
                skipped[kind] = skipped.get(kind, 0) + 1
                continue
            trial(kind, len(trials))
        say("%d trials done (%.0fs); fuzzing configs %d..%d" %
            (len(trials), time.monotonic() - t_start, n_fuzz, n_fuzz + round_fuzz - 1))
        fuzz_batch(n_fuzz, n_fuzz + round_fuzz)
        if n_fuzz == 0:  # once: output flags at FIFOs, device nodes, a save directory's pointer
            for c in fuzzer.node_cases(os.path.join(scratch, "reference-sync", "ck")):
                cases.append(c)
                if c.outcome != "refused":
                    say("node case %s -> %s: %s" % (c.ops[0], c.outcome, c.detail))
        n_fuzz += round_fuzz
        if time.monotonic() >= deadline:
            break
        # Later rounds: a tenth of each count, so that the time limit is kept within a round.
        round_kills, round_faults, round_fuzz = (max(1 if n else 0, n // 10)
                                                 for n in (a.kills, a.faults, a.fuzz))
    if a.ulimit_runs:
        say("runs under ulimit -v: %d" % a.ulimit_runs)
        with concurrent.futures.ThreadPoolExecutor(max_workers=a.jobs) as pool:
            for c in pool.map(limiter.run_case, range(a.ulimit_runs)):
                limited.append(c)
                if c.outcome not in ("ran", "refused"):
                    say("ulimit run %d [%s] -> %s: %s" % (c.index, c.ops[0], c.outcome, c.detail))
    elapsed = time.monotonic() - t_start

    ok = report(a, trials, cases, limited, skipped, refs, len(seeds), elapsed, scratch)
    if ok and not a.keep:
        shutil.rmtree(scratch, ignore_errors=True)
    else:
        say("scratch kept: %s" % scratch)
    return 0 if ok else 1

if __name__ == "__main__":
    sys.exit(main())
