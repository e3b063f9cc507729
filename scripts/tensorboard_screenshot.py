"""Redo the picture in docs/: every rank's curves in TensorBoard, from a real run of the demo's straggler.

    .venv/bin/python scripts/tensorboard_screenshot.py [--out docs/tensorboard-straggler.png] [--devices 3]

1. A real 3-rank DDP fit on CPU (gloo): the demo's straggler scenario (``lightning_ext/demo/straggler.py``: the last
   rank's data loading sleeps 30 ms per batch, per-rank metrics with telemetry at every step) with a
   ``TensorBoardLogger``, run as a subprocess of this script (``fit`` mode, re-launched per rank by Lightning).
2. ``tensorboard --logdir <log_dir>`` on a free loopback port: runs ``.`` (rank 0's stock, synced logging),
   ``rank_0``, ``rank_1``, ``rank_2``.
3. Headless Chromium (Debian: ``apt-get install -y chromium``) opens TensorBoard's scalars dashboard with the tags
   filtered (``telemetry/data_wait_s``, ``telemetry/step_s``), the runs filtered to the ranks' (``rank_``; the
   synced run ``.`` has no telemetry) and no smoothing, and writes
   the screenshot. Chromium gets an empty profile of its own and no network beyond the loopback server.

Needs the project's venv (with the ``test`` extra: ``tensorboard``) and ``chromium`` on PATH. CI does not run it.
"""

import argparse
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TAGS = "telemetry/(data_wait|step)_s"
# TensorBoard's legacy scalars dashboard keeps its state in the URL; it draws without WebGL (headless, no GPU)
RUNS = "rank_"  # the ranks' runs (the synced run, ".", has no telemetry)
VIEW = f"#scalars&tagFilter={urllib.parse.quote(TAGS, safe='')}&regexInput={RUNS}&_smoothingWeight=0"
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
]


def fit(root: str, devices: int) -> None:
    """The demo's straggler scenario with a TensorBoardLogger (every rank runs this; Lightning launches the others)."""
    sys.path.insert(0, str(REPO))
    from lightning_ext.demo.straggler import find_the_straggler

    lines = find_the_straggler(devices, root, tensorboard=True)
    if lines:
        print("\n".join(lines))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _wait_for(url: str, deadline: float) -> None:
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as answer:
                if answer.status == 200:
                    return
        except OSError:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.5)


def screenshot(log_dir: Path, out: Path, work: Path) -> None:
    """Serve ``log_dir`` with TensorBoard and let headless Chromium take the picture; stop both."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("chromium is not on PATH (Debian: apt-get install -y chromium)")
    port = _free_port()
    # the log directory relative to the server's working directory: the page shows it as logs/straggler
    logdir = os.path.relpath(log_dir, work)
    command = [sys.executable, "-m", "tensorboard.main", "--logdir", logdir, "--host", "127.0.0.1", "--port", str(port)]
    with open(work / "tensorboard.log", "w") as sink:
        server = subprocess.Popen(command, stdout=sink, stderr=sink, cwd=work, start_new_session=True)
    try:
        _wait_for(f"http://127.0.0.1:{port}/data/runs", time.monotonic() + 60)
        time.sleep(5)  # TensorBoard's first load of the event files
        profile = work / "chromium-profile"
        profile.mkdir()
        subprocess.run(
            [
                chromium,
                *CHROMIUM_FLAGS,
                f"--user-data-dir={profile}",
                f"--screenshot={out}",
                "--window-size=1040,650",
                "--force-device-scale-factor=1.25",  # larger type and lines: 1300 x 812 pixels
                "--virtual-time-budget=20000",  # the page's own timers (data loading, drawing) run before the shot
                f"http://127.0.0.1:{port}/{VIEW}",
            ],
            check=True,
            timeout=120,
            capture_output=True,
        )
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", nargs="?", default="picture", choices=["picture", "fit"])
    parser.add_argument("root", nargs="?", help="(fit mode) where the run logs")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "tensorboard-straggler.png")
    parser.add_argument("--devices", type=int, default=3)
    args = parser.parse_args()
    if args.mode == "fit":
        fit(args.root, args.devices)
        return
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        root = work / "logs"
        run = [sys.executable, __file__, "fit", str(root), "--devices", str(args.devices)]
        subprocess.run(run, check=True, timeout=600, cwd=REPO)
        screenshot(root / "straggler", args.out.resolve(), work)
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
