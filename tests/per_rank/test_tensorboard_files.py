"""Every rank's curves in TensorBoard: event files in ``<log_dir>/rank_<r>/``, beside the synced run.

The real look: a 2-rank gloo fit with a ``TensorBoardLogger``, read back by a real ``tensorboard --logdir`` through its
HTTP API, against the values the logging script itself implies (``tests/helpers/metrics_reference.py``) and against a
stock ``DDPStrategy`` fit's event file. Then the guarantees the CSV files keep: a failing rank steps aside alone, the
writer and path scheme at 1,024 ranks, fsspec URLs, the logger's prefix. (Resume: ``test_resume.py``.)
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import lightning.pytorch  # noqa: F401  (first, as in a training script: it registers the strategies)
import pandas as pd
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from tensorboard.compat.proto.event_pb2 import Event

from lightning_ext import PerRankMetrics
from lightning_ext._per_rank import held_rows
from lightning_ext._per_rank.logger import RankMetricsLogger
from lightning_ext._per_rank.sinks import sinks_for
from lightning_ext._per_rank.tensorboard_files import RankEventFiles, events_up_to
from lightning_ext.rank_metrics import RankMetricsWarning
from tests.helpers.logging_scenarios import BATCHES, EPOCHS, full_script
from tests.helpers.metrics_reference import expected_cells, forked
from tests.helpers.per_rank_tasks import BATCHES as TASK_BATCHES
from tests.helpers.per_rank_tasks import EPOCHS as TASK_EPOCHS
from tests.helpers.per_rank_tasks import WORLD, expected_rows
from tests.helpers.per_rank_tasks import run as run_fits
from tests.helpers.tensorboard_reference import cells, event_files, read_scalars, tensorboard_server, wall_times


def _fit(pool: Any, root: Path, script: dict[str, Any], strategy: Any, count: bool = False) -> list[dict[str, Any]]:
    return pool.run(
        "tests.helpers.logging_scenarios:fit",
        (str(root), script),
        strategy=strategy,
        loggers="tensorboard",
        epochs=EPOCHS,
        batches=BATCHES,
        val_dataloaders=2,
        count=count,
        timeout=120,
    )


def _points(scalars: dict[str, list[tuple[int, float]]]) -> dict[str, dict[int, float]]:
    """By tag, each step's value (``epoch`` is logged several times at an epoch's last step, with one value)."""
    return {tag: dict(points) for tag, points in scalars.items()}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_tensorboard_shows_one_run_per_rank_over_the_synced_run(rank_pools: Any, tmp_path: Path) -> None:
    pool = rank_pools(2)
    script = full_script(2)
    stock = _fit(pool, tmp_path / "stock", script, "stock")
    ours = _fit(pool, tmp_path / "ours", script, {"per_rank_metrics": True}, count=True)
    off = _fit(pool, tmp_path / "off", script, {"per_rank_metrics": False}, count=True)
    log_dir = Path(ours[0]["log_dir"])

    # no collective added: the same calls as the same strategy without per-rank output
    assert [r["collectives"] for r in ours] == [r["collectives"] for r in off]
    # rank 0's stock event file: every scalar a stock DDPStrategy fit writes, and nothing else
    synced = read_scalars(log_dir)
    assert synced == read_scalars(stock[0]["log_dir"]) and synced
    assert len(event_files(log_dir)) == 1
    for rank in range(2):
        assert len(event_files(log_dir / f"rank_{rank}")) == 1  # one writer per rank
        assert (log_dir / f"rank_{rank}" / "metrics.csv").is_file()  # the CSV files are written too

    step_columns = {forked(e, True) for e in script["train"] if e["options"].get("on_step")}
    epoch_columns = {forked(e, False) for e in script["train"] if e["options"].get("on_epoch", True)}
    zero_only = {forked(e, False) for e in script["train"] if e["options"].get("rank_zero_only")}
    expected = expected_cells(script, 2, EPOCHS, BATCHES)
    runs = {".": "synced", "rank_0": 0, "rank_1": 1}
    served: dict[str, dict[str, list[tuple[int, float]]]] = {}

    with tensorboard_server(log_dir, tmp_path) as server:

        def loaded() -> bool:  # every expected value is there (whether it is right is asserted below)
            served.update({run: server.scalars(run) for run in runs})
            found = {run: cells(served[run], BATCHES, step_columns, epoch_columns) for run in runs}
            return all(found[run].keys() == expected[who].keys() for run, who in runs.items())

        server.wait_for(loaded, timeout=30)
        assert sorted(server.get("/data/runs")) == sorted(runs)
    for run, who in runs.items():
        assert cells(served[run], BATCHES, step_columns, epoch_columns) == expected[who], run
    # the same tags and steps as rank 0's stock logging (a rank_zero_only value in rank 0's run only)
    synced_tags = {tag: [step for step, _ in points] for tag, points in served["."].items() if tag != "hp_metric"}
    for rank in range(2):
        mine = {tag: [step for step, _ in points] for tag, points in served[f"rank_{rank}"].items()}
        assert mine == {tag: steps for tag, steps in synced_tags.items() if rank == 0 or tag not in zero_only}
    # what the server serves is what the files hold
    for rank in range(2):
        assert _points(read_scalars(log_dir / f"rank_{rank}")) == _points(served[f"rank_{rank}"])


@pytest.mark.slow
def test_a_full_disk_stops_one_ranks_event_files_and_nothing_else(rank_pools: Any, tmp_path: Path) -> None:
    """Rank 1's event file cannot grow after 3 records; rank 0 also writes telemetry, which reaches its run."""
    results = run_fits(rank_pools(WORLD), tmp_path, tensorboard=True, telemetry=True, fault="events_enospc")
    log_dir = Path(results[0]["log_dir"])
    assert results[0]["warnings"] == []
    (warning,) = results[1]["warnings"]
    assert warning.startswith("Per-rank TensorBoard events of rank 1 stopped: OSError: [Errno 28] No space left")
    assert f"{log_dir / 'rank_1'} keeps the events written so far. Training goes on;" in warning
    for rank in range(WORLD):
        # every rank's CSV file is complete, rank 1's too: the event files stepped aside alone
        table = pd.read_csv(log_dir / f"rank_{rank}" / "metrics.csv")
        assert table["own"].dropna().tolist() == [row["own"] for row in expected_rows(rank) if "own" in row]
    healthy = read_scalars(log_dir / "rank_0")
    assert [value for _, value in healthy["own"]] == [row["own"] for row in expected_rows(0) if "own" in row]
    # telemetry: the rank's CSV telemetry columns, at the same steps, as float32 scalars
    csv = pd.read_csv(log_dir / "rank_0" / "metrics.csv")
    for tag in ("telemetry/step_s", "telemetry/data_wait_s", "telemetry/forward_s", "telemetry/rss_bytes"):
        written = csv.dropna(subset=[tag])
        as_float32 = [float(torch.tensor(value, dtype=torch.float32)) for value in written[tag]]
        assert healthy[tag] == list(zip(written["step"], as_float32, strict=True)), tag
    assert len(healthy["telemetry/step_s"]) == TASK_EPOCHS * TASK_BATCHES  # a row per step (log_every_n_steps=1)
    # rank 1's event file keeps what was written before the disk filled: its first event, step 0's two rows
    broken = read_scalars(log_dir / "rank_1")
    assert broken["own"] == [(0, 10.5)] and [step for step, _ in broken["telemetry/step_s"]] == [0]


# ---- one process: the writer, the path scheme, resume, fsspec, the options -----------------------------------------


def test_one_writer_per_rank_at_1024_ranks(tmp_path: Path) -> None:
    threads = threading.active_count()
    for rank in range(1024):
        events = RankEventFiles(str(tmp_path), rank)
        for step in range(3):
            events.log_row({"loss": rank + step / 4}, step)
        events.close()
    assert threading.active_count() == threads  # each writer's thread ended with it
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(f"rank_{rank}" for rank in range(1024))
    for rank in range(1024):
        directory = tmp_path / f"rank_{rank}"
        assert len(event_files(directory)) == len(list(directory.iterdir())) == 1, rank
        assert read_scalars(directory) == {"loss": [(step, rank + step / 4) for step in range(3)]}, rank


def test_rows_reach_the_writer_together_each_stamped_with_its_own_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Held until ``every_n_rows`` rows, ``WRITE_EVERY_S`` seconds or a flush; each event keeps its row's time."""
    events = RankEventFiles(str(tmp_path), 0, every_n_rows=3)
    directory, logged = tmp_path / "rank_0", []

    def row(step: int) -> None:
        before = time.time()
        events.log_row({"loss": float(step)}, step)
        logged.append((step, before, time.time()))

    def in_file() -> list[tuple[int, float]]:
        events._file_writer.flush()  # the writer's own flush: what it was handed is in the file, the rows held are not
        return read_scalars(directory).get("loss", [])

    row(0)
    time.sleep(0.01)  # apart in time: each event must carry its own row's time, not the hand-over's
    row(1)
    assert in_file() == []
    row(2)
    assert in_file() == [(0, 0.0), (1, 1.0), (2, 2.0)]
    now = time.monotonic()
    monkeypatch.setattr(held_rows.time, "monotonic", lambda: now + held_rows.WRITE_EVERY_S)
    row(3)
    assert in_file()[-1] == (3, 3.0)  # due by time
    row(4)
    assert in_file()[-1] == (3, 3.0)  # held again: the time started anew at the hand-over
    events.flush()
    assert read_scalars(directory)["loss"][-1] == (4, 4.0)
    events.close()
    stamps = wall_times(directory)
    assert [step for step, _ in stamps] == [step for step, _, _ in logged]
    for (step, stamp), (_, before, after) in zip(stamps, logged, strict=True):
        assert before <= stamp <= after, step


def _rows(events: RankEventFiles, steps: range, offset: float) -> None:
    for step in steps:
        events.log_row({"loss": step + offset, "epoch": step // 4}, step)


@pytest.mark.parametrize("where", ["local", "memory"])
def test_a_resume_drops_the_events_after_the_checkpoint_step(tmp_path: Path, where: str) -> None:
    log_dir = str(tmp_path) if where == "local" else f"memory://{tmp_path.name}/run"
    first = RankEventFiles(log_dir, 3)
    _rows(first, range(10), 0.0)
    first.close()
    resumed = RankEventFiles(log_dir, 3)
    resumed.resume_from_step = 4  # resumed from the checkpoint at step 4
    resumed.log_row({"loss": 100.0 + 5, "epoch": 1}, 5)
    _rows(resumed, range(6, 8), 100.0)
    resumed.close()
    directory = f"{log_dir}/rank_3"
    if where == "memory":
        import fsspec

        fs = fsspec.filesystem("memory")
        local = tmp_path / "copy"
        fs.get(f"{tmp_path.name}/run/rank_3/", str(local), recursive=True)
        directory = str(local)
    scalars = read_scalars(directory)
    assert scalars["loss"] == [(step, float(step)) for step in range(5)] + [(s, 100.0 + s) for s in range(5, 8)]
    assert [step for step, _ in scalars["epoch"]] == list(range(8))


def test_events_up_to_keeps_records_byte_for_byte_and_drops_a_torn_tail(tmp_path: Path) -> None:
    events = RankEventFiles(str(tmp_path), 0)
    _rows(events, range(4), 0.0)
    events.close()
    (path,) = event_files(tmp_path / "rank_0")
    data = Path(path).read_bytes()
    assert events_up_to(data, 3, Event) is None  # nothing to drop: the file stays as it is
    kept = events_up_to(data, 1, Event)
    assert kept is not None and data.startswith(kept)
    assert events_up_to(data[:-3], 3, Event) == events_up_to(data, 2, Event)  # a record cut short by a crash


@contextlib.contextmanager
def _thread_errors() -> Iterator[list[BaseException | None]]:
    """The exceptions that end threads within the block (TensorBoard's writer thread ends on a failed write)."""
    seen: list[BaseException | None] = []
    hook = threading.excepthook
    threading.excepthook = lambda args: seen.append(args.exc_value)
    try:
        yield seen
    finally:
        threading.excepthook = hook


def test_a_failing_event_file_warns_once_and_the_csv_file_goes_on(tmp_path: Path) -> None:
    events = RankEventFiles(str(tmp_path), 1, writer_options={"filename_suffix": "/not/a/file"})
    logger = RankMetricsLogger(str(tmp_path), 1, sinks=[events])
    with warnings.catch_warnings(record=True) as caught, _thread_errors() as thread_errors:
        warnings.simplefilter("always")
        for step in range(3):
            logger.log_metrics({"loss": float(step)}, step=step)
        logger.close()
    assert [type(error) for error in thread_errors] == [FileNotFoundError]  # the writer's thread, at its first write
    ours = [str(w.message) for w in caught if issubclass(w.category, RankMetricsWarning)]
    assert len(ours) == 1 and ours[0].startswith("Per-rank TensorBoard events of rank 1 stopped: ")
    assert "(while opening the event file)" in ours[0] and "this rank's CSV file" in ours[0]
    assert not logger.stopped and events.stopped
    assert (tmp_path / "rank_1" / "metrics.csv").read_bytes() == b"loss,step\r\n0.0,0\r\n1.0,1\r\n2.0,2\r\n"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        later = RankEventFiles(str(tmp_path), 1)  # a later stage in this process: stays stopped, quietly
        later.log_row({"loss": 1.0}, 5)
    assert later.stopped and event_files(tmp_path / "rank_1") == []


def test_a_failing_csv_file_leaves_the_event_files_going(tmp_path: Path) -> None:
    """Each sink steps aside alone: the CSV file's failure to write a row does not touch the events."""
    events = RankEventFiles(str(tmp_path), 2)
    logger = RankMetricsLogger(str(tmp_path), 2, PerRankMetrics(filename="csv_{rank}/metrics.csv"), sinks=[events])
    (tmp_path / "csv_2").write_text("a file where the CSV file's directory should be")
    with warnings.catch_warnings(record=True) as caught, _thread_errors() as errors:
        warnings.simplefilter("always")
        for step in range(3):
            logger.log_metrics({"loss": float(step)}, step=step)
        logger.close()
    ours = [str(w.message) for w in caught if issubclass(w.category, RankMetricsWarning)]
    assert len(ours) == 1 and ours[0].startswith("Per-rank metrics of rank 2 stopped: ")
    assert logger.csv.stopped and not events.stopped and not logger.stopped and errors == []
    assert read_scalars(tmp_path / "rank_2") == {"loss": [(0, 0.0), (1, 1.0), (2, 2.0)]}


def test_when_the_local_values_fail_every_sink_stops_with_one_warning(tmp_path: Path) -> None:
    """Without local values the sinks would get synced values: they all stop; the CSV file's warning says why."""
    from lightning_ext._per_rank import local_values

    events = RankEventFiles(str(tmp_path), 2)
    logger = RankMetricsLogger(str(tmp_path), 2, sinks=[events])
    logger.log_metrics({"loss": 1.0}, step=0)
    with warnings.catch_warnings(record=True) as caught, _thread_errors() as errors:
        warnings.simplefilter("always")
        logger.log_metrics({"loss": 2.0}, step=None)  # a row without a step: the local values cannot be placed
        logger.log_metrics({"loss": 3.0}, step=2)
        logger.close()
    ours = [str(w.message) for w in caught if issubclass(w.category, RankMetricsWarning)]
    assert len(ours) == 1 and "(while reading the local values)" in ours[0], ours
    assert events.stopped and logger.stopped and not local_values.capture_active() and errors == []
    assert read_scalars(tmp_path / "rank_2") == {"loss": [(0, 1.0)]}


def test_every_tensorboard_logger_gets_event_files_in_its_own_log_dir_with_its_tags(tmp_path: Path) -> None:
    def trainer(*loggers: Any) -> Any:
        return SimpleNamespace(loggers=list(loggers))

    tensorboard = TensorBoardLogger(tmp_path, prefix="fold1")
    other = TensorBoardLogger(tmp_path / "other", name="second")
    csv = CSVLogger(tmp_path / "csv")
    options = PerRankMetrics(telemetry=True)
    assert sinks_for(trainer(), 0, options, None) == []
    assert sinks_for(trainer(csv), 0, options, None) == []
    assert sinks_for(trainer(tensorboard), 0, PerRankMetrics(tensorboard=False), None) == []
    # whatever the logger's place: each TensorBoard logger's own log_dir, one writer per directory
    found = sinks_for(trainer(csv, tensorboard, other, TensorBoardLogger(tmp_path, prefix="x")), 0, options, None)
    assert [sink.directory for sink in found] == [  # type: ignore[attr-defined]
        str(tmp_path / "lightning_logs" / "version_0" / "rank_0"),
        str(tmp_path / "other" / "second" / "version_0" / "rank_0"),
    ]
    events = found[0]
    events.log_row({"loss": 1.0, "telemetry/mine": 2.0}, 0)
    events.log_telemetry({"telemetry/step_s": 0.5, "epoch": 0}, 0)
    events.close(False)
    # the logger's prefix, as its log_metrics adds it; the user's telemetry/... escaped as in the CSV file
    assert read_scalars(tmp_path / "lightning_logs" / "version_0" / "rank_0") == {
        "fold1-loss": [(0, 1.0)],
        "fold1-metric:telemetry/mine": [(0, 2.0)],
        "fold1-telemetry/step_s": [(0, 0.5)],
    }
    with pytest.raises(TypeError, match=r"PerRankMetrics\.tensorboard must be True or False"):
        PerRankMetrics(tensorboard="yes")  # type: ignore[arg-type]


def test_the_event_files_do_not_disturb_the_reader(tmp_path: Path) -> None:
    from lightning_ext import read_rank_metrics

    logger = RankMetricsLogger(str(tmp_path), 0, sinks=[RankEventFiles(str(tmp_path), 0)])
    logger.log_metrics({"loss": 1.0}, step=0)
    logger.close()
    assert len(event_files(tmp_path / "rank_0")) == 1
    assert read_rank_metrics(tmp_path)["loss"].tolist() == [1.0]
    assert json.dumps(read_scalars(tmp_path / "rank_0")) == json.dumps({"loss": [[0, 1.0]]})
