"""A stand-in object store for the socket next-hop tests: accepts HTTP PUTs and reads their bodies at 4 MB/s, on
127.0.0.1 at a free port (`store_server.py tcp`) or on a Unix socket (`store_server.py unix PATH`). Prints
`listening ADDRESS` once ready and `receiving` once a body has started to arrive, so that the test stops it (SIGSTOP)
while an upload is surely in flight: the uploading rank then waits in sendto() with its data queued."""

import http.server
import os
import socketserver
import sys
import time

RATE = 4 << 20
CHUNK = 1 << 16


class Store(http.server.BaseHTTPRequestHandler):
    def do_PUT(self):
        left = int(self.headers.get("Content-Length", 0))
        said = False
        while left > 0:
            chunk = self.rfile.read(min(left, CHUNK))
            if not chunk:
                break
            left -= len(chunk)
            if not said:
                print("receiving", flush=True)
                said = True
            time.sleep(len(chunk) / RATE)
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


class UnixStore(socketserver.UnixStreamServer):
    def get_request(self):
        request, _ = super().get_request()
        return request, ("unix", 0)


def main():
    if sys.argv[1] == "unix":
        path = sys.argv[2]
        if os.path.exists(path):
            os.unlink(path)
        server = UnixStore(path, Store)
        where = f"unix:{path}"
    else:
        server = http.server.HTTPServer(("127.0.0.1", 0), Store)
        where = f"127.0.0.1:{server.server_address[1]}"
    print(f"listening {where}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
