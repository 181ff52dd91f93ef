"""Prints N numbered lines as a training job's logging would, timing each print, for hangwatch's log tests.

    python3 flood.py N RATE STATS_FILE [SAMPLES_FILE]

Prints `line <i>` for i in 0..N at about RATE lines per second (flushing each, like a logging handler) and writes
the per-line latency percentiles (microseconds) as JSON to STATS_FILE (node-local, not the watched mount). With
SAMPLES_FILE, also every line's (wall-clock start, latency in ns), one per line, so that a benchmark can split them
by what the filesystem was doing.
"""

import json
import sys
import time


def main():
    n, rate, stats_path = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
    out = sys.stdout
    samples_path = sys.argv[4] if len(sys.argv) > 4 else None
    latencies = []
    at = []
    started = time.monotonic()
    for i in range(n):
        wall = time.time()
        t0 = time.perf_counter_ns()
        out.write("line %d\n" % i)
        out.flush()
        latencies.append(time.perf_counter_ns() - t0)
        if samples_path:
            at.append(wall)
        due = started + (i + 1) / rate
        delay = due - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    if samples_path:
        with open(samples_path, "w") as f:
            f.writelines("%.6f %d\n" % pair for pair in zip(at, latencies))
    latencies.sort()

    def pct(p):
        return latencies[min(len(latencies) - 1, int(len(latencies) * p))] / 1000.0

    with open(stats_path, "w") as f:
        json.dump({"lines": n, "p50_us": pct(0.50), "p99_us": pct(0.99), "max_us": latencies[-1] / 1000.0,
                   "seconds": time.monotonic() - started}, f)


if __name__ == "__main__":
    main()
