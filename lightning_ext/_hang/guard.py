"""``HangGuard``: the hang checks of one rank during one run, started at set-up and stopped at teardown."""

import contextlib
import sys
from collections.abc import Callable
from typing import Any, Literal

from lightning.pytorch.trainer.states import TrainerStatus
from torch import Tensor

from lightning_ext import _collective
from lightning_ext._hang import loaders, logs
from lightning_ext._hang.lockstep import Lockstep, Point, raise_record, record_of
from lightning_ext._hang.watchdog import Watchdog, is_library
from lightning_ext.errors import is_joint

__all__ = ["HangChecks", "HangGuard", "UnevenMode", "validate_options"]

HangChecks = bool | Literal["debug"]
UnevenMode = Literal["error", "truncate"]


def validate_options(hang_checks: Any, uneven_batches: Any, check_unsized_loaders: Any) -> None:
    """Raise ``ValueError``/``TypeError`` naming a bad option (at construction, before any collective)."""
    if hang_checks not in (True, False, "debug"):
        raise ValueError(f"hang_checks must be True, False or 'debug', got {hang_checks!r}")
    if uneven_batches not in ("error", "truncate"):
        raise ValueError(f"uneven_batches must be 'error' or 'truncate', got {uneven_batches!r}")
    if not isinstance(check_unsized_loaders, bool):
        raise TypeError(f"check_unsized_loaders must be a bool, got {check_unsized_loaders!r}")


class HangGuard:
    """The checks of one rank during one fit/validate/test.

    Args:
        mode: ``True`` (the default checks) or ``"debug"`` (also every ``all_gather``).
        uneven_batches: ``"error"`` or ``"truncate"``.
        check_unsized_loaders: compare loaders without a length after every batch.
        flush: writes this rank's buffered per-rank rows (called before any error is raised).

    """

    def __init__(
        self, mode: HangChecks, uneven_batches: UnevenMode, check_unsized_loaders: bool, flush: Callable[[], None]
    ) -> None:
        self.mode = mode
        self.uneven_batches: UnevenMode = uneven_batches
        self.check_unsized_loaders = check_unsized_loaders
        self._flush = flush
        self.lockstep: Lockstep | None = None

    def start(self, rank: int, world_size: int, namespace: str, trainer: Any) -> None:
        """Create the check group and the watchdog (every rank, at set-up, after the process group exists)."""
        if not self.mode or world_size < 2 or not _collective.is_initialized():
            return
        group = _collective.side_group()
        watchdog = Watchdog(namespace, rank, world_size)
        self.lockstep = Lockstep(group, watchdog, self._safe_flush)
        logs.start(self.lockstep, trainer)
        loaders.start(loaders.LoaderChecks(self.lockstep, self.uneven_batches, self.check_unsized_loaders))

    def finish(self, trainer: Any) -> None:
        """A last check when a fit/validate/test ends normally: every rank must end it, not wait at another check."""
        if self.lockstep is None or trainer is None or trainer.state.status != TrainerStatus.RUNNING:
            return
        stage = trainer.state.fn.value if trainer.state.fn is not None else "the run"
        self.lockstep.require(Point("end", ("end", stage), f"the end of {stage} (this rank finished)"))

    def stop(self) -> None:
        """Stop the checks and the watchdog (teardown)."""
        lockstep, self.lockstep = self.lockstep, None
        if lockstep is None:
            return
        logs.stop()
        loaders.stop()
        with contextlib.suppress(Exception):
            lockstep.watchdog.stop()
        _collective.destroy_group(lockstep.group)

    def reduce(self, reduce: Callable[..., Any], tensor: Any, group: Any, reduce_op: Any) -> Any:
        """``strategy.reduce`` with a check in place of Lightning's barrier."""
        checks = logs.active()
        if self.lockstep is None or checks is None or not _collective.is_world(group) or not isinstance(tensor, Tensor):
            return reduce(tensor, group=group, reduce_op=reduce_op)
        logs.check_reduce(checks, tensor, reduce_op)
        with _collective.lightning_barrier_skipped():  # the check above is that barrier
            return reduce(tensor, group=group, reduce_op=reduce_op)

    def check_call(self, call: str, identity: tuple[Any, ...], *, debug_only: bool = False) -> None:
        """Check before a collective call of the strategy (``barrier``, ``broadcast``, ``all_gather``)."""
        if self.lockstep is None or (debug_only and self.mode != "debug") or not _collective.is_initialized():
            return
        self.lockstep.require(Point("collective", identity, f"{call} {_called_as(sys._getframe(1))}"))

    def on_failure(self, error: BaseException, rank: int) -> None:
        """A fit/validate/test raised on this rank: flush, then make every rank end with the same error.

        If this rank's error is a collective that failed because another rank's process ended, raise that rank's
        posted error instead. Otherwise this rank's error is genuine: post it (the first error posted wins), so that
        ranks blocked in collectives with this one learn why; the caller then re-raises it here.
        """
        self._safe_flush()
        lockstep = self.lockstep
        if lockstep is None or is_joint(error):
            return
        posted = lockstep.watchdog.read_posted()
        if posted is not None and posted.rank != rank and _collective.is_communication_failure(error):
            raise_record(posted, cause=error)
        lockstep.watchdog.post(record_of(error, rank, joint=False))

    def _safe_flush(self) -> None:
        with contextlib.suppress(Exception):  # a diagnostic must never stand in the way of the real error
            self._flush()


def _called_as(frame: Any) -> str:
    """``(via Trainer.log_dir) called from model.py:40 in validation_step``: the API the user called, and where."""
    api = None
    while frame is not None:
        path = frame.f_code.co_filename.replace("\\", "/")
        if not is_library(path):
            via = f"via {api} " if api else ""
            return f"{via}called from {frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"
        if any(package in path for package in ("/lightning/", "/pytorch_lightning/", "/lightning_fabric/")):
            api = getattr(frame.f_code, "co_qualname", frame.f_code.co_name)  # co_qualname: Python 3.11+
        frame = frame.f_back
    return f"via {api}" if api else ""
