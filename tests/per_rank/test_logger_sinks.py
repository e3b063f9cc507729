"""Every rank's curves in every logger the run uses: MLflow's child runs, W&B's grouped runs, TensorBoard in any place.

What users see is read back: MLflow's store through ``MlflowClient``, W&B's offline transaction logs with an
independent reader (``tests/helpers/wandb_records.py``), TensorBoard's event files with TensorBoard's own loader; the
expected values come from the logging formula (``tests/helpers/logger_sink_tasks.py``). Launched fits at 3 ranks, one
per logger; the choice of sinks, the batching, a missing package and a failed main run in one process.
"""

from __future__ import annotations

import sys
import threading
import time
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pandas as pd
import pytest
from lightning.pytorch.loggers import CSVLogger, MLFlowLogger, TensorBoardLogger, WandbLogger

from lightning_ext import PerRankMetrics
from lightning_ext._per_rank import held_rows, mlflow_runs
from lightning_ext._per_rank.sinks import run_identities, sinks_for
from lightning_ext.rank_metrics import RankMetricsWarning
from tests.helpers.logger_sink_tasks import ENVIRONMENT, EPOCHS, expected, synced
from tests.helpers.tensorboard_reference import read_scalars
from tests.helpers.wandb_records import offline_runs

WORLD = 3


@pytest.fixture
def stores(monkeypatch: pytest.MonkeyPatch) -> None:
    """MLflow's file store allowed and W&B offline in this process too (the parent reads back; one-process tests)."""
    for name, value in ENVIRONMENT.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("WANDB_CONSOLE", "off")


def _fit(pool: Any, root: Path, loggers: list[str], **options: Any) -> list[dict[str, Any]]:
    if "mlflow" in loggers:
        # MLflow's file store writes its default experiment when first opened, and ranks that open a new store at once
        # race on that file (stock Lightning alike: every rank builds its MLFlowLogger's client): opened here first
        from mlflow.tracking import MlflowClient

        MlflowClient(f"file:{root}/mlruns")
    results = pool.run("tests.helpers.logger_sink_tasks:fit", (str(root), loggers), timeout=240, **options)
    assert [r["status"] for r in results] == ["finished"] * WORLD  # training went on everywhere
    return results


def _history(client: Any, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((metric.step, metric.value) for metric in client.get_metric_history(run_id, key))


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_mlflow_shows_a_child_run_per_rank_under_the_loggers_run(rank_pools: Any, tmp_path: Path, stores: None) -> None:
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    results = _fit(rank_pools(WORLD), tmp_path, ["mlflow"])
    assert [r["warnings"] for r in results] == [[]] * WORLD
    client = MlflowClient(f"file:{tmp_path}/mlruns")  # the logger's tracking URI: the children are in the same store
    main = results[0]["runs"]["mlflow"]
    runs = client.search_runs([main["experiment_id"]])
    parent = client.get_run(main["run_id"])
    children = {run.info.run_name: run for run in runs if run.data.tags.get("mlflow.parentRunId") == main["run_id"]}
    assert len(runs) == 1 + WORLD and sorted(children) == [f"rank_{rank}" for rank in range(WORLD)]
    for rank in range(WORLD):
        child = children[f"rank_{rank}"]
        assert child.info.status == "FINISHED" and child.info.experiment_id == main["experiment_id"]
        assert set(child.data.metrics) == set(parent.data.metrics)  # the logger's keys
        for key, points in expected(rank).items():  # this rank's own values at the logger's steps
            assert _history(client, child.info.run_id, key) == sorted(points), (rank, key)
    for key, points in synced(WORLD).items():  # the parent run: stock logging on rank 0, untouched
        assert _history(client, main["run_id"], key) == sorted(points), key


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_wandb_offline_shows_a_run_per_rank_grouped_by_the_main_run(rank_pools: Any, tmp_path: Path) -> None:
    pytest.importorskip("wandb")
    results = _fit(rank_pools(WORLD), tmp_path, ["wandb"])
    assert [r["warnings"] for r in results] == [[]] * WORLD
    main = results[0]["runs"]["wandb"]["id"]
    runs = offline_runs(tmp_path / "wandb", finished=1 + WORLD)  # the main run and every rank's, all finished
    # exactly one copy of the main run (no other rank made one), and one run per rank
    found = {run.path.relative_to(tmp_path).as_posix(): (run.id, run.exit_code, len(run.history)) for run in runs}
    assert sorted(run.id for run in runs) == sorted([main] + [f"{main}-rank_{rank}" for rank in range(WORLD)]), found
    ranks = {run.name: run for run in runs if run.id != main}
    assert sorted(ranks) == [f"rank_{rank}" for rank in range(WORLD)]
    for rank in range(WORLD):
        run = ranks[f"rank_{rank}"]
        assert (run.group, run.project, run.job_type, run.exit_code) == (main, "ranks", "rank", 0)
        assert run.config["rank"] == rank
        for key, points in expected(rank).items():
            assert run.curve(key) == points, (rank, key)
    (main_run,) = [run for run in runs if run.id == main]
    for key, points in synced(WORLD).items():  # the main run: stock logging on rank 0, untouched
        assert main_run.curve(key) == points, key


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_tensorboard_second_gets_its_runs_and_a_failing_mlflow_sink_steps_aside_alone(
    rank_pools: Any, tmp_path: Path, stores: None
) -> None:
    """[CSV, TensorBoard, MLflow]: rank 1's MLflow store turns unwritable after its first batch of rows."""
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    pool = rank_pools(WORLD)
    loggers = ["csv", "tensorboard", "mlflow"]
    ours = _fit(pool, tmp_path / "ours", loggers, fault="mlflow_unwritable")
    stock = _fit(pool, tmp_path / "stock", loggers, stock=True)
    # rank 0's stock metrics.csv: byte for byte what stock writes with the same loggers
    csv_dir = Path(ours[0]["runs"]["csv"]["log_dir"])
    assert (csv_dir / "metrics.csv").read_bytes() == (
        Path(stock[0]["runs"]["csv"]["log_dir"]) / "metrics.csv"
    ).read_bytes()
    # the failing sink: one warning, on rank 1 only
    assert ours[0]["warnings"] == [] and ours[2]["warnings"] == []
    (warning,) = ours[1]["warnings"]
    assert warning.startswith("Per-rank MLflow run of rank 1 stopped: MlflowException: [Errno 13] Permission denied")
    assert "(while sending rows). Its run " in warning and "Training goes on; this rank's CSV file" in warning
    # TensorBoard, second: a run per rank under its own log_dir, rank 1's too; every rank's CSV file whole
    tensorboard_dir = Path(ours[0]["runs"]["tensorboard"]["log_dir"])
    assert tensorboard_dir != csv_dir
    for rank in range(WORLD):
        scalars = read_scalars(tensorboard_dir / f"rank_{rank}")
        table = pd.read_csv(csv_dir / f"rank_{rank}" / "metrics.csv")
        for key, points in expected(rank).items():
            assert scalars[key] == points, (rank, key)
            rows = table.dropna(subset=[key])
            assert list(zip(rows["step"], rows[key])) == points, (rank, key)
    # MLflow: ranks 0 and 2 whole; rank 1 keeps what it sent before the store refused
    client = MlflowClient(f"file:{tmp_path}/ours/mlruns")
    main = ours[0]["runs"]["mlflow"]
    children = {
        run.info.run_name: run.info.run_id
        for run in client.search_runs([main["experiment_id"]])
        if run.data.tags.get("mlflow.parentRunId") == main["run_id"]
    }
    for rank in range(WORLD):
        for key, points in expected(rank).items():
            history = _history(client, children[f"rank_{rank}"], key)
            if rank == 1:  # what was sent before the refusal: the first values, right, and nothing after
                assert history == sorted(points)[: len(history)] and len(history) < len(points), (rank, key)
            else:
                assert history == sorted(points), (rank, key)
    assert _history(client, children["rank_1"], "own")[:1] == [(0, 10.5)]  # the first batch went through


# ---- one process: the choice of sinks, batching, a missing package, a failed main run --------------------------------


def _trainer(*loggers: Any) -> Any:
    return SimpleNamespace(loggers=list(loggers))


@pytest.mark.both_packages
def test_each_logger_gets_its_sink_whatever_its_place_and_its_switch(tmp_path: Path, stores: None) -> None:
    pytest.importorskip("mlflow")
    pytest.importorskip("wandb")
    from mlflow.tracking import MlflowClient

    mlflow = MLFlowLogger(experiment_name="ranks", tracking_uri=f"file:{tmp_path}/mlruns", prefix="fold1")
    wandb = WandbLogger(project="ranks", save_dir=str(tmp_path))
    loggers = [CSVLogger(tmp_path), mlflow, TensorBoardLogger(tmp_path, name="tb"), wandb]
    identities = run_identities(_trainer(*loggers))  # rank 0 at set-up: the main runs, by the loggers' places
    assert identities[0] is None and identities[2] is None
    assert identities[1] is not None and identities[1]["run_id"] == mlflow.run_id
    assert identities[3] is not None and identities[3]["id"] == wandb.experiment.id
    sinks = sinks_for(_trainer(*loggers), 5, PerRankMetrics(), identities)
    assert [type(sink).__name__ for sink in sinks] == ["RankMlflowRun", "RankEventFiles", "RankWandbRun"]
    for rank, switch in enumerate(("mlflow", "tensorboard", "wandb"), start=6):
        off = sinks_for(_trainer(*loggers), rank, PerRankMetrics(**{switch: False}), identities)
        assert len(off) == 2, switch
        for sink in off:
            sink.close(False)
    for sink in sinks:
        sink.log_row({"loss": 1.5, "epoch": 0}, 0)
        sink.log_row({"loss": 2.5, "epoch": 0}, 1)
        sink.close(False)
    client = MlflowClient(f"file:{tmp_path}/mlruns")
    (child,) = client.search_runs([mlflow.experiment_id], filter_string="attributes.run_name = 'rank_5'")
    assert child.data.tags["mlflow.parentRunId"] == mlflow.run_id
    assert _history(client, child.info.run_id, "fold1-loss") == [(0, 1.5), (1, 2.5)]  # the logger's prefix
    assert read_scalars(tmp_path / "tb" / "version_0" / "rank_5")["loss"] == [(0, 1.5), (1, 2.5)]
    wandb.experiment.finish()
    (rank_run,) = [run for run in offline_runs(tmp_path / "wandb") if run.name == "rank_5"]
    assert rank_run.group == wandb.experiment.id and rank_run.curve("loss") == [(0, 1.5), (1, 2.5)]


def test_mlflow_rows_are_sent_in_batches(tmp_path: Path, stores: None, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    logger = MLFlowLogger(experiment_name="ranks", tracking_uri=f"file:{tmp_path}/mlruns")
    (sink,) = sinks_for(_trainer(logger), 0, PerRankMetrics(flush_every_n_rows=3), run_identities(_trainer(logger)))
    client = MlflowClient(f"file:{tmp_path}/mlruns")
    run_id, sender = sink.run_id, sink._sender  # type: ignore[attr-defined]
    threads: set[str] = set()
    send = sender._send
    sender._send = lambda metrics: (threads.add(threading.current_thread().name), send(metrics))

    def sent() -> list[tuple[int, float]]:
        sender.wait()  # the sender's own wait: what it was handed is sent, the rows held are not
        return _history(client, run_id, "loss")

    sink.log_row({"loss": 1.0}, 0)
    sink.log_row({"loss": 2.0}, 1)
    assert sent() == []  # held
    sink.log_row({"loss": 3.0}, 2)
    assert sent() == [(0, 1.0), (1, 2.0), (2, 3.0)]  # every 3 rows
    now = time.monotonic()
    monkeypatch.setattr(held_rows.time, "monotonic", lambda: now + held_rows.WRITE_EVERY_S)
    sink.log_row({"loss": 4.0}, 3)
    assert sent()[-1] == (3, 4.0)  # or after WRITE_EVERY_S seconds
    sink.log_row({"loss": 5.0}, 4)
    assert sent()[-1] == (3, 4.0)  # held again: the time started anew at the hand-over
    sink.flush()
    assert _history(client, run_id, "loss")[-1] == (4, 5.0)  # and on flush (each stage's end: close)
    assert threads == {"lightning-ext MLflow rank 0"}  # never the training thread


def test_wandb_rows_reach_its_client_in_batches(tmp_path: Path, stores: None, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("wandb")
    logger = WandbLogger(project="ranks", save_dir=str(tmp_path), offline=True)
    (sink,) = sinks_for(_trainer(logger), 1, PerRankMetrics(flush_every_n_rows=3), run_identities(_trainer(logger)))
    sender = sink._sender  # type: ignore[attr-defined]
    taken: list[tuple[str, float]] = []
    log = sender._send
    sender._send = lambda values: (taken.append((threading.current_thread().name, values["loss"])), log(values))

    def handed() -> list[float]:
        sender.wait()  # the sender's own wait: what it was handed is with W&B's client, the rows held are not
        return [loss for _, loss in taken]

    sink.log_row({"loss": 1.0}, 0)
    sink.log_row({"loss": 2.0}, 1)
    assert handed() == []  # held
    sink.log_row({"loss": 3.0}, 2)
    assert handed() == [1.0, 2.0, 3.0]  # every 3 rows
    now = time.monotonic()
    monkeypatch.setattr(held_rows.time, "monotonic", lambda: now + held_rows.WRITE_EVERY_S)
    sink.log_row({"loss": 4.0}, 3)
    assert handed()[-1] == 4.0  # or after WRITE_EVERY_S seconds
    sink.log_row({"loss": 5.0}, 4)
    sink.flush()
    assert handed()[-1] == 5.0  # and on flush (each stage's end: close)
    assert {name for name, _ in taken} == {"lightning-ext W&B rank 1"}  # never the training thread
    sink.close(False)
    logger.experiment.finish()
    (rank_run,) = [run for run in offline_runs(tmp_path / "wandb") if run.name == "rank_1"]
    assert rank_run.curve("loss") == [(step, step + 1.0) for step in range(5)]


@pytest.mark.parametrize("package", ["mlflow", "wandb"])
def test_a_missing_package_leaves_its_sink_out_and_says_so_once(
    tmp_path: Path, stores: None, monkeypatch: pytest.MonkeyPatch, package: str
) -> None:
    pytest.importorskip(package)
    logger = (
        MLFlowLogger(tracking_uri=f"file:{tmp_path}/mlruns")
        if package == "mlflow"
        else WandbLogger(project="ranks", save_dir=str(tmp_path), offline=True)
    )
    identities = run_identities(_trainer(logger))
    if package == "wandb":
        logger.experiment.finish()  # the main run: rank 0's, made before
    for name in [name for name in sys.modules if name == package or name.startswith(f"{package}.")]:
        monkeypatch.setitem(sys.modules, name, None)  # import mlflow / wandb (and their modules) now fails
    with pytest.warns(RankMetricsWarning) as caught:
        assert sinks_for(_trainer(logger), 4, PerRankMetrics(), identities) == []
    (warning,) = [str(w.message) for w in caught]
    name = {"mlflow": "MLflow", "wandb": "W&B"}[package]
    assert warning.startswith(f"Per-rank {name} run of rank 4 stopped: ModuleNotFoundError: import of {package}")
    assert f"(while loading {package}). No per-rank {name} run is made on this rank;" in warning
    assert f"`pip install 'lightning-ext[{package}]'`" in warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert sinks_for(_trainer(logger), 4, PerRankMetrics(), identities) == []  # once: a later stage is quiet


def test_a_main_run_rank_0_could_not_make_is_named_by_every_ranks_sink(tmp_path: Path, stores: None) -> None:
    pytest.importorskip("mlflow")
    logger = MLFlowLogger(tracking_uri=f"file:{tmp_path}/mlruns", run_id="no-such-run")
    identities = run_identities(_trainer(logger))  # never raises: the other ranks wait in the set-up's gather
    assert identities[0] is not None and identities[0]["error"].startswith("MlflowException: ")
    with pytest.warns(RankMetricsWarning, match=r"Per-rank MLflow run of rank 2 stopped: RuntimeError: rank 0 could"):
        assert sinks_for(_trainer(logger), 2, PerRankMetrics(), identities) == []
    assert EPOCHS == 2  # the launched fits' shape, which the expected values above assume


def test_a_failing_wandb_client_warns_once_and_the_run_keeps_its_rows(tmp_path: Path, stores: None) -> None:
    """W&B's client fails on the sender's thread: the training thread says so at its next row, once."""
    pytest.importorskip("wandb")
    logger = WandbLogger(project="ranks", save_dir=str(tmp_path))
    identities = run_identities(_trainer(logger))
    (sink,) = sinks_for(_trainer(logger), 3, PerRankMetrics(), identities)
    sink.log_row({"loss": 1.0}, 0)
    sink.flush()

    def refuse(values: Any) -> None:
        raise OSError("the W&B service went away")

    sink._sender._send = refuse  # type: ignore[attr-defined]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sink.log_row({"loss": 2.0}, 1)
        sink.flush()
        sink.log_row({"loss": 3.0}, 2)
        sink.close(False)
    ours = [str(w.message) for w in caught if issubclass(w.category, RankMetricsWarning)]
    main = logger.experiment.id
    assert ours == [
        f"Per-rank W&B run of rank 3 stopped: OSError: the W&B service went away (while logging a row). Its run"
        f" {main}-rank_3 keeps the values logged so far. Training goes on; this rank's CSV file, its other loggers'"
        " runs and the other ranks are not affected."
    ]
    logger.experiment.finish()
    (run,) = [run for run in offline_runs(tmp_path / "wandb") if run.name == "rank_3"]
    assert run.curve("loss") == [(0, 1.0)] and run.exit_code == 1


def test_a_resumed_mlflow_run_finds_its_ranks_children_again(
    tmp_path: Path, stores: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new process logging to the same parent (``MLFlowLogger(run_id=...)``) appends to the same child runs."""
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    first = MLFlowLogger(tracking_uri=f"file:{tmp_path}/mlruns")
    (sink,) = sinks_for(_trainer(first), 1, PerRankMetrics(), run_identities(_trainer(first)))
    sink.log_row({"loss": 1.0}, 0)
    sink.close(False)
    monkeypatch.setattr(mlflow_runs, "_CHILDREN", {})  # another process: it knows of no child yet
    resumed = MLFlowLogger(tracking_uri=f"file:{tmp_path}/mlruns", run_id=first.run_id)
    identities = run_identities(_trainer(resumed))
    assert identities[0] is not None and identities[0]["resumed"] == "yes"
    (again,) = sinks_for(_trainer(resumed), 1, PerRankMetrics(), identities)
    again.log_row({"loss": 2.0}, 1)
    again.close(False)
    assert again.run_id == sink.run_id  # type: ignore[attr-defined]
    client = MlflowClient(f"file:{tmp_path}/mlruns")
    assert _history(client, sink.run_id, "loss") == [(0, 1.0), (1, 2.0)]  # type: ignore[attr-defined]
    assert len(client.search_runs([first.experiment_id])) == 2  # the parent and one child


def test_a_stuck_wandb_client_never_holds_the_training_thread(
    tmp_path: Path, stores: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """W&B's client stops taking rows: a full queue stops the sink at once; a flush waits a bounded time."""
    pytest.importorskip("wandb")
    import threading

    from lightning_ext._per_rank import sender as senders

    monkeypatch.setattr(senders, "QUEUED", 3)
    monkeypatch.setattr(senders, "WAIT_S", 0.5)
    logger = WandbLogger(project="ranks", save_dir=str(tmp_path))
    options = PerRankMetrics(flush_every_n_rows=1)  # each row is handed over alone
    (sink,) = sinks_for(_trainer(logger), 2, options, run_identities(_trainer(logger)))
    release = threading.Event()
    sink._sender._send = lambda values: release.wait(60)  # type: ignore[attr-defined]
    start = time.monotonic()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(6):  # the first is taken (and stuck), three wait, the fifth finds the queue full
            sink.log_row({"loss": float(step)}, step)
        sink.flush()
        sink.close(False)
    release.set()
    assert time.monotonic() - start < 30  # bounded: only a hang would take this long
    ours = [str(w.message) for w in caught if issubclass(w.category, RankMetricsWarning)]
    assert len(ours) == 1 and ours[0].startswith(
        "Per-rank W&B run of rank 2 stopped: RuntimeError: W&B's client has not taken the last 3 batches of rows "
        "(while logging"
    )
    logger.experiment.finish()


def test_a_client_stuck_in_one_send_costs_the_run_one_wait_and_says_so(
    tmp_path: Path, stores: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MLflow's client hangs in a request, the queue far from full: the flush waits once, then the sink stops with its
    warning, and the end does not wait again (before: the flush's wait, the end's flush's, then the thread's join)."""
    pytest.importorskip("mlflow")
    from lightning_ext._per_rank import sender as senders

    wait_s = 3.0
    monkeypatch.setattr(senders, "WAIT_S", wait_s)
    logger = MLFlowLogger(experiment_name="ranks", tracking_uri=f"file:{tmp_path / 'mlruns'}")
    (sink,) = sinks_for(_trainer(logger), 1, PerRankMetrics(flush_every_n_rows=1), run_identities(_trainer(logger)))
    release = threading.Event()
    sink._sender._send = lambda metrics: release.wait(60)  # type: ignore[attr-defined]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sink.log_row({"loss": 1.0}, 0)  # taken by the thread, which hangs in it
        start = time.monotonic()
        sink.flush()
        sink.close(False)
        took = time.monotonic() - start
    release.set()
    assert wait_s <= took < 2 * wait_s  # one wait; only the repeated waits (3 of them) take two
    ours = [str(w.message) for w in caught if issubclass(w.category, RankMetricsWarning)]
    assert len(ours) == 1 and ours[0].startswith(
        "Per-rank MLflow run of rank 1 stopped: RuntimeError: MLflow's client has not taken the rows of the last flush "
        "within 3 s (while sending rows)"
    ), ours
