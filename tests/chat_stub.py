"""A local OpenAI-compatible chat endpoint for tests: answers from a function, records requests."""

import contextlib
import http.server
import json
import threading
from collections.abc import Callable


@contextlib.contextmanager
def serve(answer: Callable[[dict], str | dict]):
    """Serves ``POST .../chat/completions`` on loopback until the block ends.

    Args:
      answer: request body -> the reply's content (str), or the whole response (dict).

    Yields:
      (base URL ending in ``/v1``, the list every request is appended to as
      ``(path, Authorization header, body)``).
    """
    seen: list = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append((self.path, self.headers.get("Authorization"), body))
            reply = answer(body)
            if isinstance(reply, str):
                message = {"role": "assistant", "content": reply}
                reply = {"choices": [{"message": message, "finish_reason": "stop"}]}
            payload = json.dumps(reply)
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload.encode())))
            self.end_headers()
            self.wfile.write(payload.encode())

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/v1", seen
    finally:
        httpd.shutdown()
        httpd.server_close()
