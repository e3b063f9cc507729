"""The checkpoint of a coordinated stop: which file, and the loop state it corrects so the resume runs alike."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

from lightning.pytorch.callbacks import ModelCheckpoint

__all__ = ["PREEMPTED", "save"]

PREEMPTED = "last-preempted.ckpt"  # Lightning's ckpt_path="last" takes every "last*" file of a checkpoint directory


def save(trainer: Any, number: int, in_evaluation: bool) -> tuple[str, str]:
    """Save the stop's checkpoint on every rank together; return its path and how to resume from it.

    At the start of a training step (``in_evaluation`` false), the last step's ``on_advance_end`` has counted it in
    ``_batches_that_stepped``. When validation was due after that step, Lightning's resume takes its "restarted on
    last" path, which counts it once more, and every later row would be logged one step too high. The checkpoint is
    therefore written with the counter one lower exactly then (the resumed run evaluates the same condition on the
    same counters), and the counter is restored right after. In an evaluation (:func:`_evaluation_restarted`), the
    step is not counted yet, and the resume runs the interrupted validation again.
    """
    loop = trainer.fit_loop.epoch_loop
    shift = 0 if in_evaluation else int(bool(loop._should_check_val_fx(trainer.fit_loop._data_fetcher)))
    loop._batches_that_stepped -= shift
    try:
        with _evaluation_restarted(trainer) if in_evaluation else nullcontext():
            return _save_as_stopped(trainer, number)
    finally:
        loop._batches_that_stepped += shift


@contextmanager
def _evaluation_restarted(trainer: Any) -> Iterator[None]:
    """Within the block, the fit's validation loop counts its batches as a save inside its first step would leave
    them: Lightning's resume then takes its "restarted mid-evaluation" path and runs the whole validation again, from
    its first batch, before the next training step (the checkpoint holds the last completed training step; the
    validation's own results are not in a checkpoint). In the sanity check, as after it: nothing to run again."""
    progress = trainer.fit_loop.epoch_loop.val_loop.batch_progress
    saved = progress.state_dict()
    before = progress.total.completed - progress.current.completed  # the batches of this epoch's earlier validations
    progress.reset()
    if not trainer.sanity_checking:
        progress.total.increment_by(before)
        for tracker in (progress.total, progress.current):
            tracker.ready += 1
            tracker.started += 1
    try:
        yield
    finally:
        progress.load_state_dict(saved)


def _save_as_stopped(trainer: Any, number: int) -> tuple[str, str]:
    if number != signal.SIGTERM:  # Lightning's SLURM requeue signal: its own handler, now that every rank is here
        path = trainer._checkpoint_connector.hpc_save_path(trainer.default_root_dir)
        trainer._signal_connector._slurm_sigusr_handler_fn(number, None)
        return str(path), "Lightning resumes from it when SLURM restarts the job"
    path, found = _save(trainer)
    return path, 'resume with trainer.fit(..., ckpt_path="last")' if found else f"resume with ckpt_path={path!r}"


def _save(trainer: Any) -> tuple[str, bool]:
    """Through the first ``ModelCheckpoint`` that saves a full ``last`` checkpoint, else as :data:`PREEMPTED`.

    :data:`PREEMPTED` goes to the first ``ModelCheckpoint``'s directory, or, with none, to ``<log dir>/checkpoints``
    (where ``ckpt_path="last"`` does not look).
    """
    callbacks = [callback for callback in trainer.checkpoint_callbacks if isinstance(callback, ModelCheckpoint)]
    for callback in callbacks:
        if callback.save_last and not callback.save_weights_only:
            save_last = callback.save_last
            callback.save_last = True  # "link" would point at an older checkpoint: the stop writes the file
            try:
                callback._save_last_checkpoint(trainer, callback._monitor_candidates(trainer))
            finally:
                callback.save_last = save_last
            return str(callback.last_model_path), True
    if callbacks and callbacks[0].dirpath is not None:
        directory, found = str(callbacks[0].dirpath), True
    else:
        directory, found = os.path.join(str(trainer.log_dir or trainer.default_root_dir), "checkpoints"), False
    path = os.path.join(directory, PREEMPTED)
    trainer.save_checkpoint(path)
    return path, found
