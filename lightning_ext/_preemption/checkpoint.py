"""The checkpoint of a coordinated stop: which file, and the loop counter it corrects so the resume logs alike."""

from __future__ import annotations

import os
import signal
from typing import Any

from lightning.pytorch.callbacks import ModelCheckpoint

__all__ = ["PREEMPTED", "save"]

PREEMPTED = "last-preempted.ckpt"  # Lightning's ckpt_path="last" takes every "last*" file of a checkpoint directory


def save(trainer: Any, number: int) -> tuple[str, str]:
    """Save the stop's checkpoint on every rank together; return its path and how to resume from it.

    The stop comes at the start of a training step, after the last step's ``on_advance_end`` counted it in
    ``_batches_that_stepped``. When validation was due after that step, Lightning's resume takes its "restarted on
    last" path, which counts it once more, and every later row would be logged one step too high. The checkpoint is
    therefore written with the counter one lower exactly then (the resumed run evaluates the same condition on the
    same counters), and the counter is restored right after.
    """
    loop = trainer.fit_loop.epoch_loop
    shift = int(bool(loop._should_check_val_fx(trainer.fit_loop._data_fetcher)))
    loop._batches_that_stepped -= shift
    try:
        if number != signal.SIGTERM:  # Lightning's SLURM requeue signal: its own handler, now that every rank is here
            path = trainer._checkpoint_connector.hpc_save_path(trainer.default_root_dir)
            trainer._signal_connector._slurm_sigusr_handler_fn(number, None)
            return str(path), "Lightning resumes from it when SLURM restarts the job"
        path, found = _save(trainer)
        return path, 'resume with trainer.fit(..., ckpt_path="last")' if found else f"resume with ckpt_path={path!r}"
    finally:
        loop._batches_that_stepped += shift


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
