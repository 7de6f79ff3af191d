"""A job's stored audio as an HTTP answer: streamed from the store a piece at a time, whole or the one
byte range asked for (``Range``, 206; 416 for a range past its end), with an entity tag where the
store keeps one, so a client may resume a download or seek in a player and a cache may revalidate."""

from __future__ import annotations

from datetime import UTC, datetime

from flask import Response, request
from werkzeug.http import is_resource_modified

from chattts_farm.audio_store import StoredAudio
from web.errors import ApiError


def send(stored: StoredAudio, mimetype: str, download_name: str) -> Response:
    """The answer to a GET (or HEAD) of ``stored``; the answer closes it once sent."""
    modified = None if stored.modified is None else datetime.fromtimestamp(stored.modified, UTC)
    if not is_resource_modified(request.environ, etag=stored.etag, last_modified=modified):
        stored.close()
        response = Response(status=304)
    else:
        start, stop = _asked_range(stored, modified)
        response = Response(stored.chunks(start, stop), mimetype=mimetype, direct_passthrough=True)
        response.content_length = stop - start
        if (start, stop) != (0, stored.size):
            response.status_code = 206
            response.content_range = f"bytes {start}-{stop - 1}/{stored.size}"
        response.call_on_close(stored.close)
    response.accept_ranges = "bytes"
    response.headers["Content-Disposition"] = f'attachment; filename="{download_name}"'
    if stored.etag is not None:
        response.set_etag(stored.etag)
    response.last_modified = modified
    return response


def _asked_range(stored: StoredAudio, modified: datetime | None) -> tuple[int, int]:
    """The bytes to send: the one range asked for, else all of them. Several ranges in one request,
    and a range on an ``If-Range`` that no longer holds, get the whole audio, as HTTP allows."""
    asked = request.range
    if asked is None or asked.units != "bytes" or len(asked.ranges) != 1 or not _if_range_holds(stored, modified):
        return 0, stored.size
    satisfiable = asked.range_for_length(stored.size)
    if satisfiable is None:
        stored.close()
        error = ApiError(416, f"the audio has {stored.size} bytes: the range {asked} is past its end", "Range")
        error.headers = {"Content-Range": f"bytes */{stored.size}", "Accept-Ranges": "bytes"}
        raise error
    return satisfiable


def _if_range_holds(stored: StoredAudio, modified: datetime | None) -> bool:
    condition = request.if_range
    if condition.etag is not None:
        return stored.etag is not None and condition.etag == stored.etag
    if condition.date is not None:
        return modified is not None and condition.date == modified.replace(microsecond=0)
    return True
