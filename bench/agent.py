#!/usr/bin/env python3
"""hangwatch run's own numbers: CPU and memory while watching 8 healthy ranks, detection latency of the incident
(stall to verdict, stall to exit) against the stall threshold, and a rank's print latency while the log file's
filesystem is frozen for 10 s (against the same rank printing into a pipe that `cat` drains).

    python3 bench/agent.py [--hangwatch target/release/hangwatch] [--watch-seconds 30] [--thresholds 4,10]

Root only (the latency part loop-mounts an ext4 and freezes it; it thaws and unmounts on every path out).
"""

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RANK = os.path.join(ROOT, "tests/python/rank.py")
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def rss_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


# A rank that prints `rate` lines a second and sleeps between them: the target is stated for ranks printing 20
# lines/s, and ranks that compute between lines would fill this machine's cores and measure the machine instead.
PRINTER = """
import os, sys, time
rate = float(sys.argv[1])
step, next_at = 0, time.monotonic()
while os.getppid() != 1:
    step += 1
    print(f"rank {os.environ.get('RANK')} step {step} loss {1.0 / step:.6f}", flush=True)
    next_at += 1.0 / rate
    time.sleep(max(0.0, next_at - time.monotonic()))
"""


def watch_overhead(hw, seconds, ranks=8, rate=20):
    report = tempfile.mkdtemp(prefix="hw-bench-")
    proc = subprocess.Popen(
        [hw, "run", "--nproc", str(ranks), "--quiet", "--report-dir", report, "--",
         sys.executable, "-c", PRINTER, str(rate)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # The first seconds prepare a stack reader for each rank (a one-time cost at start, not watching).
        time.sleep(10)
        c0, t0 = cpu_seconds(proc.pid), time.monotonic()
        peak = 0.0
        while time.monotonic() - t0 < seconds:
            peak = max(peak, rss_mb(proc.pid))
            time.sleep(0.5)
        c1, t1 = cpu_seconds(proc.pid), time.monotonic()
        with open(os.path.join(report, "output.log"), "rb") as f:
            lines = sum(1 for _ in f)
    finally:
        proc.send_signal(2)
        proc.wait(timeout=30)
    share = (c1 - c0) / (t1 - t0) * 100
    print(f"watching {ranks} ranks for {t1 - t0:.0f} s (each printing {rate:g} lines/s, {lines} lines logged):")
    print(f"  hangwatch CPU {share:.2f} % of one core, peak RSS {peak:.1f} MB")


def sh(*cmd):
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


@contextlib.contextmanager
def loop_ext4(size_mb):
    """A loop-mounted ext4 in a temp dir; yields (work dir, mount point, freeze(), thaw()); always thaws and
    unmounts."""
    work = tempfile.mkdtemp(prefix="hw-bench-")
    img, mnt = os.path.join(work, "img"), os.path.join(work, "mnt")
    os.mkdir(mnt)
    with open(img, "wb") as f:
        f.truncate(size_mb << 20)
    sh("mkfs.ext4", "-q", "-F", img)
    sh("mount", "-o", "loop", img, mnt)
    state = {"frozen": False}

    def freeze():
        sh("fsfreeze", "-f", mnt)
        state["frozen"] = True

    def thaw():
        if state["frozen"]:
            sh("fsfreeze", "-u", mnt)
            state["frozen"] = False

    try:
        yield work, mnt, freeze, thaw
    finally:
        thaw()
        for _ in range(50):
            if subprocess.run(["umount", mnt], stderr=subprocess.DEVNULL).returncode == 0:
                break
            time.sleep(0.2)


def incident_latency(hw, threshold):
    """`threshold` None: the default settings (no --stall-after, default --grace)."""
    with loop_ext4(64) as (work, mnt, freeze, _thaw):
        report = os.path.join(work, "report")
        flags = [] if threshold is None else ["--stall-after", f"{threshold}s", "--grace", "1s"]
        proc = subprocess.Popen(
            [hw, "run", "--nproc", "4", "--quiet", *flags,
             "--report-dir", report, "--", sys.executable, RANK, "--step-time", "0.1",
             "--log", os.path.join(mnt, "rank0.log"), "--only-rank", "0"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(3)
        freeze()
        froze_at = time.time()
        proc.wait(timeout=(threshold or 60) * 4 + 60)
        exited_at = time.time()
        verdict_at = os.path.getmtime(os.path.join(report, "ranks.json"))
        how = ("the default settings (the fast path, --fs-stall 15s)" if threshold is None
               else f"--stall-after {threshold}s (conclusive evidence acts at the soft tier, {threshold / 2:.1f} s)")
        print(f"incident, {how}: verdict {verdict_at - froze_at:.2f} s after the freeze, "
              f"exit {proc.returncode} {exited_at - froze_at:.2f} s after it")


def frozen_log_latency(hw, lines=100_000, rate=6000):
    flood = os.path.join(ROOT, "tests/python/flood.py")
    with loop_ext4(128) as (work, mnt, freeze, thaw):
        stats = os.path.join(work, "stats.json")
        samples = os.path.join(work, "samples.txt")
        proc = subprocess.Popen(
            [hw, "run", "--quiet", "--stall-after", "5m", "--log-file", os.path.join(mnt, "job.log"),
             "--report-dir", os.path.join(work, "report"), "--", sys.executable, flood, str(lines), str(rate), stats,
             samples],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(2)
        froze_at = time.time()
        freeze()
        time.sleep(10)
        thawed_at = time.time()
        thaw()
        proc.wait(timeout=120)
        with open(stats) as f:
            got = f.read()
        phases = {"before the freeze": [], "frozen": [], "after the thaw": []}
        with open(samples) as f:
            for line in f:
                wall, ns = line.split()
                wall = float(wall)
                phase = "before the freeze" if wall < froze_at else "frozen" if wall < thawed_at else "after the thaw"
                phases[phase].append(int(ns))
        with open(os.path.join(mnt, "job.log"), "rb") as f:
            logged = sum(1 for _ in f)
        base = os.path.join(work, "base.json")
        subprocess.run(f"{sys.executable} {flood} {lines} {rate} {base} | cat > /dev/null", shell=True, check=True)
        with open(base) as f:
            baseline = f.read()
    print(f"{lines} lines at {rate}/s, log filesystem frozen 10 s: rank print+flush {got}; {logged} lines in the log")
    for phase, got_ns in phases.items():
        got_ns.sort()
        if got_ns:
            p99 = got_ns[min(len(got_ns) - 1, int(len(got_ns) * 0.99))] / 1000
            print(f"  {phase}: {len(got_ns)} lines, p99 {p99:.1f} us")
    print(f"  baseline, the same rank printing into a pipe drained by cat: {baseline}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hangwatch", default=os.path.join(ROOT, "target/release/hangwatch"))
    p.add_argument("--watch-seconds", type=float, default=30)
    p.add_argument("--thresholds", default="4,10")
    args = p.parse_args()
    watch_overhead(args.hangwatch, args.watch_seconds)
    for t in args.thresholds.split(","):
        incident_latency(args.hangwatch, float(t))
    frozen_log_latency(args.hangwatch)


if __name__ == "__main__":
    main()
