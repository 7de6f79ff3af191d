"""Reading a JSON request body: the one place a body is parsed, so every endpoint refuses the same bad
bodies the same way (a 400 naming ``body``, or the field at fault)."""

from __future__ import annotations

import sys
from typing import Any

from flask import request

from chattts_farm.contract import check_unicode
from web.errors import ApiError


def json_body() -> Any:
    """The body's JSON value, or None when the body is not JSON; a lone surrogate anywhere in it is a
    400 naming ``body`` (a value of any shape has no fields to name)."""
    body = _parsed()
    _check_value(body, "body")
    return body


def json_object() -> dict:
    """The body's JSON object; a lone surrogate in it is a 400 naming the top-level field that holds it."""
    body = _parsed()
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object", "body")
    for name, value in body.items():
        check_unicode(name, "body")  # a broken key cannot name itself
        _check_value(value, name or "body")  # nor can an empty one
    return body


def json_value(text: str | bytes, field: str) -> Any:
    """One JSON value read as a body is (a line of an upload, say), or a 400 naming ``field`` when it is
    no JSON, or holds a lone surrogate."""
    try:
        value = _loads(text, field)
    except ValueError:
        raise ApiError(400, f"{field} is not JSON", field) from None
    _check_value(value, field)
    return value


def _parsed() -> Any:
    """The body's JSON value; None when it is not JSON (another content type, or no valid JSON)."""
    if not request.is_json:
        return None
    try:
        return _loads(request.get_data(), "body")
    except ValueError:  # not JSON (nor UTF-8)
        return None


def _loads(text: str | bytes, field: str) -> Any:
    try:
        return request.json_module.loads(text, parse_int=lambda digits: _integer(digits, field))
    except RecursionError:
        # Python's JSON parser recurses once per level of nesting: "[[[[..." runs it out of stack.
        raise ApiError(400, f"{'the request body' if field == 'body' else field} is nested too deeply", field) from None


def _integer(digits: str, field: str) -> int:
    """A JSON integer. Python converts at most sys.get_int_max_str_digits() digits (4300 unless set; 0 is
    no limit) and refuses longer ones with a ValueError that would read as "no JSON at all"."""
    limit, length = sys.get_int_max_str_digits(), len(digits.lstrip("-"))
    if limit and length > limit:
        where = "the body" if field == "body" else field
        raise ApiError(400, f"a number in {where} has {length} digits; at most {limit} are read", field)
    return int(digits)


def _check_value(value: Any, field: str) -> None:
    """Refuse lone surrogates anywhere in a value, naming ``field``: the database, the queue and the
    model take only valid Unicode."""
    # A loop, not recursion: the value may nest as deeply as the parser allowed.
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            check_unicode(item, field)
        elif isinstance(item, dict):
            pending.extend(item)
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
