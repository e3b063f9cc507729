"""A store whose process has ended, as the watchdogs meet it at the end of a run: torch's own error, handled by name.

The store lives in a process of its own (as rank 0's does), which is then killed: no stand-in for torch's client.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta

import pytest
import torch.distributed as dist

from lightning_ext._collective import STORE_ERRORS
from lightning_ext._watch.watchdog import _forget, ask

SERVER = (
    "import sys, time\n"
    "from torch.distributed import TCPStore\n"
    "store = TCPStore('127.0.0.1', int(sys.argv[1]), is_master=True, wait_for_workers=False)\n"
    "print('ready', flush=True)\n"
    "time.sleep(120)\n"
)


@pytest.fixture
def gone_store() -> Iterator[dist.TCPStore]:
    """A client of a store whose server process has been killed (after a key was set)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(port)], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        client = dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=5))
        client.set("answer/request/0", b"1")
    finally:
        server.kill()
        server.wait(timeout=30)
    yield client


@pytest.mark.timeout(120)
def test_a_gone_store_is_met_by_name_and_another_error_is_not_hidden(gone_store: dist.TCPStore) -> None:
    """What torch raises once the store's process has ended is a ``STORE_ERRORS`` (a ``DistNetworkError``): the
    watchdog's clean-up steps aside. An error of another kind, a defect of ours, comes through (it was swallowed
    while the handler took every ``Exception``)."""
    with pytest.raises(STORE_ERRORS) as raised:
        gone_store.get("answer/request/0")
    assert isinstance(raised.value, dist.DistNetworkError)
    _forget(gone_store, "answer/request/0")  # the store is gone: nothing to forget, no error
    with pytest.raises(STORE_ERRORS):  # asking: the mail cannot be posted, and the asker's caller is told
        ask(gone_store, [1], "stall", timeout=1.0)
    with pytest.raises(TypeError):  # not a key: a defect, not a store that is gone
        _forget(gone_store, None)  # type: ignore[arg-type]
