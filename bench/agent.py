#!/usr/bin/env python3
"""hangwatch run's own numbers: CPU and memory while watching 8 healthy ranks, and detection latency of the
incident (stall to verdict, stall to exit) against the stall threshold.

    python3 bench/agent.py [--hangwatch target/release/hangwatch] [--watch-seconds 30] [--thresholds 4,10]

Root only (the latency part loop-mounts an ext4 and freezes it; it thaws and unmounts on every path out).
"""

import argparse
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


def watch_overhead(hw, seconds):
    report = tempfile.mkdtemp(prefix="hw-bench-")
    proc = subprocess.Popen(
        [hw, "run", "--nproc", "8", "--quiet", "--report-dir", report, "--",
         sys.executable, RANK, "--step-time", "0.05"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(3)
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
    print(f"watching 8 ranks for {t1 - t0:.0f} s (each printing a line per 50 ms step, {lines} lines logged):")
    print(f"  hangwatch CPU {share:.2f} % of one core, peak RSS {peak:.1f} MB")


def sh(*cmd):
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def incident_latency(hw, threshold):
    work = tempfile.mkdtemp(prefix="hw-bench-")
    img, mnt = os.path.join(work, "img"), os.path.join(work, "mnt")
    os.mkdir(mnt)
    with open(img, "wb") as f:
        f.truncate(64 << 20)
    sh("mkfs.ext4", "-q", "-F", img)
    sh("mount", "-o", "loop", img, mnt)
    frozen = False
    try:
        report = os.path.join(work, "report")
        proc = subprocess.Popen(
            [hw, "run", "--nproc", "4", "--quiet", "--stall-after", f"{threshold}s", "--grace", "1s",
             "--report-dir", report, "--", sys.executable, RANK, "--step-time", "0.1",
             "--log", os.path.join(mnt, "rank0.log"), "--only-rank", "0"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(3)
        sh("fsfreeze", "-f", mnt)
        frozen = True
        froze_at = time.time()
        proc.wait(timeout=threshold * 4 + 60)
        exited_at = time.time()
        verdict_at = os.path.getmtime(os.path.join(report, "ranks.json"))
        print(f"incident, --stall-after {threshold}s: verdict {verdict_at - froze_at:.2f} s after the freeze, "
              f"exit {proc.returncode} {exited_at - froze_at:.2f} s after it "
              f"(conclusive evidence acts at the soft tier, {threshold / 2:.1f} s)")
    finally:
        if frozen:
            sh("fsfreeze", "-u", mnt)
        for _ in range(50):
            if subprocess.run(["umount", mnt], stderr=subprocess.DEVNULL).returncode == 0:
                break
            time.sleep(0.2)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hangwatch", default=os.path.join(ROOT, "target/release/hangwatch"))
    p.add_argument("--watch-seconds", type=float, default=30)
    p.add_argument("--thresholds", default="4,10")
    args = p.parse_args()
    watch_overhead(args.hangwatch, args.watch_seconds)
    for t in args.thresholds.split(","):
        incident_latency(args.hangwatch, float(t))


if __name__ == "__main__":
    main()
