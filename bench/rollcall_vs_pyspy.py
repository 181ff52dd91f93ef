#!/usr/bin/env python3
"""Roll call of N Python ranks: hangwatch's against `py-spy dump --pid P` run on each in turn.

The ranks are tests/python/rank.py processes in a hung job, as at 3 a.m.: run by `hangwatch run --action observe`,
rank 0 deadlocks on a lock after 8 s of steps, the other ranks wait for it in a TCP barrier. Measured on the
same hung ranks: the roll call `run` takes when it sees the stall (its stack readers prepared while the job was
healthy; the time is from run.json in its evidence), `hangwatch dump` started cold from outside, and py-spy dump
on each rank in turn. Prints wall times and the ratios.

    python3 bench/rollcall_vs_pyspy.py [--ranks 64] [--hangwatch target/release/hangwatch] [--repeat 3]

Needs py-spy (`pip install py-spy`). Run as root (py-spy needs ptrace rights over the ranks).
"""

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def timed(cmd):
    started = time.perf_counter()
    out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    took = time.perf_counter() - started
    return took, out


def in_run_rollcalls(hangwatch, ranks, report_dir):
    """Starts `hangwatch run --action observe` over N ranks that deadlock rank 0 after a healthy while, and yields
    (the run's process, the roll-call records of run.json written after the deadlock) as they come."""
    cmd = [hangwatch, "run", "--nproc", str(ranks), "--action", "observe", "--stall-after", "4s",
           "--report-dir", report_dir, "--",
           sys.executable, os.path.join(ROOT, "tests/python/rank.py"), "--step-time", "0.2",
           "--behaviour", "lock", "--after", "40", "--only-rank", "0"]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait_for_deadlock(run, timeout):
    """Reads the run's output until rank 0 says it deadlocks; returns when it did (perf_counter)."""
    deadline = time.monotonic() + timeout
    for line in run.stdout:
        if "[rank 0] deadlocking" in line:
            return time.time()
        if time.monotonic() > deadline:
            break
    sys.exit("rank 0 did not deadlock in time (is the machine loaded?)")


def rollcall_record(report_dir, after):
    """The roll call behind the report directory's latest verdict, when it was written after `after`."""
    path = os.path.join(report_dir, "run.json")
    try:
        if os.stat(path).st_mtime < after:
            return None
        with open(path) as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    return record


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=64)
    p.add_argument("--hangwatch", default=os.path.join(ROOT, "target/release/hangwatch"))
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    pyspy = shutil.which("py-spy")
    if not pyspy:
        sys.exit("py-spy is not installed: pip install py-spy")
    report_dir = tempfile.mkdtemp(prefix="hw-bench-rollcall-")
    run = in_run_rollcalls(args.hangwatch, args.ranks, report_dir)
    # The run's output is drained in the background once the deadlock is seen (a full pipe would stall the job).
    try:
        deadlocked_at = wait_for_deadlock(run, 120)
        threading.Thread(target=lambda: [None for _ in run.stdout], daemon=True).start()
        record, seen = None, []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (record and record.get("rollcall")):
            time.sleep(0.2)
            record = rollcall_record(report_dir, deadlocked_at)
        if not (record and record.get("rollcall")):
            sys.exit("hangwatch run took no roll call after the deadlock")
        seen.append(record["rollcall"])
        pids = [str(p["pid"]) for p in record["pids"] if p.get("rank") is not None]
        hw_times, spy_times = [], []
        failures = 0
        for _ in range(args.repeat):
            cmd = [args.hangwatch, "dump", "--json"]
            for pid in pids:
                cmd += ["--pid", pid]
            took, out = timed(cmd)
            if out.returncode != 0:
                sys.exit("hangwatch dump failed: " + out.stderr.decode())
            hw_times.append(took)
            started = time.perf_counter()
            for pid in pids:
                r = subprocess.run([pyspy, "dump", "--pid", pid], stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
                failures += r.returncode != 0
            spy_times.append(time.perf_counter() - started)
            later = rollcall_record(report_dir, deadlocked_at)
            if later and later.get("rollcall") and later["rollcall"] not in seen:
                seen.append(later["rollcall"])
        in_run = statistics.median(r["took_ms"] for r in seen) / 1000
        window = seen[0]["window_ms"]
        hw, spy = statistics.median(hw_times), statistics.median(spy_times)
        print(f"ranks: {len(pids)}")
        print(f"hangwatch run's roll call (prepared stack readers, {window} ms window): median {in_run:.3f} s  "
              f"runs {[r['took_ms'] / 1000 for r in seen]}")
        print(f"hangwatch dump (cold, a process of its own, 300 ms window):          median {hw:.3f} s  runs {[round(t, 3) for t in hw_times]}")
        print(f"py-spy dump on each in turn:                                         median {spy:.3f} s  runs {[round(t, 3) for t in spy_times]}  failures {failures}")
        print(f"ratio: the roll call in run is {spy / in_run:.1f}x faster than py-spy; hangwatch dump {spy / hw:.1f}x")
    finally:
        run.send_signal(signal.SIGTERM)
        try:
            run.wait(timeout=30)
        except subprocess.TimeoutExpired:
            run.kill()
            run.wait()
        shutil.rmtree(report_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
