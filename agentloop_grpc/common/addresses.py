"""Addresses as both sides write them (``host:port``, IPv6 hosts in brackets)."""

from __future__ import annotations

import ipaddress
import socket


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


def local_address_towards(address: str) -> str:
    """This machine's address on the route to ``host:port`` (what a peer there reaches it by; 127.0.0.1 for a
    loopback address). No packet is sent: a UDP socket's connect only picks the route."""
    if is_loopback(address):
        return "127.0.0.1"
    host, port = address.rsplit(":", 1)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((host.strip("[]"), int(port)))
        return probe.getsockname()[0]
