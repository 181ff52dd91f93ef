#!/usr/bin/env python3
"""A webhook / Alertmanager receiver for hangwatch's alert tests: records every POST as one JSON line.

    alert_receiver.py --port-file F --record R [--cert C --key K] [--fail-first N]

Listens on --host (127.0.0.1; a free port, written to --port-file once listening); with --cert/--key it speaks HTTPS.
Each request is appended to R as {"path", "content_type", "body"} (body parsed as JSON). The first N requests
are answered 503 (to exercise retries); the others 200 on paths ending in /api/v2/alerts (Alertmanager answers
200 with an empty body) and 204 otherwise. Runs until killed.
"""

import argparse
import http.server
import json
import ssl
import threading


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port-file", required=True)
    parser.add_argument("--record", required=True)
    parser.add_argument("--cert")
    parser.add_argument("--key")
    parser.add_argument("--fail-first", type=int, default=0)
    parser.add_argument("--host", default="127.0.0.1", help="the address to listen on")
    args = parser.parse_args()
    lock = threading.Lock()
    seen = {"n": 0}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            length = int(self.headers.get("Content-Length", "0"))
            raw = self.rfile.read(length)
            with lock:
                seen["n"] += 1
                failing = seen["n"] <= args.fail_first
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = raw.decode("utf-8", "replace")
                with open(args.record, "a") as f:
                    f.write(json.dumps({
                        "path": self.path,
                        "content_type": self.headers.get("Content-Type"),
                        "answered": 503 if failing else 200,
                        "body": body,
                    }) + "\n")
            if failing:
                self.send_response(503)
                self.end_headers()
                return
            if self.path.endswith("/api/v2/alerts"):
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()
            else:
                self.send_response(204)
                self.end_headers()

        def log_message(self, *a):
            pass

    server = http.server.ThreadingHTTPServer((args.host, 0), Handler)
    if args.cert:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(args.cert, args.key)
        server.socket = context.wrap_socket(server.socket, server_side=True)
    with open(args.port_file + ".tmp", "w") as f:
        f.write(str(server.server_address[1]))
    import os
    os.rename(args.port_file + ".tmp", args.port_file)
    server.serve_forever()


if __name__ == "__main__":
    main()
