"""One rank of a job whose rank 0 waits on a socket, for the socket next-hop tests (crates/cli/tests/system_sockets.rs).

Started by `hangwatch run --nproc N` with torchrun's environment (RANK). Every rank prints `step N` three times,
0.1 s apart; then rank 0 does --op and the others wait for it in `barrier` (a sleep loop):

  upload URL     PUT 32 MB (a checkpoint) to URL with no timeout, as http.client and many object-store clients do,
                 every 0.2 s, printing `uploaded N` after each; URL is http://HOST:PORT/PATH or unix:/PATH (HTTP over
                 a Unix socket). When the server stops reading, the PUT blocks in sendto() with its data queued.
  connect ADDR   a blocking connect() to HOST:PORT with no timeout; prints `connecting` first.

Dependency-free. Every rank exits by itself when the process that started it dies.
"""

import argparse
import http.client
import os
import socket
import sys
import time

ORIGINAL_PARENT = os.getppid()


def say(text):
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def exit_if_orphaned():
    if os.getppid() != ORIGINAL_PARENT:
        os._exit(0)


class UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP over a Unix socket (a local store's or a sidecar's), as requests-unixsocket does."""

    def __init__(self, path):
        super().__init__("localhost")
        self.unix_path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self.unix_path)


def connection(url):
    if url.startswith("unix:"):
        return UnixHTTPConnection(url[len("unix:"):]), "/checkpoint"
    rest = url.split("://", 1)[1]
    hostport, _, path = rest.partition("/")
    host, _, port = hostport.rpartition(":")
    return http.client.HTTPConnection(host, int(port)), "/" + path


def upload(url):
    body = b"\0" * (32 << 20)
    n = 0
    while True:
        conn, path = connection(url)
        conn.request("PUT", path, body=body)
        conn.getresponse().read()
        conn.close()
        n += 1
        say(f"uploaded {n}")
        exit_if_orphaned()
        time.sleep(0.2)


def connect(addr):
    host, _, port = addr.rpartition(":")
    say("connecting")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.connect((host, int(port)))
    say("connected")


def barrier():
    while True:
        exit_if_orphaned()
        time.sleep(0.5)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--op", choices=["upload", "connect"], required=True)
    p.add_argument("--target", required=True, help="the URL to upload to, or HOST:PORT to connect to")
    args = p.parse_args()
    rank = int(os.environ.get("RANK", "0"))
    for step in range(1, 4):
        time.sleep(0.1)
        say(f"step {step}")
    if rank == 0:
        if args.op == "upload":
            upload(args.target)
        else:
            connect(args.target)
    barrier()


if __name__ == "__main__":
    main()
