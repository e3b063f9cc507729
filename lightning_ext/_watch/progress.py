"""Where a rank is in Lightning's loops (stage, epoch, batches, loaders run out), read from its trainer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Progress", "progress_of"]


@dataclass(frozen=True)
class Progress:
    """Where a rank is in Lightning's loops.

    Attributes:
        stage: ``"train"``, ``"validate"``, ``"sanity_check"``, ``"test"``, ``"predict"`` or ``None``.
        epoch: the current epoch.
        train_batches: training batches started in the whole run so far.
        train_done: whether the training dataloader of this epoch has run out (in training or in the validation after).
        eval_loader: ``"val"`` or ``"test"``: the evaluation loop of ``eval_batches``.
        eval_batches: batches started per dataloader in the running (or, in training, the last) evaluation run (the
            batch in progress included).
        eval_done: whether that evaluation run has run out of data (or ended).
        hook: the hook it is in (``"training_step"``; Lightning's ``_current_fx_name``), or ``None`` between hooks.

    """

    stage: str | None
    epoch: int
    train_batches: int = 0
    train_done: bool = False
    eval_loader: str = "val"
    eval_batches: tuple[int, ...] = ()
    eval_done: bool = False
    hook: str | None = None

    def describe(self) -> str:
        """``validation of epoch 0 (val dataloader 0: 3 batch(es), ran out)``."""
        names = {"train": "training", "validate": "validation", "sanity_check": "the sanity check", "test": "testing"}
        text = f"{names.get(self.stage or '', self.stage or 'set-up')} of epoch {self.epoch}"
        if self.stage == "train":
            return text + f" ({self.train_batches} training batch(es) so far{', ran out' if self.train_done else ''})"
        if self.stage in ("validate", "sanity_check", "test") and self.eval_batches:
            index = len(self.eval_batches) - 1
            done = ", ran out" if self.eval_done else ""
            return text + f" ({self.eval_loader} dataloader {index}: {self.eval_batches[index]} batch(es){done})"
        return text


def progress_of(trainer: Any) -> Progress | None:
    """Where ``trainer`` is in its loops (``None`` if it cannot be read: a diagnostic never fails)."""
    if trainer is None:
        return None
    try:
        stage = trainer.state.stage
        stage_name = None if stage is None else str(stage.value)
        epoch_loop = trainer.fit_loop.epoch_loop
        fetcher = trainer.fit_loop._data_fetcher
        evaluating = stage_name in ("validate", "sanity_check", "test")
        loop = trainer._evaluation_loop if evaluating else epoch_loop.val_loop
        seen = dict(loop._seen_batches_per_dataloader)  # completed steps: the batch in progress counts too
        current = loop.batch_progress.current
        if evaluating and current.ready > current.completed:
            index = getattr(trainer._results, "dataloader_idx", None) or 0
            seen[index] = seen.get(index, 0) + 1
        eval_fetcher = loop._data_fetcher
        hook = getattr(trainer.lightning_module, "_current_fx_name", None)
        return Progress(
            stage=stage_name,
            epoch=int(trainer.current_epoch),
            train_batches=int(epoch_loop.batch_progress.total.ready),
            train_done=bool(fetcher is not None and fetcher.done),  # also while it validates at the epoch's end
            eval_loader="test" if stage_name == "test" else "val",
            eval_batches=tuple(seen.get(index, 0) for index in range(max(seen) + 1)) if seen else (),
            eval_done=not evaluating or bool(eval_fetcher is not None and eval_fetcher.done),
            hook=None if hook is None else str(hook),
        )
    # a trainer half set up or torn down: a loop, a fetcher or a state not there yet (AttributeError, or None where a
    # number is read: TypeError, ValueError)
    except (AttributeError, TypeError, ValueError):
        return None
