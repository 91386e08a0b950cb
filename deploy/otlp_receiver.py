#!/usr/bin/env python3
"""A small OTLP metrics receiver: gRPC (MetricsService/Export) and HTTP/protobuf (POST /v1/metrics).

Every request is decoded with the OpenTelemetry protobuf definitions (PyPI: grpcio,
opentelemetry-proto; `deploy/setup.sh --test` installs them). Each data point can be written as
one JSON line (--dump), and a summary goes to stderr every --every seconds. To see what
stel-ingestd's OTLP sink sends:

    python3 deploy/otlp_receiver.py --grpc 4317 --dump points.jsonl --every 1
    stel-ingestd --demo --otlp-endpoint http://127.0.0.1:4317

stel's tests start it too (stel_testkit::otlp). Once listening it prints one JSON line on
stdout: {"ready": true, "grpc": <port or null>, "http": <port or null>}.

Dump line: {"metric", "kind" (sum|gauge|histogram; a histogram's value is its count), "monotonic", "temporality", "unit", "description",
"attrs": {..}, "start", "time", "value", "resource": {..}, "scope"}.
"""
import argparse
import json
import signal
import ssl
import sys
import threading
import time
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2 as ms
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc as ms_grpc


def any_value(v):
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


class Store:
    """Decodes requests, counts them, dumps points."""

    def __init__(self, dump, reject, partial):
        self.lock = threading.Lock()
        self.out = None
        if dump == "-":
            self.out = sys.stdout
        elif dump:
            self.out = open(dump, "a", encoding="utf-8")
        self.reject = reject
        self.partial = partial
        self.requests = 0
        self.points = 0

    def take(self, req):
        """Returns (points, rejected, message) for one ExportMetricsServiceRequest."""
        lines = []
        n = 0
        for rm in req.resource_metrics:
            res = {kv.key: any_value(kv.value) for kv in rm.resource.attributes}
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    kind = m.WhichOneof("data")
                    if kind not in ("sum", "gauge", "histogram"):
                        continue
                    d = getattr(m, kind)
                    n += len(d.data_points)
                    if self.out is None:
                        continue
                    for p in d.data_points:
                        lines.append(json.dumps({
                            "metric": m.name,
                            "kind": kind,
                            "monotonic": bool(getattr(d, "is_monotonic", False)),
                            "temporality": int(getattr(d, "aggregation_temporality", 0)),
                            "unit": m.unit,
                            "description": m.description,
                            "attrs": {kv.key: any_value(kv.value) for kv in p.attributes},
                            "start": p.start_time_unix_nano,
                            "time": p.time_unix_nano,
                            # A histogram's value is its count.
                            "value": p.count if kind == "histogram" else getattr(p, p.WhichOneof("value")),
                            "resource": res,
                            "scope": sm.scope.name,
                        }))
        rejected = min(self.partial, n)
        with self.lock:
            if self.out is not None and lines:
                self.out.write("\n".join(lines) + "\n")
                self.out.flush()
            self.requests += 1
            self.points += n - rejected
        return n, rejected, ("stel test receiver: partial rejection" if rejected else "")

    def summary(self):
        with self.lock:
            return {"requests": self.requests, "points": self.points}


class Grpc(ms_grpc.MetricsServiceServicer):
    def __init__(self, store):
        self.store = store

    def Export(self, request, context):
        if self.store.reject:
            # Fault injection for tests: a collector refusing every request for good.
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "stel test receiver: --reject")
        _, rejected, msg = self.store.take(request)
        resp = ms.ExportMetricsServiceResponse()
        if rejected:
            resp.partial_success.rejected_data_points = rejected
            resp.partial_success.error_message = msg
        return resp


def http_handler(store):
    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def reply(self, code, body, ctype="application/x-protobuf"):
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.path != "/v1/metrics":
                return self.reply(404, b"not found", "text/plain")
            if self.headers.get("Content-Type") != "application/x-protobuf":
                return self.reply(415, b"want application/x-protobuf", "text/plain")
            if store.reject:
                return self.reply(400, b"stel test receiver: --reject", "text/plain")
            try:
                req = ms.ExportMetricsServiceRequest.FromString(body)
            except Exception as e:  # a malformed request is the sender's bug: say so
                return self.reply(400, f"bad protobuf: {e}".encode(), "text/plain")
            _, rejected, msg = store.take(req)
            resp = ms.ExportMetricsServiceResponse()
            if rejected:
                resp.partial_success.rejected_data_points = rejected
                resp.partial_success.error_message = msg
            self.reply(200, resp.SerializeToString())

    return H


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--grpc", type=int, help="gRPC port (0 = any free port)")
    ap.add_argument("--http", type=int, help="HTTP/protobuf port (0 = any free port)")
    ap.add_argument("--dump", help="append every data point as a JSON line to this file (- = stdout)")
    ap.add_argument("--every", type=float, default=0, help="print a summary to stderr every N seconds")
    ap.add_argument("--tls-cert", help="serve TLS with this PEM certificate (chain)")
    ap.add_argument("--tls-key", help="... and this PEM key")
    ap.add_argument("--reject", action="store_true", help="refuse every request (tests)")
    ap.add_argument("--partial", type=int, default=0, help="reject this many points per request (tests)")
    a = ap.parse_args()
    if a.grpc is None and a.http is None:
        a.grpc = 4317
    store = Store(a.dump, a.reject, a.partial)
    ready = {"ready": True, "grpc": None, "http": None}
    servers = []
    if a.grpc is not None:
        s = grpc.server(
            futures.ThreadPoolExecutor(max_workers=4),
            options=[("grpc.max_receive_message_length", 64 << 20)],
        )
        ms_grpc.add_MetricsServiceServicer_to_server(Grpc(store), s)
        addr = f"{a.host}:{a.grpc}"
        if a.tls_cert:
            with open(a.tls_cert, "rb") as c, open(a.tls_key, "rb") as k:
                creds = grpc.ssl_server_credentials([(k.read(), c.read())])
            ready["grpc"] = s.add_secure_port(addr, creds)
        else:
            ready["grpc"] = s.add_insecure_port(addr)
        if not ready["grpc"]:
            sys.exit(f"otlp_receiver: cannot listen on {addr}")
        s.start()
        servers.append(s.stop)
    if a.http is not None:
        h = ThreadingHTTPServer((a.host, a.http), http_handler(store))
        h.daemon_threads = True
        if a.tls_cert:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(a.tls_cert, a.tls_key)
            h.socket = ctx.wrap_socket(h.socket, server_side=True)
        ready["http"] = h.server_address[1]
        threading.Thread(target=h.serve_forever, daemon=True).start()
        servers.append(lambda _grace: h.shutdown())
    print(json.dumps(ready), flush=True)

    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    while not done.wait(a.every or 3600):
        if a.every:
            print(json.dumps(store.summary()), file=sys.stderr, flush=True)
    for stop in servers:
        stop(0)
    print(json.dumps(store.summary()), file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
