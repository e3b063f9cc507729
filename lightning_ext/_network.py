"""Where the hang checks' channel binds: the local address (and interface) that reaches the other hosts.

Pure socket queries: a UDP socket's ``connect`` picks the route and sends nothing (docs/multi-node.md, "The checks'
channel").
"""

import ipaddress
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass

import psutil

__all__ = ["IFNAME_VARIABLE", "Place", "channel_place", "interface_of", "is_loopback", "route_address"]

IFNAME_VARIABLE = "GLOO_SOCKET_IFNAME"  # the interfaces gloo binds when set (a comma-separated list), as for its groups


def route_address(host: str | None) -> str | None:
    """The local address that packets to ``host`` leave from (the route's source), or ``None`` if none is known.

    Example:
        >>> route_address("127.0.0.1")
        '127.0.0.1'

    """
    if not host:
        return None
    try:
        family, kind, protocol, _, address = socket.getaddrinfo(host, 9, proto=socket.IPPROTO_UDP)[0]
        with socket.socket(family, kind, protocol) as probe:
            probe.connect(address)  # UDP: chooses the route, sends nothing
            return str(probe.getsockname()[0])
    except OSError:
        return None


def is_loopback(address: str) -> bool:
    """Whether ``address`` is a loopback address (``127.0.0.0/8``, ``::1``).

    Example:
        >>> is_loopback("127.0.1.1"), is_loopback("10.0.0.7")
        (True, False)

    """
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def interface_of(address: str) -> str | None:
    """The name of this host's network interface that holds ``address`` (``eth0``), for messages."""
    return next((name for name, found in _interfaces().items() if address in found), None)


def _interfaces() -> dict[str, list[str]]:
    """Every network interface's addresses, IPv4 first (empty if they cannot be read: they are for messages only)."""
    try:
        found = psutil.net_if_addrs()
    except (OSError, psutil.Error):
        return {}
    order = {socket.AF_INET: 0, socket.AF_INET6: 1}
    return {
        name: [one.address for one in sorted(entries, key=lambda one: order.get(one.family, 2)) if one.family in order]
        for name, entries in found.items()
    }


@dataclass(frozen=True)
class Place:
    """Where one rank's channel binds: the interfaces that ``GLOO_SOCKET_IFNAME`` names, else one address (``None``
    for both: gloo's default, the address this host's name resolves to)."""

    address: str | None
    interfaces: tuple[str, ...] = ()

    def describe(self) -> str:
        """``address 10.0.0.2 on interface eth0``: the place, for people."""
        if self.interfaces:
            known = _interfaces()
            named = [f"{name} ({known[name][0]})" if known.get(name) else name for name in self.interfaces]
            return f"interface {', '.join(named)} from {IFNAME_VARIABLE}"
        if self.address is None:
            return "the address of this host's name (gloo's default)"
        name = interface_of(self.address)
        return f"address {self.address}" + (f" on interface {name}" if name else "")


def channel_place(rank: int, routes: Sequence[str | None], hosts: Sequence[str]) -> Place:
    """Where ``rank``'s channel binds, from every rank's route to the store's host (``MASTER_ADDR``) and host name.

    ``GLOO_SOCKET_IFNAME``, where set, decides, as it does for gloo's own groups. Otherwise the route's source: the
    interface that reaches ``MASTER_ADDR``, which a job's training group already uses. On ``MASTER_ADDR``'s own host
    that route can be the loopback (its name resolving to ``127.0.1.1``): in a job that spans hosts, such a rank binds
    the address that reaches another host's rank instead, never a loopback address.

    Example:
        >>> channel_place(1, ["127.0.0.1", "127.0.0.1"], ["a", "a"]).address
        '127.0.0.1'

    """
    names = tuple(name for name in os.environ.get(IFNAME_VARIABLE, "").split(",") if name)
    if names:
        return Place(None, names)
    mine = routes[rank]
    if mine is None or not is_loopback(mine):
        return Place(mine)
    remote = [
        route
        for route, host in zip(routes, hosts, strict=True)
        if route is not None and not is_loopback(route) and (host != hosts[rank] or len(set(hosts)) == 1)
    ]
    found = route_address(remote[0]) if remote else None  # the job spans hosts: the interface that reaches them
    return Place(found if found is not None else mine)
