"""Each rank's Weights & Biases run: ``rank_<r>`` in the ``WandbLogger``'s project, grouped by the main run's id.

Made with rank 0's project, entity, directory and mode (offline as online), never as a copy of the main run; the keys
and the step axis are the logger's (``trainer/global_step``); rows are handed to W&B by a thread of its own, in batches
(the rule of :mod:`~lightning_ext._per_rank.held_rows`).
"""

from collections.abc import Mapping
from typing import Any

from lightning.pytorch.loggers import WandbLogger

from lightning_ext._files.file_output import Output
from lightning_ext._files.storage import guarded
from lightning_ext._per_rank.rank_sink import Identity, main_run, metric_key, sink_output, telemetry_values
from lightning_ext._per_rank.sender import Sender
from lightning_ext._per_rank.writer import PerRankMetrics

__all__ = ["STEP_KEY", "RankWandbRun", "identity", "rank_run_id", "sink_for"]

STEP_KEY = "trainer/global_step"  # WandbLogger's step axis: every row carries it


def identity(logger: WandbLogger) -> Identity:
    """The logger's run as rank 0 has it (made now if it was not yet; stock Lightning's set-up hook makes it too)."""
    run = logger.experiment
    settings = run.settings
    return {
        "id": str(run.id),
        "name": str(run.name or ""),
        "project": str(run.project or ""),
        "entity": str(run.entity or ""),
        "dir": str(settings.root_dir),
        "mode": str(settings.mode),
    }


def rank_run_id(main_id: str, rank: int) -> str:
    """Rank ``rank``'s run id: a resumed main run (the same id) finds its ranks' runs again.

    Example:
        >>> rank_run_id("3f9a1c2b", 7)
        '3f9a1c2b-rank_7'

    """
    return f"{main_id}-rank_{rank}"


def sink_for(logger: WandbLogger, rank: int, options: PerRankMetrics, main: Identity | None) -> "RankWandbRun | None":
    """This rank's run in ``logger``'s group, or ``None`` (said once) where it cannot be made."""
    where = "?" if main is None else main.get("id", "?")
    output = sink_output(f"wandb run of rank {rank} beside {where}", f"Per-rank W&B run of rank {rank}")
    if output.stopped:  # it failed earlier in this process, and said so then
        return None
    nothing = "No per-rank W&B run is made on this rank"
    with guarded() as failure:  # the optional package: absent (ImportError), or a broken install
        import wandb
    if failure.error is not None:
        hint = f"{nothing}; `pip install 'lightning-ext[wandb]'`"
        output.step_aside(failure.error, "loading wandb", lambda _: hint)
        return None
    try:
        main = main_run(main)
    except RuntimeError as error:
        output.step_aside(error, "naming the main run", lambda _: nothing)
        return None
    prefix = f"{logger._prefix}{logger.LOGGER_JOIN_CHAR}" if logger._prefix else ""
    run = RankWandbRun(
        output, main, rank, prefix=prefix, telemetry=options.telemetry, every_n_rows=options.flush_every_n_rows
    )
    run.open(wandb)
    return run


class RankWandbRun:
    """This rank's W&B run; never raises into the training.

    Args:
        output: its stop-and-warn.
        main: the logger's run, from rank 0 (``id``, ``project``, ``entity``, ``dir``, ``mode``).
        rank: this process's global rank.
        prefix: the logger's prefix and join character, put before each key as the logger does.
        telemetry: telemetry is on: a user's ``telemetry/...`` metric is escaped, as in the CSV file.
        every_n_rows: rows held before they are handed to the sender (the per-rank ``flush_every_n_rows``).

    """

    def __init__(
        self, output: Output, main: Identity, rank: int, *, prefix: str, telemetry: bool, every_n_rows: int
    ) -> None:
        self._output, self._main, self._rank = output, main, rank
        self._prefix, self._telemetry = prefix, telemetry
        self.stopped = False
        self.resume_from_step: int | None = None  # W&B keeps a run's whole history: nothing is dropped
        self.run: Any = None
        self._keys: dict[str, str] = {}
        self._every_n_rows = every_n_rows
        self._sender: Sender[dict[str, float], dict[str, float]] | None = None

    def open(self, wandb: Any) -> None:
        """Start (or, for a resumed main run, resume) this rank's run: at set-up, outside the training steps."""
        main, rank = self._main, self._rank
        with guarded() as failure:
            self.run = wandb.init(
                project=main["project"] or None,
                entity=main["entity"] or None,
                dir=main["dir"],
                mode=main["mode"],
                id=rank_run_id(main["id"], rank),
                name=f"rank_{rank}",
                group=main["id"],
                job_type="rank",
                config={"rank": rank, "main_run": main["id"]},
                resume="allow",
                reinit="create_new",  # beside the main run on rank 0, which stays wandb.run
                settings=wandb.Settings(console="off", silent=True),
            )
            self.run.define_metric(STEP_KEY)  # the logger's step axis, as WandbLogger defines it
            self.run.define_metric("*", step_metric=STEP_KEY, step_sync=True)
            # run.log costs about 0.1 ms of CPU per row (wandb 0.31): the training thread does not wait for it
            self._sender = Sender(
                self.run.log,
                lambda rows: rows,
                client="W&B's client",
                name=f"lightning-ext W&B rank {rank}",
                every_n_rows=self._every_n_rows,
            )
        if failure.error is not None:
            self._stop(failure.error, "starting the run")

    def log_row(self, row: Mapping[str, float], step: int) -> None:
        """Log the row's values at ``step``: W&B's client hands them to its own process, which sends them."""
        sender = self._sender
        if self.stopped or sender is None:
            return
        if sender.error is not None:
            self._stop(sender.error, "logging a row")
            return
        keys = self._keys
        values: dict[str, float] = {STEP_KEY: step}
        for name, value in row.items():
            key = keys.get(name)
            if key is None:
                key = keys[name] = self._prefix + metric_key(name, self._telemetry)
            values[key] = value
        self._put(sender, values)

    def log_telemetry(self, row: Mapping[str, float], step: int) -> None:
        """Log a telemetry row's ``telemetry/*`` values."""
        sender = self._sender
        if self.stopped or sender is None:
            return
        if sender.error is not None:
            self._stop(sender.error, "logging a row")
            return
        values = {self._prefix + name: value for name, value in telemetry_values(row).items()}
        self._put(sender, {**values, STEP_KEY: step})

    def _put(self, sender: Sender[dict[str, float], dict[str, float]], values: dict[str, float]) -> None:
        with guarded() as failure:
            sender.hold(values)
        if failure.error is not None:
            self._stop(failure.error, "logging a row")

    def flush(self) -> None:
        """Hand the rows held to the sender, and wait until every row is with W&B's own process (30 s at most)."""
        sender = self._sender
        error = None if self.stopped or sender is None else sender.flush()
        if error is not None:
            self._stop(error, "logging a row")

    def close(self, failed: bool) -> None:
        """Finish the run (a stage that raised marks it failed); a later stage resumes it under the same id."""
        self.flush()
        if self.stopped or self.run is None:
            return
        with guarded() as failure:
            if self._sender is not None:
                self._sender.end()
            self.run.finish(exit_code=1 if failed else 0)
        if failure.error is not None:
            self._stop(failure.error, "finishing the run")
            return
        self._sender = self.run = None

    def abandon(self) -> None:
        """Finish the run, marked failed, and log nothing more."""
        sender, self._sender = self._sender, None
        run, self.run = self.run, None
        if run is not None and not self.stopped:
            with guarded():  # the CSV file's warning says that this rank's output stopped
                if sender is not None:
                    sender.hand_on()  # local values: they are sent
                    sender.end()
                run.finish(exit_code=1)
        self.stopped = True

    def _stop(self, error: BaseException, doing: str) -> None:
        self.stopped = True
        sender, self._sender = self._sender, None
        if sender is not None:
            sender.drop()
        run, self.run = self.run, None
        name = rank_run_id(self._main["id"], self._rank)
        kept = f"Its run {name} keeps the values logged so far" if run is not None else "No run was made"

        def release() -> None:
            if sender is not None:
                sender.end()
            if run is not None:
                run.finish(exit_code=1)

        self._output.step_aside(error, doing, lambda _: kept, release)
