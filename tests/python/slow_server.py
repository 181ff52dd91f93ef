"""An HTTP server that sends one body slowly: a slow mirror or object store, for the tests of what counts as work.

    python3 slow_server.py --bytes 6000000 --rate 32768

Prints `port N` on stdout once it listens on 127.0.0.1, then answers every GET with --bytes bytes at about --rate
bytes per second. The test stops the process (SIGSTOP) to make a server that stops answering mid-download.
"""

import argparse
import http.server
import time


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bytes", type=int, required=True)
    parser.add_argument("--rate", type=int, required=True)
    args = parser.parse_args()

    class Slow(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", str(args.bytes))
            self.end_headers()
            chunk = max(1, args.rate // 10)
            sent = 0
            while sent < args.bytes:
                n = min(chunk, args.bytes - sent)
                self.wfile.write(b"x" * n)
                self.wfile.flush()
                sent += n
                time.sleep(0.1)

        def log_message(self, *_):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Slow)
    print(f"port {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
