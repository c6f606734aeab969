"""The webhook URL policy (SSRF): which URLs and addresses a delivery may reach.

By default only ``https`` URLs whose host resolves to public addresses only.
The check runs at registration and again at every attempt, and the attempt
connects to the very address it checked (``transport.post``), so a DNS answer
changed between the check and the connection (rebinding) cannot reach a
private address. ``VPAY_WEBHOOKS_ALLOW_PRIVATE=1`` (development and tests)
also allows ``http`` and loopback/private addresses; link-local (cloud
metadata), multicast, unspecified and reserved addresses stay refused.
Sources: Standard Webhooks, "Server side request forgery"; the webhooks issue.
"""

from __future__ import annotations

import functools
import ipaddress
import os
import socket
from dataclasses import dataclass, replace
from typing import Callable, Mapping
from urllib.parse import urlsplit

import requests






MAX_URL_LENGTH = 2048
ALLOW_PRIVATE_ENV = "VPAY_WEBHOOKS_ALLOW_PRIVATE"
_TRUE = {"1", "true", "yes", "on"}
_DEV_ALLOWED = {"loopback", "private"}  # what VPAY_WEBHOOKS_ALLOW_PRIVATE=1 lets through
_NAT64 = ipaddress.ip_network("64:ff9b::/96")



def allow_private(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``VPAY_WEBHOOKS_ALLOW_PRIVATE`` is on (``1``, ``true``, ``yes``,
    ``on``). Read at each call, so registration and every delivery attempt
    apply the process's current setting (issue: webhooks, point 1)."""
    env = os.environ if environ is None else environ
    return env.get(ALLOW_PRIVATE_ENV, "").strip().lower() in _TRUE



class UrlRefused(ValueError):
    """A webhook URL or its resolved address is not allowed. ``permanent`` is
    True when no later attempt can succeed (scheme, credentials, a literal
    private IP); False when it depends on DNS (the name resolves to a
    refused address now, or does not resolve)."""

    def __init__(self, message: str, *, permanent: bool):
        super().__init__(message)
        self.permanent = permanent


@dataclass(frozen=True)
class Target:
    """A URL that passed the policy. ``host`` is the URL's host (ASCII, no
    brackets), ``port`` explicit, ``request_path`` the path and query;
    ``addresses`` the checked IPs, in the order to try (empty when
    ``check_url`` ran with ``resolve=False``)."""

    url: str
    scheme: str
    host: str
    port: int
    request_path: str
    addresses: tuple[str, ...]

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return host if self.port == default else f"{host}:{self.port}"


def resolve_host(host: str, port: int) -> list[str]:
    """The IP addresses ``host`` resolves to for a TCP connection, in
    ``getaddrinfo`` order, without duplicates. Raises ``OSError``
    (``socket.gaierror``) when it does not resolve. Tests replace this
    function to simulate a DNS answer that changes."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_ADDRCONFIG)
    seen: list[str] = []
    for _family, _type, _proto, _name, sockaddr in infos:
        ip = str(sockaddr[0]).split("%", 1)[0]
        if ip not in seen:
            seen.append(ip)
    return seen


def address_problem(ip: str, *, allow_private: bool) -> str | None:
    """Why a webhook may not connect to ``ip`` (``"loopback"``, ``"private"``,
    ``"link-local"``, ``"multicast"``, ``"unspecified"``, ``"reserved"``,
    ``"not an IP address"``), or ``None`` when it may. IPv4 addresses
    embedded in IPv6 (mapped, 6to4, NAT64 ``64:ff9b::/96``) are judged as
    the IPv4 address. ``allow_private`` lets loopback and private through,
    never the rest (the development flag must not open cloud metadata at
    169.254.169.254)."""
    try:
        addr = ipaddress.ip_address(ip)
    except ValueError:
        return "not an IP address"
    if addr.version == 6:
        if addr.ipv4_mapped is not None:
            addr = addr.ipv4_mapped
        elif addr.sixtofour is not None:
            addr = addr.sixtofour
        elif addr in _NAT64:
            addr = ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF)
    if addr.is_unspecified:
        problem = "unspecified"
    elif addr.is_multicast:
        problem = "multicast"
    elif addr.is_loopback:
        problem = "loopback"
    elif addr.is_link_local:
        problem = "link-local"
    elif addr.is_reserved:
        problem = "reserved"
    elif addr.is_private or not addr.is_global:
        problem = "private"
    else:
        return None
    if allow_private and problem in _DEV_ALLOWED:
        return None
    return problem


def check_url(url: str, *, allow_private: bool, resolve: bool = True,
              resolver: Callable[[str, int], list[str]] | None = None) -> Target:
    """Apply the webhook URL policy; answer the ``Target`` to connect to.

    Refused (``UrlRefused``, ``permanent=True``): not ``https`` (``http``
    only with ``allow_private``), no host, credentials in the URL, a
    fragment, whitespace, longer than ``MAX_URL_LENGTH``, a literal IP that
    ``address_problem`` refuses. Refused with ``permanent=False``: the host
    does not resolve, or ANY of its addresses is refused (a name answering
    public and private addresses at once is how DNS rebinding starts). With
    ``resolve=False`` only the static rules run. ``resolver`` defaults to
    this module's ``resolve_host`` (looked up at call time).
    Source: the issue (webhooks, point 1); Standard Webhooks, "SSRF".
    """
    if not isinstance(url, str) or not url:
        raise UrlRefused("the URL is empty", permanent=True)
    target = _static_target(url, allow_private)
    if target.addresses or not resolve:
        return target  # a literal address, checked; or only the static rules asked for
    host, port = target.host, target.port
    try:
        addresses = (resolver or resolve_host)(host, port)
    except OSError as exc:
        raise UrlRefused(f"{host} does not resolve: {exc}", permanent=False) from None
    if not addresses:
        raise UrlRefused(f"{host} does not resolve", permanent=False)
    for ip in addresses:
        problem = address_problem(ip, allow_private=allow_private)
        if problem:
            raise UrlRefused(f"{host} resolves to {ip}, a {problem} address", permanent=False)
    return replace(target, addresses=tuple(addresses))


MAX_PARSED_URLS = 1024
"""How many URLs' static checks (``_static_target``) a process keeps: every
delivery attempt checks its URL again, and parsing it was a tenth of an
attempt's CPU (issue 30). The DNS answer and its check are never kept."""


@functools.lru_cache(maxsize=MAX_PARSED_URLS)
def _static_target(url: str, allow_private: bool) -> Target:
    """``check_url``'s rules that depend on the URL text alone (and the
    development flag): the ``Target`` with ``addresses`` empty, or, for a
    literal IP, that one address checked. Raises ``UrlRefused``
    (permanent); refusals are not kept (``lru_cache`` keeps answers only)."""
    if len(url) > MAX_URL_LENGTH:
        raise UrlRefused(f"the URL is longer than {MAX_URL_LENGTH} characters", permanent=True)
    if any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F for c in url):
        raise UrlRefused("the URL contains whitespace or control characters", permanent=True)
    try:
        prepared = requests.models.PreparedRequest()
        prepared.prepare_url(url, None)  # IDNA-encodes the host, normalises the rest
        parts = urlsplit(prepared.url)
        port = parts.port
    except (requests.exceptions.RequestException, ValueError) as exc:
        raise UrlRefused(f"not a valid URL: {exc}", permanent=True) from None
    scheme = parts.scheme.lower()
    if scheme not in ("https", "http"):
        raise UrlRefused(f"the scheme must be https, not {scheme or 'none'}", permanent=True)
    if scheme == "http" and not allow_private:
        raise UrlRefused(f"the scheme must be https (http only with {ALLOW_PRIVATE_ENV}=1)",
                         permanent=True)
    if parts.username is not None or parts.password is not None:
        raise UrlRefused("credentials in the URL are not accepted; receivers verify the "
                         "webhook signature instead", permanent=True)
    if "#" in url:
        raise UrlRefused("the URL must not have a fragment", permanent=True)
    host = (parts.hostname or "").rstrip(".")
    if not host:
        raise UrlRefused("the URL has no host", permanent=True)
    port = port or (443 if scheme == "https" else 80)
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    literal = _literal_ip(host)
    if literal is not None:
        problem = address_problem(literal, allow_private=allow_private)
        if problem:
            raise UrlRefused(f"{host} is a {problem} address", permanent=True)
        return Target(prepared.url, scheme, literal, port, path, (literal,))
    return Target(prepared.url, scheme, host, port, path, ())


def _literal_ip(host: str) -> str | None:
    try:
        return str(ipaddress.ip_address(host.strip("[]")))
    except ValueError:
        return None


