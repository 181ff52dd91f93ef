"""A stand-in object store for the socket next-hop tests: accepts HTTP PUTs and reads their bodies, on 127.0.0.1 at a
free port (`store_server.py tcp`) or on a Unix socket (`store_server.py unix PATH`). Prints `listening ADDRESS` once
ready. The test stops it (SIGSTOP) to make an uploading rank wait in sendto()."""

import http.server
import os
import socketserver
import sys


class Store(http.server.BaseHTTPRequestHandler):
    def do_PUT(self):
        left = int(self.headers.get("Content-Length", 0))
        while left > 0:
            chunk = self.rfile.read(min(left, 1 << 16))
            if not chunk:
                break
            left -= len(chunk)
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
