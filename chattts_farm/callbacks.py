"""Signed callbacks: where the farm may POST a finished job's status, and how the body is signed.

Torch-free and Celery-free: the web checks a ``callback_url`` at submit, the contract checks a Celery
caller's, and the workers' delivery task (``worker.callbacks``) checks the address again after DNS and
signs the body, all by these rules.

Only http and https to public addresses: loopback, private, link-local, multicast, reserved and
unspecified addresses (IPv4, IPv6, and IPv4 inside IPv6) are refused unless the URL's host is listed in
``CHATTTS_FARM_CALLBACK_ALLOWED_HOSTS``; so a caller cannot make the farm reach into its own network.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

from chattts_farm.settings import Settings

# deliver_callback(url, body, record_id): POST the JSON text ``body`` to ``url``, signed, retried with
# backoff; each attempt is recorded under ``record_id`` (a job's id) in Redis (chattts_farm.redis_keys).
DELIVERY_TASK_NAME = "chattts.deliver_callback"
# The queue deliveries wait in: every worker takes it besides its jobs' queues.
CALLBACK_QUEUE = "callbacks"
SIGNATURE_HEADER = "X-Chattts-Farm-Signature"
MAX_URL_CHARS = 2000

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class CallbackRefused(ValueError):
    """A callback URL, or the address its host resolves to, is not one the farm may call; says why."""


def signature(body: bytes, secret: str) -> str:
    """The signature header's value: ``sha256=`` and the hex HMAC-SHA256 of the raw body under the secret."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def is_public(address: Address) -> bool:
    """Whether an address is one on the public internet, looking through the IPv4 address an IPv6 one
    carries (IPv4-mapped, 6to4, Teredo): ``::ffff:127.0.0.1`` is loopback."""
    embedded = (
        [address.ipv4_mapped, address.sixtofour, (address.teredo or (None, None))[1]] if address.version == 6 else []
    )
    return all(_is_public_alone(inner) for inner in [address, *[a for a in embedded if a is not None]])


def _is_public_alone(address: Address) -> bool:
    return address.is_global and not (
        address.is_multicast
        or address.is_private
        or address.is_loopback
        or address.is_link_local
        or address.is_reserved
        or address.is_unspecified
    )


def literal_address(host: str) -> Address | None:
    """The address a URL's host names outright, or None for a name. Also the old IPv4 forms that
    resolvers take as addresses (``127.1``, ``2130706433``, ``0x7f.0.0.1``): they name an address too."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        pass
    try:
        return ipaddress.IPv4Address(socket.inet_aton(host))
    except OSError:
        return None


@dataclass(frozen=True)
class CallbackPolicy:
    """Whether this farm sends callbacks (it needs a secret to sign them with), and where to."""

    secret: str
    allowed_hosts: frozenset[str]

    @classmethod
    def from_settings(cls, settings: Settings) -> CallbackPolicy:
        allowed = (host.strip().lower().strip("[]") for host in settings.callback_allowed_hosts.split(","))
        return cls(settings.callback_secret, frozenset(host for host in allowed if host))

    def check(self, url: object) -> str:
        """The URL, when the farm may call it; :class:`CallbackRefused` saying why not. A host name is
        not resolved here (the delivery resolves it, and checks what it resolves to, when it calls)."""
        if not self.secret:
            raise CallbackRefused("this farm sends no callbacks: CHATTTS_FARM_CALLBACK_SECRET is not set")
        if not isinstance(url, str) or not url:
            raise CallbackRefused("must be an http or https URL")
        if len(url) > MAX_URL_CHARS:
            raise CallbackRefused(f"is at most {MAX_URL_CHARS} characters")
        if any(character.isspace() or not character.isprintable() for character in url):
            raise CallbackRefused("holds spaces or control characters")
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError as error:
            raise CallbackRefused(f"is not a URL: {error}") from None
        if parts.scheme.lower() not in ("http", "https"):
            raise CallbackRefused("must be an http or https URL")
        if not parts.hostname:
            raise CallbackRefused("names no host")
        if parts.username is not None or parts.password is not None:
            raise CallbackRefused("must not carry a user name or password (the signature says who calls)")
        if port == 0:
            raise CallbackRefused("names port 0")
        self.check_host(parts.hostname)
        return url

    def check_host(self, host: str, resolved: Address | None = None) -> None:
        """Refuse a host that names (or, once resolved, reaches) no public address, unless it is allowed."""
        if host.lower() in self.allowed_hosts:
            return
        address = resolved or literal_address(host.removesuffix("."))  # 127.0.0.1. is 127.0.0.1
        if address is not None and not is_public(address):
            shown = host if resolved is None else f"{host} (resolved to {address})"
            raise CallbackRefused(
                f"{shown} is not a public address (loopback, private, link-local, multicast, reserved or "
                "unspecified); list the host in CHATTTS_FARM_CALLBACK_ALLOWED_HOSTS to call it anyway"
            )
