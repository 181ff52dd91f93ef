#!/usr/bin/env python3
"""Roll call of N Python ranks: `hangwatch dump` against `py-spy dump --pid P` run on each in turn.

The ranks are tests/python/rank.py processes in a hung job, as at 3 a.m.: rank 0 deadlocked on a lock after two
steps, the other ranks waiting for it in a TCP barrier. Prints wall times and the ratio.

    python3 bench/rollcall_vs_pyspy.py [--ranks 64] [--hangwatch target/release/hangwatch] [--repeat 3]

Needs py-spy (`pip install py-spy`). Run as root (py-spy needs ptrace rights over the ranks).
"""

import argparse
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_ranks(n):
    port = free_port()
    procs = []
    for rank in range(n):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(n),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(subprocess.Popen(
            [sys.executable, os.path.join(ROOT, "tests/python/rank.py"), "--step-time", "0.01",
             "--behaviour", "lock", "--after", "2", "--only-rank", "0"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        if rank == 0:
            time.sleep(0.3)
    time.sleep(2.0)
    return procs


def timed(cmd):
    started = time.perf_counter()
    out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    took = time.perf_counter() - started
    return took, out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=64)
    p.add_argument("--hangwatch", default=os.path.join(ROOT, "target/release/hangwatch"))
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    pyspy = shutil.which("py-spy")
    if not pyspy:
        sys.exit("py-spy is not installed: pip install py-spy")
    procs = start_ranks(args.ranks)
    try:
        pids = [str(pr.pid) for pr in procs]
        hw_times, spy_times = [], []
        for _ in range(args.repeat):
            cmd = [args.hangwatch, "dump", "--json"]
            for pid in pids:
                cmd += ["--pid", pid]
            took, out = timed(cmd)
            if out.returncode != 0:
                sys.exit("hangwatch dump failed: " + out.stderr.decode())
            hw_times.append(took)
            started = time.perf_counter()
            failures = 0
            for pid in pids:
                r = subprocess.run([pyspy, "dump", "--pid", pid], stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
                failures += r.returncode != 0
            spy_times.append(time.perf_counter() - started)
        hw, spy = statistics.median(hw_times), statistics.median(spy_times)
        print(f"ranks: {args.ranks}")
        print(f"hangwatch dump (one roll call, incl. 300 ms sampling window): median {hw:.3f} s  runs {[round(t, 3) for t in hw_times]}")
        print(f"py-spy dump on each in turn:                                  median {spy:.3f} s  runs {[round(t, 3) for t in spy_times]}  failures {failures}")
        print(f"ratio: hangwatch is {spy / hw:.1f}x faster")
    finally:
        for pr in procs:
            pr.send_signal(signal.SIGKILL)
        for pr in procs:
            pr.wait()


if __name__ == "__main__":
    main()
