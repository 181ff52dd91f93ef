#!/usr/bin/env python3
"""The node service's own numbers: `hangwatch node` on a node running J job steps of R ranks each. Reports the time
from a step's start to the service watching it, the service's CPU (one core) and peak RSS, and its watchers' (one
`hangwatch run --attach` per step) together.

    python3 bench/node.py [--hangwatch target/release/hangwatch] [--jobs 8] [--ranks 8] [--seconds 30]

Root only (the service is). No Slurm is needed: each step is a stand-in `slurmstepd` (a Python script of that name,
so the kernel calls the process slurmstepd) whose children carry the Slurm variables a real step's tasks carry
(SLURM_JOB_ID, SLURM_STEP_ID, SLURMD_NODENAME, SLURM_PROCID); each rank prints a line and sleeps 50 ms per step.
"""

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TICK = os.sysconf("SC_CLK_TCK")
NODE = "bench-node"

STEPD = """#!{python}
import os, subprocess, sys, time
job, ranks = sys.argv[1], int(sys.argv[2])
rank = "import time\\nstep = 0\\nwhile True:\\n    step += 1\\n    print('step', step, flush=True)\\n    time.sleep(0.05)\\n"
procs = []
for r in range(ranks):
    env = dict(os.environ, SLURM_JOB_ID=job, SLURM_STEP_ID="0", SLURMD_NODENAME="{node}", SLURM_PROCID=str(r),
               SLURM_LOCALID=str(r), SLURM_NTASKS=str(ranks))
    procs.append(subprocess.Popen([sys.executable, "-c", rank], env=env, stdout=subprocess.DEVNULL))
for p in procs:
    p.wait()
"""


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def status_kb(pid, key):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--hangwatch", default=os.path.join(ROOT, "target/release/hangwatch"))
    p.add_argument("--jobs", type=int, default=8)
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--seconds", type=float, default=30)
    args = p.parse_args()
    work = tempfile.mkdtemp(prefix="hw-bench-node-")
    stepd = os.path.join(work, "slurmstepd")
    with open(stepd, "w") as f:
        f.write(STEPD.format(python=sys.executable, node=NODE))
    os.chmod(stepd, 0o755)
    service = subprocess.Popen(
        [args.hangwatch, "--config", "/dev/null", "node", "--node-name", NODE, "--action", "observe",
         "--report-root", work],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env=dict(os.environ, HANGWATCH_STATE_DIR=os.path.join(work, "state")))
    watched = {}
    lines = []

    def read():
        for line in service.stderr:
            lines.append(line)
            m = re.search(r"watching step (\d+)\.0 ", line)
            if m:
                watched[m.group(1)] = time.monotonic()

    threading.Thread(target=read, daemon=True).start()
    steps, started = [], {}
    try:
        time.sleep(2)
        for j in range(args.jobs):
            job = str(9000 + j)
            started[job] = time.monotonic()
            steps.append(subprocess.Popen([stepd, job, str(args.ranks)]))
            time.sleep(0.5)
        deadline = time.monotonic() + 30
        while len(watched) < args.jobs and time.monotonic() < deadline:
            time.sleep(0.1)
        if len(watched) < args.jobs:
            print("".join(lines[-20:]), file=sys.stderr)
            sys.exit(f"only {len(watched)} of {args.jobs} steps watched within 30 s")
        waits = sorted(watched[j] - started[j] for j in watched)
        time.sleep(3)
        watchers = children(service.pid)
        c0 = cpu_seconds(service.pid)
        w0 = sum(cpu_seconds(w) for w in watchers)
        t0 = time.monotonic()
        peak, wpeak = 0, 0
        while time.monotonic() - t0 < args.seconds:
            peak = max(peak, status_kb(service.pid, "VmRSS"))
            wpeak = max(wpeak, sum(status_kb(w, "VmRSS") for w in watchers))
            time.sleep(0.5)
        elapsed = time.monotonic() - t0
        share = (cpu_seconds(service.pid) - c0) / elapsed * 100
        wshare = (sum(cpu_seconds(w) for w in watchers) - w0) / elapsed * 100
        print(f"{args.jobs} steps x {args.ranks} ranks on one node, watched for {elapsed:.0f} s:")
        print(f"  step start -> watched: median {waits[len(waits) // 2]:.2f} s, max {waits[-1]:.2f} s")
        print(f"  service: CPU {share:.2f} % of one core, peak RSS {peak / 1024:.1f} MB")
        print(f"  its {len(watchers)} watchers together: CPU {wshare:.2f} % of one core, "
              f"peak RSS {wpeak / 1024:.1f} MB ({wpeak / 1024 / max(len(watchers), 1):.1f} MB each)")
    finally:
        for s in steps:
            for child in children(s.pid):
                os.kill(child, signal.SIGKILL)
            s.kill()
            s.wait()
        service.send_signal(signal.SIGTERM)
        service.wait(timeout=30)


if __name__ == "__main__":
    main()
