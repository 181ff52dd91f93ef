"""Cost of `hangwatch.beat()` per call, in the situations a training process meets.

    python3 python/bench/bench_beat.py [--calls N] [--paced N] [--pace-ms MS]

Prints, per scenario, the median and p99 nanoseconds of single calls (each timed with perf_counter_ns, the
timer's own median cost subtracted), the mean of a tight loop, and the median's share of a 100 ms training step.
The "floor" rows send a prebuilt datagram through a plain socket: what the kernel alone costs on this machine.
The agent is played by a separate process that reads the socket as fast as it can (the real agent also reads in
its own process), or by a socket nobody reads, or by a path nobody listens on.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Optional

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

import hangwatch  # noqa: E402
from hangwatch import _client  # noqa: E402

READER = """
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
sys.stdout.write("ready\\n"); sys.stdout.flush()
while True:
    s.recv(70000)
"""

STEP_NS = 100_000_000


def timer_overhead(samples: int = 20_000) -> int:
    clock = time.perf_counter_ns
    ts = []
    for _ in range(samples):
        t0 = clock()
        ts.append(clock() - t0)
    return int(statistics.median(ts))


def time_calls(calls: int, overhead: int, pace_s: float = 0.0) -> list:
    clock = time.perf_counter_ns
    beat = hangwatch.beat
    ts = []
    for i in range(calls):
        t0 = clock()
        beat(i)
        ts.append(max(0, clock() - t0 - overhead))
        if pace_s:
            time.sleep(pace_s)
    return ts


def time_raw_send(path: str, calls: int, overhead: int, pace_s: float = 0.0) -> list:
    """The floor: a prebuilt datagram through a plain non-blocking socket, no hangwatch code at all."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.connect(path)
    sock.setblocking(False)
    send = sock.send
    data = b"hw1 beat 0 1234 5678 5678"
    clock = time.perf_counter_ns
    ts = []
    try:
        for _ in range(calls):
            t0 = clock()
            try:
                send(data)
            except BlockingIOError:
                pass
            ts.append(max(0, clock() - t0 - overhead))
            if pace_s:
                time.sleep(pace_s)
    finally:
        sock.close()
    return ts


def loop_mean(calls: int) -> float:
    beat = hangwatch.beat
    t0 = time.perf_counter_ns()
    for i in range(calls):
        beat(i)
    return (time.perf_counter_ns() - t0) / calls


def report(name: str, ts: list, mean: float = 0.0, since: Optional[dict] = None) -> None:
    """One row; `since`: the stats before the measured calls, so warm-up sends are not counted."""
    ts = sorted(ts)
    median = ts[len(ts) // 2]
    p99 = ts[min(len(ts) - 1, int(len(ts) * 0.99))]
    loop = "%7.0f" % mean if mean else "      -"
    tail = ""
    if since is not None:
        s = hangwatch.stats()
        tail = "   sent %-7d dropped %d" % (s["sent"] - since["sent"], s["dropped"] - since["dropped"])
    print("%-46s %8d %8d %s %12.5f%%%s" % (name, median, p99, loop, 100.0 * median / STEP_NS, tail))


def scenario(env_path: Optional[str], warm: int = 1000) -> dict:
    if env_path is None:
        os.environ.pop(_client.ENV_SOCKET, None)
    else:
        os.environ[_client.ENV_SOCKET] = env_path
    _client._reset()
    for i in range(warm):
        hangwatch.beat(i)
    time.sleep(0.2)
    return hangwatch.stats()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--calls", type=int, default=200_000)
    p.add_argument("--paced", type=int, default=300, help="calls in the paced scenario")
    p.add_argument("--pace-ms", type=float, default=10.0)
    args = p.parse_args()

    overhead = timer_overhead()
    print(
        "python %s, timer overhead %d ns (subtracted), %d calls per scenario"
        % (sys.version.split()[0], overhead, args.calls)
    )
    print("%-46s %8s %8s %7s %13s" % ("scenario (ns per call)", "median", "p99", "loop", "of 100ms step"))

    tmp = tempfile.mkdtemp(prefix="hw-bench-", dir="/tmp")
    path = os.path.join(tmp, "agent.sock")
    reader = subprocess.Popen([sys.executable, "-c", READER, path], stdout=subprocess.PIPE, text=True)
    try:
        reader.stdout.readline()

        since = scenario(None)
        report("no HANGWATCH_SOCKET (disabled)", time_calls(args.calls, overhead), loop_mean(args.calls), since)

        since = scenario(path)
        report("agent reading, tight loop", time_calls(args.calls, overhead), loop_mean(args.calls), since)

        slots = os.path.join(tmp, "beats")
        with open(slots, "wb") as f:
            f.truncate(_client.SLOT_BYTES * 8)
        os.environ[_client.ENV_BEATS] = slots
        since = scenario(path)
        report("shared-memory slot (HANGWATCH_BEATS)", time_calls(args.calls, overhead), loop_mean(args.calls), since)
        since = scenario(path)
        paced = time_calls(args.paced, overhead, args.pace_ms / 1000.0)
        report("shared-memory slot, one beat per %g ms" % args.pace_ms, paced, since=since)
        os.environ.pop(_client.ENV_BEATS, None)

        since = scenario(path)
        paced = time_calls(args.paced, overhead, args.pace_ms / 1000.0)
        report("agent reading, one beat per %g ms" % args.pace_ms, paced, since=since)

        report("floor: raw sock.send, tight loop", time_raw_send(path, args.calls, overhead))
        report(
            "floor: raw sock.send, one per %g ms" % args.pace_ms,
            time_raw_send(path, args.paced, overhead, args.pace_ms / 1000.0),
        )

        since = scenario(path)
        real_send = _client._send
        _client._send = len
        ts = time_calls(args.calls, overhead)
        report("python side only (send replaced by len)", ts, loop_mean(args.calls), since)
        _client._send = real_send
    finally:
        reader.kill()
        reader.wait()
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass

    idle = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    idle.bind(path)
    try:
        since = scenario(path)
        ts = time_calls(args.calls, overhead)
        report("agent bound, not reading (every beat dropped)", ts, loop_mean(args.calls), since)
    finally:
        idle.close()
        os.unlink(path)

    since = scenario(os.path.join(tmp, "nobody.sock"))
    report("path nobody listens on (dropped)", time_calls(args.calls, overhead), loop_mean(args.calls), since)
    # Scenarios may leave beat-slot files behind; the directory is ours alone.
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
