"""A job's stored audio as an HTTP answer: streamed from the store a piece at a time, whole or the one
byte range asked for (``Range``, 206; 416 for a range past its end), with an entity tag where the
store keeps one, so a client may resume a download or seek in a player and a cache may revalidate.

The conditions are taken in RFC 9110's order (13.2.2): ``If-Match`` (412 when it fails), then
``If-None-Match`` or else ``If-Modified-Since`` (304), then ``If-Range``. Werkzeug's
``is_resource_modified`` answers a failed ``If-Match`` as not modified (a 304), and its ``Range``
parsing drops the suffix ranges HTTP answers whole (``bytes=-N`` past the length) along with ``bytes=-0``,
which HTTP refuses: both are read here instead."""

from __future__ import annotations

import re
from datetime import UTC, datetime

from flask import Response, request
from werkzeug.http import parse_date, unquote_etag

from chattts_farm.audio_store import StoredAudio
from web.errors import ApiError
from web.waiting import WaitSlot

# One byte range (RFC 9110 14.1.1): ``first-last``, ``first-`` or ``-suffix``. Anything else (several
# ranges, another unit, a malformed one) is no range this server serves: the whole audio goes.
_ONE_BYTE_RANGE = re.compile(r"bytes[ \t]*=[ \t]*(?:(\d+)[ \t]*-[ \t]*(\d*)|-[ \t]*(\d+))[ \t]*", re.IGNORECASE)


def send(stored: StoredAudio, mimetype: str, download_name: str, held_by: WaitSlot | None = None) -> Response:
    """The answer to a GET (or HEAD) of ``stored``; the answer closes it once sent, and gives back the
    wait slot ``held_by`` once its body has gone (or at once, when it has none)."""
    modified = None if stored.modified is None else datetime.fromtimestamp(stored.modified, UTC)
    if not _if_match_holds(stored):
        stored.close()
        raise ApiError(412, "If-Match names no current version of the audio (its ETag)", "If-Match")
    if _not_modified(stored, modified):
        stored.close()
        if held_by is not None:
            held_by.release()
        response = Response(status=304)
    else:
        asked = _asked_range(stored, modified)
        start, stop = asked or (0, stored.size)
        body = stored.chunks(start, stop)
        response = Response(
            body if held_by is None else held_by.held_while(body), mimetype=mimetype, direct_passthrough=True
        )
        response.content_length = stop - start
        if asked is not None:
            response.status_code = 206
            response.content_range = f"bytes {start}-{stop - 1}/{stored.size}"
        response.call_on_close(stored.close)
    response.accept_ranges = "bytes"
    response.headers["Content-Disposition"] = f'attachment; filename="{download_name}"'
    if stored.etag is not None:
        response.set_etag(stored.etag)
    response.last_modified = modified
    return response


def _if_match_holds(stored: StoredAudio) -> bool:
    """``If-Match``, compared strongly (RFC 9110 13.1.1): ``*`` holds for any audio there is."""
    asked = request.if_match
    return not asked or asked.star_tag or (stored.etag is not None and asked.contains(stored.etag))


def _not_modified(stored: StoredAudio, modified: datetime | None) -> bool:
    """``If-None-Match``, compared weakly (RFC 9110 13.1.2); only without it, ``If-Modified-Since``."""
    asked = request.if_none_match
    if asked:
        return asked.star_tag or (stored.etag is not None and asked.contains_weak(stored.etag))
    since = request.if_modified_since
    return since is not None and modified is not None and modified.replace(microsecond=0) <= since


def _asked_range(stored: StoredAudio, modified: datetime | None) -> tuple[int, int] | None:
    """The one byte range asked for, as (start, stop); None for the whole audio: no range, several, an
    invalid one, or one on an ``If-Range`` that does not hold, as HTTP allows."""
    asked = _ONE_BYTE_RANGE.fullmatch(request.headers.get("Range", ""))
    if asked is None or not _if_range_holds(stored, modified):
        return None
    first, last, suffix = asked.groups()
    if suffix is not None:
        # A suffix longer than the audio is all of it (RFC 9110 14.1.2); one of no bytes is none.
        start, stop = max(0, stored.size - int(suffix)), stored.size
        satisfiable = int(suffix) > 0
    else:
        start = int(first)
        if last and int(last) < start:  # invalid (RFC 9110 14.1.1), so not a range to refuse
            return None
        stop = min(int(last) + 1, stored.size) if last else stored.size
        satisfiable = start < stored.size
    if not satisfiable:
        stored.close()
        message = f"the audio has {stored.size} bytes: the range {request.headers['Range']} selects none of them"
        error = ApiError(416, message, "Range")
        error.headers = {"Content-Range": f"bytes */{stored.size}", "Accept-Ranges": "bytes"}
        raise error
    return start, stop


def _if_range_holds(stored: StoredAudio, modified: datetime | None) -> bool:
    """``If-Range``: the audio's date, or its entity tag compared strongly (RFC 9110 13.1.5), so a weak
    tag never holds."""
    condition = request.headers.get("If-Range")
    if not condition:
        return True
    date = parse_date(condition)
    if date is not None:
        return modified is not None and date == modified.replace(microsecond=0)
    etag, weak = unquote_etag(condition)
    return not weak and stored.etag is not None and etag == stored.etag
