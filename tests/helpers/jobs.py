"""Launching real jobs from tests: a clean environment, free ports, timeouts, and every output on failure.

Each job runs in its own session, so a timeout kills it with every process it started (Lightning's popen launcher
starts the other ranks as children of rank 0). A job that hangs is exactly what some tests must show, so
:class:`Job` can also be left running and inspected.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LAUNCH_TIMEOUT = 240.0
_DISTRIBUTED_ENV = (
    *("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT"),
)


def run_benchmark_smoke(module: str, out: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    """``python -m <module> --smoke --out OUT --machine smoke`` from the repository root, as CI runs it; must exit 0."""
    process = subprocess.run(
        [sys.executable, "-m", module, "--smoke", "--out", str(out), "--machine", "smoke"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert process.returncode == 0, process.stdout[-3000:] + process.stderr[-3000:]
    return process


def free_port() -> int:
    """A job's master port: one of :func:`server_ports`, never one the system may hand to an outgoing connection.

    It was the system's pick (a bind to port 0, in the ephemeral range): a connection opened by another test before
    the job's rank 0 bound it took it, and the job ended in ``EADDRINUSE`` (CI, 2026-11-29).
    """
    return server_ports(1)[0]


_HANDED_OUT: set[int] = set()  # every port server_ports gave in this process: never given twice
_HANDING_OUT = threading.Lock()


def server_ports(count: int) -> list[int]:
    """``count`` ports free now, below the range the system hands out to outgoing connections: a job that opens a
    server on each in turn, over minutes, does not find one taken by a connection (as a ``free_port()`` can be).

    Never a port given before in this process: jobs started together (the pitfall matrix's, one per world size) each
    get ports of their own. Two lists drawn from one slice shared ports; a job whose rank 0 then found its port taken
    failed there at once, and its other ranks joined the other job's store and waited 30 minutes (CI's hang).
    """
    with _HANDING_OUT:
        ports = _free_ports(count, _HANDED_OUT)
        _HANDED_OUT.update(ports)
    return ports


def _free_ports(count: int, taken: set[int]) -> list[int]:
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    # under pytest-xdist, each worker draws from a slice of its own: jobs of two workers never pick the same port
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:] or 0)
    workers = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    start = max(1024, low - 10000)
    size = (low - start) // workers
    ports: list[int] = []
    for port in random.sample(range(start + worker * size, start + (worker + 1) * size), size):
        if port in taken:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        ports.append(port)
        if len(ports) == count:
            return ports
    raise RuntimeError(f"fewer than {count} free ports below {low}")


def clean_env(**extra: str) -> dict[str, str]:
    """The test's environment without any launcher's variables, plus ``extra``."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in _DISTRIBUTED_ENV and not key.startswith(("SLURM_", "TORCHELASTIC_"))
    }
    return {**env, "PYTHONPATH": str(REPO), "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1", **extra}


def launch(commands: dict[str, tuple[list[str], dict[str, str]]], cwd: Path, timeout: float = LAUNCH_TIMEOUT) -> None:
    """Start every command at once; all must exit 0 within ``timeout``, or the failure shows every output.

    A command that outlives the deadline gets SIGTERM (torchrun then stops its workers), then SIGKILL.
    """
    processes = {}
    for name, (command, env) in commands.items():
        log = (cwd / f"{name}.log").open("w")
        processes[name] = subprocess.Popen(
            command, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()
    deadline = time.monotonic() + timeout
    timed_out = []
    for name, process in processes.items():
        try:
            process.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out.append(name)
    for name in timed_out:
        _stop(processes[name])
    failed = {name: process.returncode for name, process in processes.items() if process.returncode != 0}
    if failed or timed_out:
        outputs = "\n".join(
            f"--- {name} (exit {processes[name].returncode}) ---\n{(cwd / f'{name}.log').read_text()[-6000:]}"
            for name in processes
        )
        pytest.fail(f"launch failed: exit codes {failed}, timed out {timed_out} after {timeout:.0f}s\n{outputs}")


def _stop(
    process: subprocess.Popen[bytes],
    signals: tuple[tuple[signal.Signals, float], ...] = ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)),
) -> None:
    for sig, grace in signals:
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(grace)
            return
        except subprocess.TimeoutExpired:
            continue


class Job:
    """One launched command, in its own session, with its output in ``log``."""

    def __init__(self, command: list[str], env: dict[str, str], log: Path, cwd: Path = REPO) -> None:
        self.log = log
        with log.open("w") as handle:
            self.process = subprocess.Popen(
                command, cwd=cwd, env=env, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True
            )

    def wait(self, timeout: float) -> int | None:
        """The exit code, or ``None`` if the job is still running after ``timeout`` seconds."""
        try:
            return self.process.wait(max(0.0, timeout))
        except subprocess.TimeoutExpired:
            return None

    def running(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        """Kill the job and everything it started (SIGKILL: a hung Lightning rank ignores SIGTERM)."""
        _stop(self.process, ((signal.SIGKILL, 10.0),))

    def output(self, tail: int = 6000) -> str:
        return self.log.read_text(errors="replace")[-tail:]


def two_node_torchrun(args: list[str], env: dict[str, str], log_dir: Path) -> list[Job]:
    """``args`` under torchrun as 2 nodes x 1 process on loopback: one agent per node, logged to ``node<n>.log``."""
    port = str(free_port())
    return [
        Job(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
             "--node-rank", str(node), "--master-addr", "127.0.0.1", "--master-port", port, *args],
            env,
            log_dir / f"node{node}.log",
        )
        for node in range(2)
    ]  # fmt: skip


class StaggeredJobs:
    """Jobs started one after another by a background thread, each once the one before has written a file matching
    ``mark`` into its log dir (it reached the point it waits at) or ended, or after ``wait`` seconds.

    Stock jobs that hang cost no CPU once they hang, but a dozen Python processes importing torch and Lightning at
    once starve every other job on the machine for minutes.

    Args:
        jobs: ``name: (command, env, log_dir)``; each job logs to ``log_dir / "job.log"``.
        mark: a glob pattern in the log dir.
        wait: seconds to wait for the mark before starting the next job anyway.

    """

    def __init__(self, jobs: dict[str, tuple[list[str], dict[str, str], Path]], mark: str, wait: float = 60.0) -> None:
        self.log_dirs = {name: log_dir for name, (_, _, log_dir) in jobs.items()}
        self.started: dict[str, Job] = {}
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._start_each, args=(jobs, mark, wait), daemon=True)
        self._thread.start()

    def _start_each(self, jobs: dict[str, tuple[list[str], dict[str, str], Path]], mark: str, wait: float) -> None:
        for name, (command, env, log_dir) in jobs.items():
            if self._stopped.is_set():
                return
            job = self.started[name] = Job(command, env, log_dir / "job.log")
            deadline = time.monotonic() + wait
            while job.running() and not list(log_dir.glob(mark)) and time.monotonic() < deadline:
                if self._stopped.wait(0.2):
                    return

    def kill(self) -> None:
        """Start no more; kill those started."""
        self._stopped.set()
        self._thread.join()
        for job in self.started.values():
            job.kill()
