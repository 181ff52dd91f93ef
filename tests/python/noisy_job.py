"""A rank that beats for a while, then hangs while a thread of it floods the heartbeat socket, for hangwatch's
heartbeat tests.

    python3 noisy_job.py STEPS STEP_TIME

Beats STEPS times (every STEP_TIME seconds) through the hangwatch client, then stops making progress: the main
thread sleeps forever while a daemon thread sends, as fast as the socket takes them, datagrams that are no progress
(malformed ones, a beat carrying another rank's number). A flood must never delay hangwatch's verdict.
"""

import os
import socket
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python", "src"))

import hangwatch  # noqa: E402


def flood():
    path = os.environ["HANGWATCH_SOCKET"]
    rank = int(os.environ.get("RANK", "0"))
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.setblocking(False)
    pid = os.getpid()
    other = rank + 1000
    messages = (
        b"not a heartbeat at all",
        b"hw1 dance %d %d 1" % (rank, pid),
        b"hw1 beat %d %d 1 1" % (other, pid),
    )
    while True:
        for m in messages:
            try:
                sock.sendto(m, path)
            except BlockingIOError:
                pass
            except OSError:
                time.sleep(0.001)


def main():
    steps, step_time = int(sys.argv[1]), float(sys.argv[2])
    for step in range(steps):
        time.sleep(step_time)
        hangwatch.beat(step)
    print("rank %s stops beating and floods" % os.environ.get("RANK"), flush=True)
    import threading

    threading.Thread(target=flood, daemon=True).start()
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
