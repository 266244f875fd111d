"""The SSRF guard: a callback URL may only lead to public addresses.

:func:`check_callback_url` resolves the URL's host and refuses it when any address it
resolves to is loopback, private, link-local, multicast, reserved or otherwise not
public (private ones pass with ``PONDER_CALLBACK_ALLOW_PRIVATE``), and always when it is
a cloud metadata address. Admission checks a task's ``callback_url`` with it, and the
delivery loop checks again before every attempt (DNS may have changed meanwhile).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from urllib.parse import urlsplit

__all__ = ["check_callback_url"]

_RESOLVE_TIMEOUT_S = 5.0

# Cloud metadata endpoints: refused even when private addresses are allowed.
_METADATA = frozenset(
    ipaddress.ip_address(a)
    for a in ("169.254.169.254", "fd00:ec2::254", "100.100.100.200", "169.254.170.2")
)


def _refusal(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    """Why a callback may not go to ``ip`` (None: a public address)."""
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = ip.ipv4_mapped or ip.sixtofour or (ip.teredo[1] if ip.teredo else None)
        if embedded is not None:
            return _refusal(embedded)
    if ip in _METADATA:
        return "a cloud metadata address"
    checks = (
        ("unspecified", ip.is_unspecified),
        ("loopback", ip.is_loopback),
        ("link-local", ip.is_link_local),
        ("multicast", ip.is_multicast),
        ("reserved", ip.is_reserved),
        ("private", ip.is_private),
        ("not public", not ip.is_global),
    )
    return next((f"a {name} address" for name, hit in checks if hit), None)


async def check_callback_url(url: str, allow_private: bool = False) -> None:
    """Refuse a callback URL that could reach the service's own network (SSRF).

    The host is resolved (in a thread, at most 5 s); every address it resolves to must
    be public, unless ``allow_private`` (then loopback and private addresses pass, but
    cloud metadata addresses never do). Raises ValueError with a message naming
    ``callback_url`` and saying why.
    """
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("callback_url: give an http(s) URL with a host")
    host = parts.hostname
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as e:
        raise ValueError(f"callback_url: {e}") from e
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(_RESOLVE_TIMEOUT_S):
            infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, TimeoutError) as e:
        raise ValueError(f"callback_url: the host {host!r} does not resolve ({e})") from e
    for *_, sockaddr in infos:
        address = str(sockaddr[0]).split("%", 1)[0]  # drop an IPv6 scope id
        ip = ipaddress.ip_address(address)
        reason = _refusal(ip)
        if reason is None or (allow_private and reason != "a cloud metadata address"):
            continue
        hint = "" if reason == "a cloud metadata address" else " (PONDER_CALLBACK_ALLOW_PRIVATE)"
        raise ValueError(
            f"callback_url: {host!r} resolves to {address}, {reason}; callbacks go to "
            f"public addresses only{hint}"
        )
