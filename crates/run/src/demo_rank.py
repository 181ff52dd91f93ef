"""One rank of the small training job that `hangwatch demo` runs.

hangwatch starts several copies of this script with torchrun's environment: RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT. Every step, each rank computes for a moment, appends a line to its log (when given one), and then
waits at a barrier until every rank has arrived, as ranks wait for each other in a collective such as all-reduce.
Rank 0 serves the barrier over TCP from a thread.

The demo gives rank 0 a log on a filesystem that it then freezes (`fsfreeze -f`): rank 0's next write() never
returns, and every other rank waits at the barrier for it. That is the hang hangwatch must explain.

Plain Python, no dependencies. A rank ends by itself when the process that started it is gone.
"""

import argparse
import os
import socket
import sys
import threading
import time

PARENT = os.getppid()
POLL_S = 0.5


def exit_if_orphaned():
    """hangwatch started us; if it is gone, nobody will end this job, so it ends itself."""
    if os.getppid() != PARENT:
        os._exit(0)


def serve_barrier(listener, world_size):
    """Rank 0's thread: accepts one connection per rank, then every round reads `arrive` from each and answers
    `go` to all. A rank that never arrives keeps everyone waiting, as in a real collective."""
    ranks = []
    while len(ranks) < world_size:
        conn, _ = listener.accept()
        ranks.append(conn.makefile("rwb", buffering=0))
    while True:
        for rank in ranks:
            if not rank.readline():
                return
        for rank in ranks:
            rank.write(b"go\n")


def connect(addr, port, deadline_s=60):
    """Connects to rank 0's barrier, waiting for it to listen."""
    until = time.monotonic() + deadline_s
    while True:
        try:
            sock = socket.create_connection((addr, port), timeout=5)
            sock.settimeout(POLL_S)
            return sock
        except OSError:
            if time.monotonic() > until:
                raise
            exit_if_orphaned()
            time.sleep(0.05)


def barrier(sock, step):
    """Waits until every rank has arrived at `step`."""
    sock.sendall(b"arrive %d\n" % step)
    answer = b""
    while not answer.endswith(b"\n"):
        try:
            chunk = sock.recv(16)
        except socket.timeout:
            exit_if_orphaned()
            continue
        if not chunk:
            # Rank 0 is gone: wait here, as a rank waits for a peer that will never come.
            while True:
                time.sleep(POLL_S)
                exit_if_orphaned()
        answer += chunk


def compute(seconds):
    """Stands in for the forward and backward pass."""
    until = time.monotonic() + seconds
    x = 0
    while time.monotonic() < until:
        for i in range(1000):
            x += i * i
    return x


def write_log(log, rank, step):
    """Appends one line and flushes it: on a frozen filesystem this write() never returns."""
    log.write("rank %d step %d\n" % (rank, step))
    log.flush()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--step-time", type=float, default=0.2, help="seconds of computation per step")
    parser.add_argument("--log", help="file rank 0 appends a line to every step (kept open)")
    args = parser.parse_args()

    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    addr = os.environ.get("MASTER_ADDR", "127.0.0.1")
    port = int(os.environ["MASTER_PORT"])

    if rank == 0:
        listener = socket.create_server((addr, port), backlog=world_size)
        threading.Thread(target=serve_barrier, args=(listener, world_size), name="barrier-server",
                         daemon=True).start()
    sock = connect(addr, port)
    log = open(args.log, "a") if args.log and rank == 0 else None
    print("rank %d of %d ready (pid %d)" % (rank, world_size, os.getpid()), flush=True)

    step = 0
    while True:
        exit_if_orphaned()
        compute(args.step_time)
        if log:
            write_log(log, rank, step)
        barrier(sock, step)
        print("step %d" % step, flush=True)
        step += 1


if __name__ == "__main__":
    sys.exit(main())
