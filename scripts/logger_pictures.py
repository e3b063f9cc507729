"""Redo the MLflow and W&B pictures in docs/: every rank's run in each logger, from a real run of the demo's straggler.

    .venv/bin/python scripts/logger_pictures.py mlflow --mlflow /path/to/venv-with-mlflow/bin/mlflow
    .venv/bin/python scripts/logger_pictures.py wandb

Both start with a real 3-rank DDP fit on CPU (gloo), re-launched per rank by Lightning: the demo's straggler (the last
rank's data loading sleeps 30 ms per batch, telemetry at every step) with ``logger=[CSVLogger, <the logger>]``.

- ``mlflow`` (``docs/mlflow-ranks.png``): an ``MLFlowLogger`` on a local file store (``MLFLOW_ALLOW_FILE_STORE=true``:
  the project's venv has ``mlflow-skinny``, which has no SQL store); ``mlflow server`` from a venv with the full
  ``mlflow`` package (the UI ships there only) on a free loopback port; headless Chromium (Debian: ``apt-get install
  -y chromium``) opens the metric page of ``telemetry/data_wait_s`` for the three child runs (the page a run's metric
  links to) and writes the screenshot, cropped to the page.
- ``wandb`` (``docs/wandb-ranks.png``): a ``WandbLogger`` offline (``WANDB_MODE=offline``; W&B's UI is online only);
  the runs' transaction logs read back with ``tests/helpers/wandb_records.py`` and plotted with matplotlib, one curve
  per rank run of the group, as W&B's grouped line plot draws them.

CI does not run it.
"""

import argparse
import contextlib
import json
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
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DELAY = 0.03  # seconds per batch that the slow rank's loader sleeps, as the demo's
METRIC = "telemetry/data_wait_s"
_PAGE_WIDTH = 1262  # pixels of the 1700-pixel window left of MLflow 3.17's assistant panel
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


def fit(root: str, devices: int, kind: str) -> None:
    """The straggler fit (every rank runs this; Lightning launches the others), with ``kind``'s logger."""
    sys.path.insert(0, str(REPO))
    import lightning as L
    import torch
    from lightning.pytorch.loggers import CSVLogger, MLFlowLogger, WandbLogger
    from torch.utils.data import DataLoader, Dataset

    from lightning_ext import PerRankMetrics, PolicyDDPStrategy

    class Samples(Dataset[Any]):
        def __init__(self, size: int, delay: float) -> None:
            self.size, self.delay = size, delay

        def __len__(self) -> int:
            return self.size

        def __getitem__(self, index: int) -> Any:
            time.sleep(self.delay)
            generator = torch.Generator().manual_seed(index)
            return torch.randn(8, generator=generator), torch.randn(1, generator=generator)

    class Regression(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(8, 1)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            loss = torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1])
            self.log("loss", loss)
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    os.environ.update(MLFLOW_ALLOW_FILE_STORE="true", WANDB_MODE="offline", WANDB_SILENT="true")
    logger = (
        MLFlowLogger(experiment_name="straggler", run_name="demo", tracking_uri=f"file:{root}/mlruns")
        if kind == "mlflow"
        else WandbLogger(project="straggler", name="demo", save_dir=root)
    )
    loggers = [CSVLogger(root, name="", version="straggler"), logger]
    trainer = L.Trainer(
        accelerator="cpu",
        devices=devices,
        strategy=PolicyDDPStrategy(per_rank_metrics=PerRankMetrics(telemetry=True, telemetry_every_n_steps=1)),
        max_epochs=1,
        logger=loggers,
        log_every_n_steps=1,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    batches = 24
    slow = trainer.global_rank == devices - 1
    data = Samples(4 * batches * devices, DELAY / 4 if slow else 0.0)  # 4 samples per batch
    trainer.fit(Regression(), DataLoader(data, batch_size=4))
    if trainer.is_global_zero and isinstance(logger, MLFlowLogger):
        print(json.dumps({"run_id": logger.run_id, "experiment_id": logger.experiment_id}))
    elif trainer.is_global_zero:
        print(json.dumps({"id": logger.experiment.id}))
        logger.experiment.finish()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _get(url: str, body: dict[str, Any] | None = None) -> Any:
    """GET ``url``, or POST ``body`` as JSON to it."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.loads(answer.read())


def _wait_for(url: str, deadline: float) -> None:
    while True:
        try:
            _get(url)
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.5)


def screenshot(mlflow: str, store: Path, main: dict[str, str], out: Path, work: Path) -> None:
    """Serve ``store`` with ``mlflow server`` and let headless Chromium take the picture; stop both."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("chromium is not on PATH (Debian: apt-get install -y chromium)")
    port = _free_port()
    command = [mlflow, "server", "--backend-store-uri", f"file:{store}", "--host", "127.0.0.1", "--port", str(port)]
    environment = {**os.environ, "MLFLOW_ALLOW_FILE_STORE": "true"}
    with open(work / "mlflow.log", "w") as sink:
        server = subprocess.Popen(command, stdout=sink, stderr=sink, cwd=work, env=environment, start_new_session=True)
    try:
        api = f"http://127.0.0.1:{port}/api/2.0/mlflow"
        _wait_for(f"{api}/experiments/search?max_results=10", time.monotonic() + 120)
        runs = _get(f"{api}/runs/search", {"experiment_ids": [main["experiment_id"]], "max_results": 100})["runs"]
        children = sorted(
            (run for run in runs if _tag(run, "mlflow.parentRunId") == main["run_id"]),
            key=lambda run: run["info"]["run_name"],
        )
        ids = json.dumps([run["info"]["run_id"] for run in children], separators=(",", ":"))
        # the metric page (the UI's own link from a run's metric): MLflow 3 reads "runs" and "metric" as JSON
        view = "&".join(
            f"{name}={urllib.parse.quote(value, safe='')}"
            for name, value in (
                ("runs", ids),
                ("metric", json.dumps(METRIC)),
                ("experiments", json.dumps([main["experiment_id"]])),
                ("plot_metric_keys", json.dumps([METRIC])),
                ("plot_layout", "{}"),
                ("x_axis", "step"),
                ("y_axis_scale", "linear"),
                ("line_smoothness", "1"),
                ("show_point", "false"),
                ("deselected_curves", "[]"),
                ("last_linear_y_axis_range", "[]"),
            )
        )
        url = f"http://127.0.0.1:{port}/#/metric?{view}"
        profile = Path(tempfile.mkdtemp(prefix="chromium-profile-", dir=work))
        subprocess.run(
            [
                chromium,
                *CHROMIUM_FLAGS,
                f"--user-data-dir={profile}",
                f"--screenshot={out}",
                "--window-size=1700,820",  # MLflow 3 opens its assistant panel on the right: room for the chart
                "--force-device-scale-factor=1",
                "--virtual-time-budget=30000",  # the page's own timers (data loading, drawing) run before the shot
                url,
            ],
            check=True,
            timeout=180,
            capture_output=True,
        )
        from PIL import Image  # matplotlib's dependency (the plot extra)

        with Image.open(out) as shot:  # the page without MLflow's assistant panel, which opens on the right
            shot.crop((0, 0, _PAGE_WIDTH, shot.height)).save(out)
        print(url)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)


def plot(root: Path, main: dict[str, str], out: Path) -> None:
    """Every rank run of the main run's group, read back from its transaction log: its data wait and loss per step."""
    sys.path.insert(0, str(REPO))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tests.helpers.wandb_records import offline_runs

    runs = sorted((run for run in offline_runs(root / "wandb") if run.group == main["id"]), key=lambda run: run.name)
    figure, axes = plt.subplots(1, 2, figsize=(11, 3.8), constrained_layout=True)
    for axis, (key, label) in zip(
        axes, ((METRIC, "data wait per batch (s)"), ("loss", "loss (the rank's own)")), strict=True
    ):
        for run in runs:
            steps, values = zip(*run.curve(key), strict=True)
            axis.plot(steps, values, label=run.name, linewidth=1.6)
        axis.set(title=key, xlabel="trainer/global_step", ylabel=label)
        axis.grid(alpha=0.3)
    axes[0].legend(title=f"group {main['id']}", loc="center right")
    figure.suptitle(f"W&B offline runs of the group, read back from their run-*.wandb logs ({len(runs)} ranks)")
    figure.savefig(out, dpi=110)


def _tag(run: dict[str, Any], key: str) -> str | None:
    return next((tag["value"] for tag in run["data"].get("tags", []) if tag["key"] == key), None)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("mode", choices=["mlflow", "wandb", "fit"])
    parser.add_argument("root", nargs="?", help="(fit mode) where the run logs")
    parser.add_argument("--logger", choices=["mlflow", "wandb"], help="(fit mode) the logger")
    parser.add_argument("--out", type=Path, help="default: docs/mlflow-ranks.png, docs/wandb-ranks.png")
    parser.add_argument("--mlflow", default="mlflow", help="the `mlflow` command of a venv with the full package")
    parser.add_argument("--devices", type=int, default=3)
    parser.add_argument(
        "--work", type=Path, help="keep the run there (and reuse it if it is there); default: a temp dir"
    )
    args = parser.parse_args()
    if args.mode == "fit":
        fit(args.root, args.devices, args.logger)
        return
    out = args.out or REPO / "docs" / f"{args.mode}-ranks.png"
    with tempfile.TemporaryDirectory() as scratch:
        work = args.work or Path(scratch)
        root, found = work / "logs", work / f"{args.mode}_run.json"
        if not found.exists():
            run = [sys.executable, __file__, "fit", str(root), "--logger", args.mode, "--devices", str(args.devices)]
            done = subprocess.run(run, check=True, timeout=600, cwd=REPO, capture_output=True, text=True)
            found.write_text([line for line in done.stdout.splitlines() if line.startswith("{")][-1])
        main_run = json.loads(found.read_text())
        if args.mode == "mlflow":
            screenshot(args.mlflow, root / "mlruns", main_run, out.resolve(), work)
        else:
            plot(root, main_run, out.resolve())
    print(f"wrote {out} ({out.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
