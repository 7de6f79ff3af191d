"""One attempt to deliver a signed callback, and its record in Redis: the body of the
``chattts.deliver_callback`` task (worker.tasks), which retries it with backoff.

The URL's host is resolved here and every address it resolves to is checked (chattts_farm.callbacks);
the connection goes to the checked address itself, so a second lookup (DNS rebinding) cannot switch it.
The Host header and, for https, the TLS server name and certificate check are the URL's host's. A
redirect is not followed: any answer but a 2xx is a failed attempt.
"""

from __future__ import annotations

import contextlib
import http.client
import ipaddress
import json
import logging
import socket
import ssl
import threading
import time
from dataclasses import asdict, dataclass
from urllib.parse import urlsplit

import redis

from chattts_farm import redis_keys
from chattts_farm.callbacks import SIGNATURE_HEADER, CallbackPolicy, CallbackRefused, signature
from chattts_farm.settings import Settings

logger = logging.getLogger(__name__)

DELIVERED, RETRYING, FAILED = "delivered", "retrying", "failed"
USER_AGENT = "chattts-farm-callbacks/1"
# A receiver's answer is not used: only its status. Its body is read this far, to end the exchange.
ANSWER_READ_BYTES = 4096


@dataclass(frozen=True)
class Attempt:
    """What one attempt came to, as recorded (see redis_keys.callback_attempts)."""

    attempt: int
    at: float
    status_code: int | None
    error: str | None
    outcome: str  # DELIVERED, RETRYING or FAILED
    retry_in_s: float | None


def attempt_delivery(
    url: str, body: str, record_id: str, *, number: int, settings: Settings, client: redis.Redis
) -> Attempt:
    """Try once to POST ``body`` to ``url``, signed; record and log the attempt. A refused address, a
    worker without the secret, or the last of ``CALLBACK_ATTEMPTS`` failing is FAILED; another failure
    (no answer, a time-out, an answer not 2xx) is RETRYING, with the backoff before the next."""
    started = time.time()
    status_code = error = None
    final = number >= settings.callback_attempts
    try:
        status_code = post_signed(
            url, body.encode(), CallbackPolicy.from_settings(settings), settings.callback_timeout_s
        )
        if not 200 <= status_code < 300:
            error = f"answered {status_code}" + (" (a redirect: not followed)" if 300 <= status_code < 400 else "")
    except CallbackRefused as refusal:
        error, final = f"refused: {refusal}", True
    except (OSError, http.client.HTTPException) as failure:
        error = f"{type(failure).__name__}: {failure}" if str(failure) else type(failure).__name__
    if error is None:
        outcome, retry_in_s = DELIVERED, None
    elif final:
        outcome, retry_in_s = FAILED, None
    else:
        outcome, retry_in_s = RETRYING, settings.callback_backoff_s * 2 ** (number - 1)
    attempt = Attempt(number, round(started, 3), status_code, error, outcome, retry_in_s)
    if outcome == DELIVERED:
        logger.info("callback of %s delivered to %s at attempt %d: answered %d", record_id, url, number, status_code)
    else:
        then = f"again in {retry_in_s:g} s" if outcome == RETRYING else "given up"
        logger.warning("callback of %s to %s, attempt %d failed: %s; %s", record_id, url, number, error, then)
    try:
        key = redis_keys.callback_attempts(record_id)
        client.pipeline().rpush(key, json.dumps(asdict(attempt))).expire(key, settings.result_ttl_s).execute()
    except redis.RedisError as failure:  # the delivery went on; only its record is missing
        logger.warning("callback of %s: attempt %d not recorded: %s", record_id, number, failure)
    return attempt


def post_signed(url: str, body: bytes, policy: CallbackPolicy, timeout_s: float) -> int:
    """POST ``body`` (JSON) to ``url``, signed under the policy's secret, to a checked address of the
    URL's host; the answer's status. The whole exchange is cut off ``timeout_s`` after it connected."""
    policy.check(url)
    parts = urlsplit(url)
    https = parts.scheme.lower() == "https"
    port = parts.port or (443 if https else 80)
    address = _checked_address(parts.hostname, port, policy)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    connection = (
        _PinnedHTTPSConnection(parts.hostname, port, address, timeout_s, ssl.create_default_context())
        if https
        else _PinnedHTTPConnection(parts.hostname, port, address, timeout_s)
    )
    headers = {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        SIGNATURE_HEADER: signature(body, policy.secret),
    }
    with contextlib.closing(connection):
        connection.connect()
        cut = threading.Event()
        cut_off = threading.Timer(timeout_s, _cut, args=(connection, cut))
        cut_off.start()
        failure = None
        try:
            connection.request("POST", target, body=body, headers=headers)
            answer = connection.getresponse()
            answer.read(ANSWER_READ_BYTES)
        except (OSError, http.client.HTTPException) as error:
            # Cut while reading, the socket may also read as reset (the receiver wrote to it after the cut).
            if not cut.is_set():
                raise
            failure = error
        finally:
            cut_off.cancel()
        # A cut connection reads as the answer's end: what came before it is no whole answer.
        if cut.is_set():
            raise TimeoutError(f"no whole answer within {timeout_s:g} s") from failure
        return answer.status


def _checked_address(host: str, port: int, policy: CallbackPolicy) -> str:
    """An address of ``host`` to connect to, every one it resolves to checked: one private address among
    public ones refuses the host (which one a connection would get is not this side's to choose)."""
    resolved = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    addresses = [info[4][0] for info in resolved]
    for address in addresses:
        policy.check_host(host, ipaddress.ip_address(address))
    return addresses[0]


def _cut(connection: http.client.HTTPConnection, cut: threading.Event) -> None:
    """End an exchange past its time: a receiver that trickles its answer does not hold the worker."""
    cut.set()
    if connection.sock is not None:
        with contextlib.suppress(OSError):
            connection.sock.shutdown(socket.SHUT_RDWR)


class _PinnedHTTPConnection(http.client.HTTPConnection):
    """HTTP to one address chosen beforehand; the Host header is still the URL's host."""

    def __init__(self, host: str, port: int, address: str, timeout_s: float):
        super().__init__(host, port, timeout=timeout_s)
        self.address = address

    def connect(self) -> None:
        self.sock = socket.create_connection((self.address, self.port), self.timeout)


class _PinnedHTTPSConnection(http.client.HTTPSConnection):
    """HTTPS to one address chosen beforehand; TLS names and verifies the URL's host."""

    def __init__(self, host: str, port: int, address: str, timeout_s: float, tls: ssl.SSLContext):
        super().__init__(host, port, timeout=timeout_s, context=tls)
        self.address = address
        self.tls = tls

    def connect(self) -> None:
        plain = socket.create_connection((self.address, self.port), self.timeout)
        self.sock = self.tls.wrap_socket(plain, server_hostname=self.host)
