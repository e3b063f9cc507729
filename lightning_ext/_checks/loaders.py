"""Checks on how many batches each rank runs: the commonest cause of DDP hangs (Lightning #3325)."""

import math
import weakref
from dataclasses import dataclass, field
from typing import Any, Literal

from lightning.pytorch.utilities import rank_zero_warn

from lightning_ext import errors
from lightning_ext._checks.lockstep import Lockstep
from lightning_ext._checks.messages import FIXES, batch_counts, count_text, describe_divergence, first_line
from lightning_ext._checks.points import Point
from lightning_ext._rank_lists import ranks_text
from lightning_ext._watch.rank_text import grouped_lines

__all__ = ["LoaderChecks", "active", "start", "stop"]

UnevenMode = Literal["error", "truncate"]
_TRUNCATED = "_lightning_ext_truncated"  # an evaluation loop's agreed counts for the current run


@dataclass
class LoaderChecks:
    """The batch-count checks of the running strategy."""

    lockstep: Lockstep
    mode: UnevenMode = "error"
    unsized: bool = False
    _last_fit_check: tuple[Any, ...] | None = None
    _watched: "weakref.WeakSet[Any]" = field(default_factory=weakref.WeakSet)  # loops whose fetchers are checked

    def after_fit_setup_data(self, loop: Any) -> None:
        """After ``_FitLoop.setup_data``: compare this epoch's training batch count (once per epoch and reload)."""
        loader = loop._combined_loader
        if loader is None:
            return
        key = (loop.trainer.current_epoch, id(loader), loop.max_batches)
        if key == self._last_fit_check:
            return
        self._last_fit_check = key
        counts = [loop.max_batches]
        agreed = self._compare(f"training epoch {loop.trainer.current_epoch}", ["train dataloader"], counts)
        if agreed is not None and agreed[0] < counts[0]:
            _truncate_fit(loop, int(agreed[0]))
            self._last_fit_check = (loop.trainer.current_epoch, id(loader), loop.max_batches)
        if self.unsized and math.isinf(loop.max_batches):
            self._watched.add(loop)

    def after_eval_setup_data(self, loop: Any) -> None:
        """After ``_EvaluationLoop.setup_data``: compare this run's batch counts, one per dataloader."""
        loop.__dict__.pop(_TRUNCATED, None)
        loader = loop._combined_loader
        if loader is None:
            return
        trainer = loop.trainer
        prefix = "test" if trainer.testing else "val"
        if trainer.sanity_checking:
            stage = "the sanity check"
        elif trainer.testing:
            stage = "test"
        elif trainer.state.fn is not None and trainer.state.fn.value == "fit":
            stage = f"validation (epoch {trainer.current_epoch})"
        else:
            stage = "validation"
        counts = list(loop.max_batches)
        names = [f"{prefix} dataloader {index}" for index in range(len(counts))]
        agreed = self._compare(stage, names, counts)
        if agreed is not None and agreed != counts:
            loop.__dict__[_TRUNCATED] = agreed
        if self.unsized and any(math.isinf(count) for count in counts):
            self._watched.add(loop)

    def after_fetch(self, fetcher: Any, exhausted: bool, dataloader_index: int | None) -> bool:
        """After a fetch from a watched loader without length: agree whether this was anyone's last batch.

        Returns:
            ``True`` if this rank must stop now (another rank ran out, and the mode truncates).

        """
        loop = next((loop for loop in self._watched if loop._data_fetcher is fetcher), None)
        if loop is None:
            return False
        done = exhausted or bool(fetcher.done)
        returned = fetcher.fetched - len(getattr(fetcher, "batches", ()))  # minus the batch fetched ahead
        identity = ("batch", dataloader_index, exhausted, done)
        where = f"batch {returned} of {_loader_name(loop, dataloader_index)}"
        detail = {"fetched": returned, "done": done, "exhausted": exhausted, "index": dataloader_index}
        point = Point("batch", identity, where + (" (its last)" if done else ""), detail)
        if self.lockstep.agree(point):
            return False
        points = self.lockstep.gather(point)
        name = _loader_name(loop, dataloader_index)
        if self.mode == "truncate" and len({p.detail["index"] for p in points}) == 1:
            rank_zero_warn(_truncation_note(name, points), category=UserWarning)
            if any(p.detail["exhausted"] for p in points):
                return True  # someone has nothing left: everyone stops before this batch
            fetcher.done = True  # this batch is everyone's last
            return False
        self.lockstep.fail_jointly(_unsized_error(name, points))

    def _compare(self, stage: str, names: list[str], counts: list[float]) -> list[float] | None:
        """Check the counts; return the agreed (shortest) counts when they differ and the mode truncates."""
        detail = {"stage": stage, "names": names, "counts": counts}
        listed = ", ".join(f"{name}: {count_text(count)}" for name, count in zip(names, counts, strict=True))
        point = Point(
            "loaders", ("loaders", stage, tuple(names), tuple(counts)), f"the start of {stage} ({listed})", detail
        )
        if self.lockstep.agree(point):
            return None
        points = self.lockstep.gather(point)
        same_loaders = all(p.kind == "loaders" and p.detail["names"] == names for p in points)
        finite = same_loaders and all(not math.isinf(c) for p in points for c in p.detail["counts"])
        if self.mode != "truncate" or not finite:
            self.lockstep.fail_jointly(describe_divergence(points))
        agreed = [min(p.detail["counts"][i] for p in points) for i in range(len(names))]
        rank_zero_warn(_truncation_message(stage, names, points, agreed), category=UserWarning)
        return agreed


_ACTIVE: LoaderChecks | None = None


def start(checks: LoaderChecks) -> None:
    """Check batch counts from now on (the strategy calls this at set-up, on every rank)."""
    global _ACTIVE
    _ACTIVE = checks


def stop() -> None:
    """Stop checking."""
    global _ACTIVE
    _ACTIVE = None


def active() -> LoaderChecks | None:
    """The running checks, if any."""
    return _ACTIVE


def truncated_max_batches(loop: Any, counts: list[float]) -> list[float]:
    """An evaluation loop's batch counts for this run, cut to the agreed counts where the mode truncates."""
    agreed: list[float] | None = loop.__dict__.get(_TRUNCATED)
    if agreed is None:
        return counts
    return [min(count, limit) for count, limit in zip(counts, agreed, strict=True)]


def _truncate_fit(loop: Any, batches: int) -> None:
    """Make this rank's training epoch ``batches`` long, as if ``limit_train_batches`` had said so."""
    loader = loop._combined_loader
    limits = loader.limits or [float("inf")] * len(loader.flattened)
    loader.limits = [min(limit, batches) for limit in limits]
    iter(loop._data_fetcher)  # the iterator takes its limits when created
    loop.max_batches = batches
    trainer = loop.trainer
    interval = trainer.val_check_interval
    if isinstance(interval, float) and getattr(trainer, "_val_check_time_interval", None) is None:
        trainer.val_check_batch = max(1, int(batches * interval))  # as Lightning derives it from the batch count


def _truncation_message(stage: str, names: list[str], points: list[Point], agreed: list[float]) -> str:
    parts = []
    for index, name in enumerate(names):
        counts = [p.detail["counts"][index] for p in points]
        longer = [rank for rank, count in enumerate(counts) if count > agreed[index]]
        if longer:
            parts.append(
                f"the {name} has {batch_counts(counts)}; every rank stops at {int(agreed[index])}, dropping the"
                f" batches past it on {ranks_text(longer, 3)}"
            )
    return f"lightning-ext uneven_batches='truncate' in {stage}: " + "; ".join(parts) + "."


def _truncation_note(name: str, points: list[Point]) -> str:
    ran_out = [rank for rank, p in enumerate(points) if p.detail["done"]]
    return (
        f"lightning-ext uneven_batches='truncate': the {name} ran out on {ranks_text(ran_out, 3)} at batch"
        f" {min(p.detail['fetched'] for p in points)}; every rank stops this epoch here and the other ranks' remaining"
        " batches are dropped."
    )


def _unsized_error(name: str, points: list[Point]) -> errors.UnevenBatchesError:
    ran_out = [rank for rank, p in enumerate(points) if p.detail["done"]]
    more = [rank for rank, p in enumerate(points) if not p.detail["done"]]
    fetched = min(p.detail["fetched"] for p in points)
    head = (
        f"Uneven data: the {name} (no length) ran out after {fetched} batch(es) on {ranks_text(ran_out, 3)} while"
        f" {ranks_text(more, 3)} had more."
    )
    lines = [first_line(head, ""), *grouped_lines((rank, p.where) for rank, p in enumerate(points)), FIXES["loaders"]]
    return errors.UnevenBatchesError("\n".join(lines))


def _loader_name(loop: Any, index: int | None) -> str:
    trainer = loop.trainer
    if trainer.training and not trainer.sanity_checking and loop is trainer.fit_loop:
        return "train dataloader"
    prefix = "test" if trainer.testing else "val"
    return f"{prefix} dataloader {index or 0}"
