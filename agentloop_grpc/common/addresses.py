"""Addresses as both sides write them (``host:port``, IPv6 hosts in brackets)."""

from __future__ import annotations

import ipaddress


def is_loopback(address: str) -> bool:
    """Whether ``host:port`` names this machine's loopback interface (a host name other than localhost: no, it may
    resolve to any interface)."""
    host = address.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
