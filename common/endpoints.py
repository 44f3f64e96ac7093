"""ZeroMQ TCP endpoints of a host and port: tcp://HOST:PORT for a host name or an IPv4 address, tcp://[ADDRESS]:PORT
for an IPv6 one, which a ZeroMQ socket only binds or reaches with its IPV6 option on (off by default: with it on, a
name such as localhost may resolve to ::1 first, where an IPv4-only server does not listen)."""

from __future__ import annotations

import ipaddress


def ipv6_literal(host: str) -> str | None:
    """The bare IPv6 address `host` spells (with or without [brackets]), or None for a name or an IPv4 address."""
    try:
        address = ipaddress.ip_address(host.removeprefix("[").removesuffix("]"))
    except ValueError:
        return None
    return str(address) if address.version == 6 else None


def tcp_endpoint(host: str, port: int | str) -> str:
    literal = ipv6_literal(host)
    return f"tcp://[{literal}]:{port}" if literal else f"tcp://{host}:{port}"
