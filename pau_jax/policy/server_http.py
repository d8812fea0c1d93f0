"""The HTTP side of `PolicyServer`: the listening server and the handler of each connection.

`handler_class` gives the request handler: it checks the API key (401), reads a body with
a `Content-Length` (411) within the size limit (413) and the read timeout (408), hands the
parsed body to the route's function (`server_requests.parse_body`) and sends each answer as
JSON; http.server's own refusals get the same one-line error shape. What each route
answers (batching, the embedder) is `server.py`'s.
"""

import hmac
import http
import http.server
import json
import logging
import re
import sys
from collections.abc import Callable, Mapping

from pau_jax.policy.server_requests import RequestError, error, parse_body

_log = logging.getLogger(__name__)

LISTEN_BACKLOG = 128


class HTTPServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = LISTEN_BACKLOG  # connections waiting to be accepted (listen backlog)

    def handle_error(self, request, client_address):
        del request
        if isinstance(sys.exc_info()[1], OSError):  # the client hung up or stalled mid-reply
            _log.debug("connection from %s ended: %s", client_address, sys.exc_info()[1])
        else:
            _log.exception("request from %s failed", client_address)


def handler_class(
    server,
    *,
    get: Mapping[str, Callable[[], dict]],
    post: Mapping[str, Callable[[dict], tuple[int, dict]]],
) -> type[http.server.BaseHTTPRequestHandler]:
    """The request handler of `server` (a `PolicyServer`: `api_key`, `max_body_bytes`,
    `read_timeout_s`).

    Args:
      server: the server whose limits and key each request is checked against.
      get: path -> the payload a GET of it answers with status 200.
      post: path -> the function of a POST's parsed body giving (status, payload).
    """

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = server.read_timeout_s  # of each read and write on the connection

        def log_message(self, *args):  # Keep the terminal quiet.
            del args

        def _send(self, status: int, payload: dict, *, close: bool = False) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if status == 401:
                self.send_header("WWW-Authenticate", "Bearer")
            if close:  # the request's body, if any, was not read
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            self.wfile.write(data)

        def send_error(self, code, message=None, explain=None):
            # http.server's own refusals (a malformed request line, headers too long).
            del explain
            kind = "server_error" if code >= 500 else "invalid_request_error"
            self._send(code, error(message or http.HTTPStatus(code).phrase, kind), close=True)

        def _authorized(self) -> bool:
            if not server.api_key:
                return True
            given = self.headers.get("Authorization", "").encode()
            if hmac.compare_digest(given, f"Bearer {server.api_key}".encode()):
                return True
            message = "missing or wrong API key: send the header Authorization: Bearer <key>"
            self._send(401, error(message, code="invalid_api_key"), close=True)
            return False

        def _read_body(self) -> bytes | None:
            """The request body; None once a refusal was sent (the connection then closes)."""
            lengths = self.headers.get_all("Content-Length") or []
            if not lengths or "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                message = "a request needs a Content-Length header (no chunked bodies)"
                self._send(411, error(message), close=True)
                return None
            declared = lengths[0].strip()
            if len(lengths) > 1 or not re.fullmatch(r"[0-9]+", declared):
                message = "Content-Length must be one non-negative integer"
                self._send(400, error(message), close=True)
                return None
            if len(declared) > 18 or int(declared) > server.max_body_bytes:
                message = f"request body over the limit of {server.max_body_bytes} bytes"
                self._send(413, error(message), close=True)
                return None
            length = int(declared)
            try:
                raw = self.rfile.read(length)
            except TimeoutError:
                message = f"the body did not arrive within {server.read_timeout_s} s"
                self._send(408, error(message), close=True)
                return None
            if len(raw) < length:
                message = "request body shorter than its Content-Length"
                self._send(400, error(message), close=True)
                return None
            return raw

        def do_GET(self):  # noqa: N802 - name fixed by http.server.
            if not self._authorized():
                return
            route = get.get(self.path.rstrip("/"))
            if route is not None:
                self._send(200, route())
            else:
                self._send(404, error(f"no route {self.path}"))

        def do_POST(self):  # noqa: N802 - name fixed by http.server.
            if not self._authorized():
                return
            route = post.get(self.path.rstrip("/"))
            if route is None:
                self._send(404, error(f"no route {self.path}"), close=True)
                return
            raw = self._read_body()
            if raw is None:
                return
            try:
                status, payload = route(parse_body(raw))
            except RequestError as e:
                status, payload = e.status, e.payload
            except Exception as e:  # noqa: BLE001 - every request gets an answer.
                _log.exception("%s failed", self.path)
                status, payload = 500, error(f"{type(e).__name__}: {e}", "server_error")
            self._send(status, payload)

    return Handler
