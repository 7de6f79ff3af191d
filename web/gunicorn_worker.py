"""The gunicorn worker `chattts-farm web` runs: gevent's, answering in JSON the requests gunicorn itself
refuses before the app sees them (a request line or a header past gunicorn's limits), as the app answers
every other bad request (:mod:`web.errors`). gunicorn's own answer is an HTML page."""

from __future__ import annotations

import json

from gunicorn import util
from gunicorn.http.errors import LimitRequestHeaders, LimitRequestLine
from gunicorn.workers.ggevent import GeventWorker

# gunicorn's refusal -> status, reason phrase, what the caller sent too much of (the field), what to do.
_REFUSALS = {
    LimitRequestLine: (
        414,
        "URI Too Long",
        "url",
        "the request line (method, path and query) is longer than {line} bytes",
    ),
    LimitRequestHeaders: (
        431,
        "Request Header Fields Too Large",
        "headers",
        "a header is longer than {field} bytes, or there are more than {count} of them",
    ),
}


class JsonErrorsGeventWorker(GeventWorker):
    def handle_error(self, req, client, addr, exc):
        refusal = _REFUSALS.get(type(exc))
        if refusal is None:
            super().handle_error(req, client, addr, exc)
            return
        status, reason, field, message = refusal
        self.log.warning("Invalid request from ip=%s: %s", (addr or ("",))[0], exc)
        limits = {
            "line": self.cfg.limit_request_line,
            "field": self.cfg.limit_request_field_size,
            "count": self.cfg.limit_request_fields,
        }
        body = json.dumps({"error": message.format(**limits), "field": field}).encode()
        head = (
            f"HTTP/1.1 {status} {reason}\r\nConnection: close\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        try:
            util.write_nonblock(client, head.encode("latin-1") + body)
        except OSError:
            self.log.debug("Failed to send error message.")
