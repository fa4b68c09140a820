"""Network addresses: parsing `[tls://]host:port`, loopback, and the plugin allowlist.

The server only connects where the operator allows: a plugin address must match one
pattern of `pluginAllowlist` (default: loopback only) before anything, the plugin token
included, is sent to it.

A plugin on this machine may also be reached over a Unix domain socket,
`unix:/absolute/path`, but only where the operator's allowlist names that socket
(`unix:/run/agentloop/guard.sock`) or its directory (`unix:/run/agentloop/*`, the
sockets directly in it): no host pattern, not even `*:*`, allows a socket.
"""

from __future__ import annotations

import ipaddress
import posixpath
import re
from dataclasses import dataclass

from server.kernel.errors import InvalidArgument

TLS_SCHEME = "tls://"
UNIX_SCHEME = "unix:"
UNIX_PATH_MAX = 107
"""The longest Unix socket path, in bytes (`sun_path` holds 108, the last a NUL)."""
_HOSTNAME = re.compile(r"(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?")

DEFAULT_ALLOWLIST = ("localhost:*", "127.0.0.0/8:*", "[::1]:*")
"""Loopback only: a plugin elsewhere is the operator's explicit choice."""


@dataclass(frozen=True)
class Address:
    """A parsed plugin or listen address."""

    host: str
    """A hostname or an IP address, without brackets."""
    port: int
    """1-65535."""
    tls: bool = False
    """Reached over TLS (`tls://`)."""
    path: str = ""
    """A Unix domain socket's path (`unix:/path`); host and port are then empty."""

    @property
    def ip(self) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
        """The host as an IP address; None for a hostname."""
        try:
            return ipaddress.ip_address(self.host)
        except ValueError:
            return None

    @property
    def loopback(self) -> bool:
        """Reachable only from this machine: a loopback IP, the name `localhost`, a socket."""
        if self.path:
            return True
        ip = self.ip
        return ip.is_loopback if ip is not None else self.host.lower() == "localhost"


def split_host_port(text: str) -> tuple[str, str]:
    """`host:port` or `[v6]:port` into its two parts (brackets removed); ValueError else."""
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise ValueError("must be host:port")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError("an IPv6 host needs brackets: [::1]:port")
    return host, port


def unix_path_problem(path: str) -> str:
    """What is wrong with a Unix socket path (empty: nothing)."""
    if not path.startswith("/"):
        return "must be absolute: unix:/path/to/socket"
    if any(not char.isprintable() or char.isspace() for char in path):
        return "must not hold spaces or control characters"
    if path.startswith("//") or posixpath.normpath(path) != path:
        return "must be normalized (no '.', '..', '//' or trailing '/')"
    if len(path.encode()) > UNIX_PATH_MAX:
        return f"must be at most {UNIX_PATH_MAX} bytes long"
    return ""


def parse_address(
    text: str, field: str = "address", tls_allowed: bool = True, unix_allowed: bool = False
) -> Address:
    """Parse `[tls://]host:port`, or `unix:/path` when `unix_allowed`.

    `InvalidArgument` naming `field` when malformed.
    """
    shown = text if len(text) <= 80 else f"{text[:80]}..."
    if unix_allowed and text.startswith(UNIX_SCHEME):
        path = text[len(UNIX_SCHEME) :]
        problem = unix_path_problem(path)
        if problem:
            raise InvalidArgument(field, f"{shown!r}: a Unix socket path {problem}")
        return Address("", 0, path=path)
    tls = tls_allowed and text.startswith(TLS_SCHEME)
    rest = text[len(TLS_SCHEME) :] if tls else text
    try:
        host, port = split_host_port(rest)
    except ValueError as error:
        raise InvalidArgument(field, f"{shown!r} {error}") from None
    if not (port.isascii() and port.isdigit() and len(port) <= 5 and 1 <= int(port) <= 65535):
        raise InvalidArgument(field, f"{shown!r}: the port must be 1-65535")
    address = Address(host, int(port), tls)
    if address.ip is None and not _HOSTNAME.fullmatch(host):
        raise InvalidArgument(field, f"{shown!r}: {host!r} is not a hostname or IP address")
    return address


def is_loopback(listen: str) -> bool:
    """Whether a `host:port` address is reachable only from this machine."""
    try:
        host, _ = split_host_port(listen)
    except ValueError:
        return False
    return Address(host, 1).loopback


@dataclass(frozen=True)
class Pattern:
    """One allowlist entry: `host:port`; host a name, IP, CIDR block or `*`; port or `*`.

    Or a Unix socket: `unix:/path` (that socket) or `unix:/dir/*` (those directly in `dir`).
    """

    host: str
    port: int | None
    network: ipaddress.IPv4Network | ipaddress.IPv6Network | None
    path: str = ""
    """A `unix:` entry's socket path, or its directory when `directory`."""
    directory: bool = False

    def matches(self, address: Address) -> bool:
        """Whether `address` is allowed by this entry (names are not resolved)."""
        if self.path or address.path:  # a socket only by a `unix:` entry naming it
            if not (self.path and address.path):
                return False
            if self.directory:
                return posixpath.dirname(address.path) == self.path
            return address.path == self.path
        if self.port is not None and self.port != address.port:
            return False
        if self.host == "*":
            return True
        ip = address.ip
        if self.network is not None:
            return ip is not None and ip in self.network
        return self.host.lower() == address.host.lower()


def parse_pattern(text: str) -> Pattern:
    """An allowlist entry; `ValueError` saying what is wrong."""
    if text.startswith(UNIX_SCHEME):
        path = text[len(UNIX_SCHEME) :]
        directory = path.endswith("/*")
        if directory:
            path = path[:-2] or "/"
        problem = unix_path_problem(path)
        if problem:
            raise ValueError(f"{text!r}: a Unix socket path {problem}")
        return Pattern("", None, None, path, directory)
    host, port = split_host_port(text)
    if port != "*" and not (port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
        raise ValueError(f"{text!r}: the port must be 1-65535 or *")
    network = None
    if host != "*":
        try:
            network = ipaddress.ip_network(host, strict=False)
        except ValueError:
            if not _HOSTNAME.fullmatch(host):
                raise ValueError(f"{text!r}: {host!r} is not a host, IP, CIDR block or *") from None
    return Pattern(host, None if port == "*" else int(port), network)


@dataclass(frozen=True)
class Allowlist:
    """The addresses plugins may be reached at."""

    patterns: tuple[Pattern, ...] = tuple(parse_pattern(p) for p in DEFAULT_ALLOWLIST)
    sources: tuple[str, ...] = DEFAULT_ALLOWLIST
    """The entries as written, for messages."""

    @classmethod
    def of(cls, entries: tuple[str, ...]) -> Allowlist:
        """An allowlist of `entries`; `ValueError` for a malformed one."""
        return cls(tuple(parse_pattern(e) for e in entries), entries)

    def check(self, address: Address, text: str) -> None:
        """`InvalidArgument` naming `address` unless an entry allows it."""
        if not any(p.matches(address) for p in self.patterns):
            hint = (
                " (a Unix socket must be named: unix:/path or unix:/dir/*)" if address.path else ""
            )
            raise InvalidArgument(
                "address",
                f"{text!r} is not allowed by pluginAllowlist ({', '.join(self.sources)}){hint}",
            )
