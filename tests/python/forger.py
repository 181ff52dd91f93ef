"""A process outside the job that speaks for its ranks, for hangwatch's heartbeat tests.

    python3 forger.py SOCKET RANK [RANK ...]

Sends well-formed hw1 datagrams (hello, beat with a step number, a phase begin and end) for each RANK to the
heartbeat socket SOCKET every 20 ms, forever, with its own pid and increasing seq numbers, as the Python client
would. Waits for the socket to appear; ignores every send error. hangwatch must not take any of it as the job's
progress.
"""

import itertools
import os
import socket
import sys
import time


def main():
    path, ranks = sys.argv[1], [int(r) for r in sys.argv[2:]]
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.setblocking(False)
    pid = os.getpid()
    seq = itertools.count(1)
    for step in itertools.count():
        for rank in ranks:
            for body in ("hello %d 0.1.0" % rank, "beat %d" % step, "phase begin checkpoint", "phase end checkpoint"):
                kind, rest = body.split(" ", 1)
                msg = "hw1 %s %d %d %d %s" % (kind, rank, pid, next(seq), rest)
                try:
                    sock.sendto(msg.encode(), path)
                except OSError:
                    pass
        time.sleep(0.02)


if __name__ == "__main__":
    main()
