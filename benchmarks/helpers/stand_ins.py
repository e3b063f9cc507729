"""What ``ModelCheckpoint`` and ``EarlyStopping`` read from a trainer, and nothing else: the tests' and benchmarks'."""

from typing import Any

import torch

__all__ = ["StandInTrainer"]


class StandInTrainer:
    """A trainer stand-in for driving the callbacks outside a ``Trainer``; every exchange still goes through the
    strategy it carries. It imports nothing of lightning_ext, so the tests' independent references can use it too.

    Args:
        strategy: what the callbacks reach through ``trainer.strategy`` (a real strategy, or a stand-in).

    """

    def __init__(self, strategy: Any) -> None:
        self.strategy = strategy
        self.global_rank: int = strategy.global_rank
        self.is_global_zero = strategy.global_rank == 0
        self.loggers: list[Any] = []
        self.ckpt_path: str | None = None
        self.global_step = 0
        self.current_epoch = 0
        self.fast_dev_run = False
        self.should_stop = False
        self.callback_metrics: dict[str, torch.Tensor] = {}
        self.saved: list[str] = []

    def save_checkpoint(self, filepath: str, weights_only: bool = False) -> None:
        """Record the save; nothing is written."""
        self.saved.append(filepath)
