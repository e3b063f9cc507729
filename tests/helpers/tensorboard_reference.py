"""TensorBoard's view of a log directory, read without lightning_ext: event files read with TensorBoard's own loader,
and a real ``tensorboard --logdir`` server asked through its HTTP API.

Scalars map onto :mod:`tests.helpers.metrics_reference`'s cells, ``(kind, epoch, batch, column)``, so that the
expected values come from the logging script, not from the code under test.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
from tensorboard.compat.proto.event_pb2 import Event

Scalars = dict[str, list[tuple[int, float]]]  # tag: (step, value) in the order written


def event_files(directory: str | Path) -> list[str]:
    """The event files directly in ``directory`` (not its subdirectories), in TensorBoard's reading order."""
    return sorted(str(path) for path in Path(directory).glob("events.out.tfevents.*"))


def next_second() -> None:
    """Wait until the wall clock's second changes (at most a second).

    An event file's name is ``events.out.tfevents.<second>.<host>.<pid>.<counter>``, the counter the process's count of
    writers, as text; TensorBoard reads a directory's files in name order. A resumed run in a new process starts at a
    later second or under another pid; two runs in one process within one second (a test's rank pool) differ only by
    the counter, and ``...10`` sorts before ``...9``. A test that runs both in one process waits for the next second
    between them, as any real resume would be.
    """
    start = int(time.time())
    while int(time.time()) == start:
        time.sleep(0.01)


def read_scalars(directory: str | Path) -> Scalars:
    """Every scalar of every event file directly in ``directory``, by tag, as written (duplicates kept)."""
    found: Scalars = {}
    for path in event_files(directory):
        for record in RawEventFileLoader(path).Load():
            event = Event.FromString(record)
            for value in event.summary.value:
                found.setdefault(value.tag, []).append((event.step, value.simple_value))
    return found


def wall_times(directory: str | Path) -> list[tuple[int, float]]:
    """The step and wall time of every event with a scalar in the event files directly in ``directory``, in order."""
    found = []
    for path in event_files(directory):
        for record in RawEventFileLoader(path).Load():
            event = Event.FromString(record)
            if event.summary.value:
                found.append((event.step, event.wall_time))
    return found


def cells(scalars: Scalars, batches: int, step_columns: set[str], epoch_columns: set[str]) -> dict[Any, Any]:
    """The scalars as metrics_reference cells; each step's epoch is the ``epoch`` scalar logged at that step."""
    epochs: dict[int, set[float]] = {}
    for step, value in scalars.get("epoch", []):
        epochs.setdefault(step, set()).add(value)
    found: dict[Any, Any] = {}
    for tag, points in scalars.items():
        if tag in ("epoch", "hp_metric"):
            continue
        for step, value in points:
            (epoch_value,) = epochs[step]
            epoch = int(epoch_value)
            if tag in step_columns:
                key: tuple[Any, ...] = ("step", epoch, step - epoch * batches, tag)
            elif tag in epoch_columns:
                key = ("train_epoch", epoch, -1, tag)
            else:
                key = ("val_epoch", epoch, -1, tag)
            assert key not in found, f"{tag} logged twice at step {step}"
            found[key] = float(value)
    return found


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class TensorBoardServer:
    """A running ``tensorboard --logdir`` on a free loopback port (see :func:`tensorboard_server`)."""

    def __init__(self, port: int, output: Path) -> None:
        self.port, self.output = port, output

    def get(self, path: str, **params: str) -> Any:
        """The JSON answer of ``GET path?params``."""
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}{query}", timeout=10) as answer:
            return json.loads(answer.read())

    def scalars(self, run: str) -> Scalars:
        """Every scalar of ``run``, by tag, as the scalars plugin serves it: ``(step, value)`` in step order."""
        tags = self.get("/data/plugin/scalars/tags").get(run, {})
        return {
            tag: [(step, value) for _, step, value in self.get("/data/plugin/scalars/scalars", run=run, tag=tag)]
            for tag in tags
        }

    def wait_for(self, ready: Callable[[], bool], timeout: float = 60.0) -> bool:
        """Poll until ``ready()`` (TensorBoard loads the event files in the background); ``False`` after ``timeout`` s,
        for the caller's assertions to say what is missing."""
        deadline = time.monotonic() + timeout
        while not ready():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.5)
        return True


@contextlib.contextmanager
def tensorboard_server(log_dir: str | Path, scratch: Path, timeout: float = 60.0) -> Iterator[TensorBoardServer]:
    """Start ``tensorboard --logdir log_dir`` (TensorBoard's default loader), wait until it answers, stop it after.

    The server runs in a session of its own, so that its data-server child is stopped with it.
    """
    output = scratch / "tensorboard.log"
    command = [sys.executable, "-m", "tensorboard.main", "--logdir", str(log_dir), "--host", "127.0.0.1"]
    for _ in range(3):  # a port found free can be taken before TensorBoard binds it
        server = TensorBoardServer(_free_port(), output)
        with open(output, "w") as sink:
            process = subprocess.Popen(
                [*command, "--port", str(server.port)], stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
            )
        try:
            if _started(server, process, timeout):
                yield server
                return
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
    raise AssertionError(f"TensorBoard did not start; its output:\n{output.read_text()}")


def _started(server: TensorBoardServer, process: subprocess.Popen[bytes], timeout: float) -> bool:
    """Whether the server answers (``False`` if it exited first, or did not answer in time)."""
    server.wait_for(lambda: process.poll() is not None or _answers(server), timeout)
    return process.poll() is None and _answers(server)


def _answers(server: TensorBoardServer) -> bool:
    try:
        server.get("/data/runs")
    except OSError:
        return False
    return True
