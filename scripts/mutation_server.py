"""A warm test runner for scripts/mutation.py: pytest and the tests' libraries imported once, a fork per mutant.

``python scripts/mutation_server.py ADDRESS`` listens on the Unix socket ADDRESS; each request is pytest's arguments,
run by ``pytest.main`` in a forked child (which imports lightning-ext and the tests afresh: the mutant), answered with
its exit code, or 124 when it ran past ``TIMEOUT``. Importing torch, pandas and pytest costs seconds per mutant.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from multiprocessing.connection import Listener

TIMEOUT = 240.0  # seconds for one run of a module's tests: a mutant that loops forever is killed (a kill)
# what every test run imports that no mutant changes (nothing of lightning_ext or tests: the child imports them)
WARM = ("pytest", "hypothesis", "_pytest.doctest", "numpy", "pandas", "torch", "torch.distributed", "xdist")


def _run(arguments: list[str]) -> int:
    pid = os.fork()
    if pid == 0:  # the child: pytest, its output thrown away
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.dup2(null, 2)
        import pytest

        code = 1
        try:
            code = int(pytest.main(arguments))
        finally:
            os._exit(code)
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return 124


def serve(address: str) -> None:
    """Answer each request (pytest's arguments) with the exit code of its run, until a ``None``."""
    for name in WARM:
        __import__(name)
    with Listener(address, family="AF_UNIX") as listener:
        while True:
            with listener.accept() as connection:
                arguments = connection.recv()
                if arguments is None:
                    return
                connection.send(_run(arguments))


if __name__ == "__main__":
    serve(sys.argv[1])
