"""SIG as a service: a store served over HTTP (JSON requests, Arrow IPC tables), and its client.

``SigService(store, sources)`` binds to 127.0.0.1 unless ``host`` says otherwise and serves:

    POST /v1/lookup       {"partition", "nodes"}                 -> {"found": {node: file}}
    POST /v1/fetch        {"partition", "file", "nodes"}         -> Arrow IPC stream (410 if corrupt)
    POST /v1/publish?partition=<key>   Arrow IPC stream          -> the commit record
    POST /v1/discard      {"partition", "file"}                  -> {"discarded": bool}
    POST /v1/materialize  {"source", "graph", "partitions"}      -> reader stats
    GET  /v1/manifest                                            -> [commit records]

Requests name keys (64 hex digits, checked) and configured source names, never paths, so
none reaches outside the store. A fetched file is checked before it is sent: a corrupt one
is discarded and answered with 410, never served; ``discard`` re-checks a file and drops it
only if it is corrupt. ``materialize`` computes a graph's materialized nodes over a range of
a configured source's partitions once (what is there already is skipped). ``HttpClient`` is
the reader's side (``SigReader`` takes it where it takes a ``StoreClient``).
"""

import argparse
import json
import logging
import threading
import urllib.error
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List

import pyarrow as pa

from pipelines.inputs.graph import TransformGraph, partition_key
from pipelines.inputs.raw import raw_log_from_spec
from pipelines.inputs.reader import SigReader, StoreClient
from pipelines.inputs.store import CorruptPart, PartStore, check_key
from pipelines.inputs.wire import WireError, bytes_table, table_bytes

log = logging.getLogger(__name__)
MAX_REQUEST_BYTES = 1 << 30


class _BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _json_request(body: bytes) -> Dict[str, Any]:
    try:
        value = json.loads(body)
    except json.JSONDecodeError as error:
        raise _BadRequest(400, f"body is not JSON ({error})") from error
    if not isinstance(value, dict):
        raise _BadRequest(400, "body is not a JSON object")
    return value


class SigService:
    """The store at ``store`` (a ``PartStore``) over HTTP; ``sources`` maps a name to a raw
    log that ``materialize`` requests may name. ``port`` 0 picks a free one (see ``url``)."""

    def __init__(self, store: PartStore, sources: Dict[str, Any], host: str = "127.0.0.1", port: int = 0) -> None:
        self.store, self.sources = store, dict(sources)
        self._materialize_lock = threading.Lock()  # one computation at a time: a part is computed once
        service = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                log.debug("%s " + format, self.address_string(), *args)

            def _reply(self, status: int, body: bytes, content_type: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _handle(self, method: str) -> None:
                url = urllib.parse.urlsplit(self.path)
                try:
                    length = int(self.headers.get("Content-Length", 0))
                    if length > MAX_REQUEST_BYTES:
                        raise _BadRequest(413, f"request of {length} bytes (at most {MAX_REQUEST_BYTES})")
                    body = self.rfile.read(length) if length else b""
                    status, reply, kind = service.route(method, url.path, urllib.parse.parse_qs(url.query), body)
                except _BadRequest as error:
                    status, reply, kind = error.status, json.dumps({"error": str(error)}).encode(), "application/json"
                except (ValueError, KeyError, TypeError, WireError) as error:
                    status, reply, kind = 400, json.dumps({"error": str(error)}).encode(), "application/json"
                self._reply(status, reply, kind)

            def do_GET(self) -> None:
                self._handle("GET")

            def do_POST(self) -> None:
                self._handle("POST")

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self._thread = threading.Thread(target=self.server.serve_forever, name="sig-service", daemon=True)

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> "SigService":
        self._thread.start()
        return self

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def route(self, method: str, path: str, query: Dict[str, List[str]], body: bytes):
        """(status, body, content type) for one request; raises ``_BadRequest``."""
        as_json = lambda value: (200, json.dumps(value).encode(), "application/json")  # noqa: E731
        if method == "GET" and path == "/v1/manifest":
            return as_json(self.store.manifest())
        if method != "POST":
            raise _BadRequest(404, f"no {method} {path}")
        if path == "/v1/publish":
            partition = check_key((query.get("partition") or [""])[0], "partition")
            return as_json(self.store.write(partition, bytes_table(body)))
        request = _json_request(body)
        if path == "/v1/lookup":
            return as_json({"found": self.store.lookup(request["partition"], request["nodes"])})
        if path == "/v1/fetch":
            try:
                table = self.store.read(request["partition"], request["file"], list(request["nodes"]))
            except CorruptPart as error:
                log.warning("%s; discarding it", error)
                self.store.discard(request["partition"], request["file"])
                raise _BadRequest(410, str(error)) from error
            return 200, table_bytes(table), "application/vnd.apache.arrow.stream"
        if path == "/v1/discard":
            try:
                self.store.read_bytes(request["partition"], request["file"])
                return as_json({"discarded": False})  # it checks out: a client cannot drop good data
            except CorruptPart:
                self.store.discard(request["partition"], request["file"])
                return as_json({"discarded": True})
        if path == "/v1/materialize":
            return as_json(self.materialize(request))
        raise _BadRequest(404, f"no POST {path}")

    def materialize(self, request: Dict[str, Any]) -> Dict[str, Any]:
        source = request["source"]
        if source not in self.sources:
            raise _BadRequest(404, f"source {source!r}: not one of this service's ({', '.join(self.sources)})")
        graph = TransformGraph.from_json(request["graph"])
        first, stop = (int(p) for p in request["partitions"])
        if not 0 <= first < stop or stop - first > 100_000:
            raise _BadRequest(400, f"partitions [{first}, {stop}): need 0 <= first < stop, at most 100000 of them")
        # Only the stored nodes: the outputs themselves are what readers compute from them.
        materialized = [n for n in graph.needed() if graph.by_name[n].materialized]
        reader = SigReader(graph, self.sources[source], StoreClient(self.store), outputs=materialized)
        keys = [graph.key(n) for n in materialized]
        present = 0
        with self._materialize_lock:
            for partition in range(first, stop):
                where = partition_key(self.sources[source].fingerprint(partition))
                if len(self.store.lookup(where, keys)) == len(keys):
                    present += 1  # nothing to compute (a reader would fetch it all)
                else:
                    reader.read(partition)
        return {**reader.stats.to_json(), "partitions_present": present}


class HttpClient:
    """A ``SigReader``'s SIG client over a ``SigService`` at ``url``."""

    def __init__(self, url: str, timeout_s: float = 60.0) -> None:
        self.url, self.timeout_s = url.rstrip("/"), timeout_s

    def _post(self, path: str, body: bytes, content_type: str = "application/json") -> bytes:
        request = urllib.request.Request(self.url + path, data=body, method="POST",
                                         headers={"Content-Type": content_type})  # fmt: skip
        with urllib.request.urlopen(request, timeout=self.timeout_s) as reply:
            return reply.read()

    def _post_json(self, path: str, value: Dict[str, Any]) -> Any:
        return json.loads(self._post(path, json.dumps(value).encode()))

    def lookup(self, partition: str, nodes: List[str]) -> Dict[str, str]:
        found = self._post_json("/v1/lookup", {"partition": partition, "nodes": list(nodes)})["found"]
        return {check_key(n, "node"): check_key(f, "file") for n, f in found.items()}

    def fetch(self, partition: str, file: str, nodes: List[str]) -> pa.Table:
        try:
            body = self._post("/v1/fetch", json.dumps({"partition": partition, "file": file, "nodes": nodes}).encode())
        except urllib.error.HTTPError as error:
            if error.code == 410:
                raise CorruptPart(f"{self.url} {partition[:12]}/{file[:12]}", error.read().decode()) from error
            raise
        try:
            return bytes_table(body)
        except WireError as error:  # cut off on the way
            raise CorruptPart(f"{self.url} {partition[:12]}/{file[:12]}", str(error)) from error

    def publish(self, partition: str, table: pa.Table) -> None:
        self._post(f"/v1/publish?partition={check_key(partition, 'partition')}", table_bytes(table),
                   "application/vnd.apache.arrow.stream")  # fmt: skip

    def discard(self, partition: str, file: str) -> None:
        self._post_json("/v1/discard", {"partition": partition, "file": file})

    def materialize(self, source: str, graph: TransformGraph, first: int, stop: int) -> Dict[str, Any]:
        """Has the service compute ``graph``'s stored nodes over partitions [first, stop) of
        its source ``source``; returns its reader's stats and ``partitions_present``."""
        return self._post_json("/v1/materialize", {"source": source, "graph": graph.to_json(),
                                                   "partitions": [first, stop]})  # fmt: skip

    def manifest(self) -> List[Dict[str, Any]]:
        with urllib.request.urlopen(self.url + "/v1/manifest", timeout=self.timeout_s) as reply:
            return json.loads(reply.read())


def main() -> None:
    parser = argparse.ArgumentParser(description="SIG service: a store of materialized parts over HTTP")
    parser.add_argument("--store", required=True, help="store URL (a local directory, s3://..., gs://...)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: localhost only)")
    parser.add_argument("--port", type=int, default=8470)
    parser.add_argument("--source", action="append", default=[], metavar="NAME=SPEC_JSON",
                        help='a raw log materialize may name, e.g. clicks=\'{"kind": "tsv", "paths": [...]}\'')
    args = parser.parse_args()
    sources = {}
    for item in args.source:
        name, _, spec = item.partition("=")
        sources[name] = raw_log_from_spec(json.loads(spec))
    service = SigService(PartStore(args.store), sources, args.host, args.port)
    print(f"SIG service on {service.url}, store {args.store}", flush=True)
    service.server.serve_forever()


if __name__ == "__main__":
    main()
