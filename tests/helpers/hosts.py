"""Two hosts on one machine, for the tests of the hang checks' channel: network namespaces the test creates.

Each host is a namespace of its own (network, host name, mounts: its own ``/etc/hosts``), holding the loopback and one
end of a veth pair whose ends live only in the two namespaces (10.213.0.1 and 10.213.0.2): traffic goes to loopback
addresses or to addresses inside these namespaces, never elsewhere. On each host its own name resolves to
``127.0.1.1``, as on many clusters, and the other's to the other's address. Needs root, ``unshare``, ``nsenter`` and
``ip``; the namespaces end with their holder processes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

ADDRESSES = {"nodea": "10.213.0.1", "nodeb": "10.213.0.2"}
INTERFACE = "xnet0"  # the same name on both hosts, so one GLOO_SOCKET_IFNAME serves both


def skip_unless_possible() -> None:
    """Skip the calling test where namespaces cannot be made here (not root, tools missing)."""
    if os.geteuid() != 0 or not all(shutil.which(tool) for tool in ("unshare", "nsenter", "ip")):
        pytest.skip("network namespaces need root, unshare, nsenter and ip")


@contextmanager
def two_hosts(work: Path) -> Iterator[dict[str, list[str]]]:
    """``{"nodea": prefix, "nodeb": prefix}``: the command prefix that runs a command on each host."""
    holders = {
        name: subprocess.Popen(["unshare", "--net", "--uts", "--mount", "--propagation", "private", "sleep", "600"])
        for name in ADDRESSES
    }
    try:
        for holder in holders.values():
            _wait_until_apart(holder.pid)  # never configure this machine's own namespaces
        prefixes = {name: ["nsenter", "-t", str(holder.pid), "-n", "-u", "-m"] for name, holder in holders.items()}
        pids = [str(holders[name].pid) for name in ADDRESSES]
        _run(["ip", "link", "add", INTERFACE, "netns", pids[0], "type", "veth", "peer", "name", INTERFACE, "netns",
              pids[1]])  # fmt: skip
        for name, address in ADDRESSES.items():
            other = next(other for other in ADDRESSES if other != name)
            hosts = work / f"hosts-{name}"
            hosts.write_text(f"127.0.0.1 localhost\n127.0.1.1 {name}\n{ADDRESSES[other]} {other}\n")
            script = (
                f"hostname {name} && ip link set lo up && ip addr add {address}/24 dev {INTERFACE}"
                f" && ip link set {INTERFACE} up && mount --bind {hosts} /etc/hosts"
            )
            _run([*prefixes[name], "sh", "-c", script])
    except RuntimeError as error:  # this kernel or sandbox cannot make them (no veth, ...): not this test's subject
        for holder in holders.values():
            holder.kill()
        pytest.skip(f"two hosts cannot be made here: {error}")
    try:
        yield prefixes
    finally:
        for holder in holders.values():
            holder.kill()
            holder.wait()


def _wait_until_apart(pid: int) -> None:
    """Wait until ``pid`` lives in network, host-name and mount namespaces of its own (unshare has run)."""
    deadline = time.monotonic() + 10
    kinds = ("net", "uts", "mnt")
    while time.monotonic() < deadline:
        try:
            if all(os.readlink(f"/proc/{pid}/ns/{kind}") != os.readlink(f"/proc/self/ns/{kind}") for kind in kinds):
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"process {pid} did not enter namespaces of its own")


def _run(command: list[str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed: {done.stderr.strip()}")
