"""This rank's own top-k, kept exactly as stock ``ModelCheckpoint`` would keep it on this rank, to vote with."""

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import Tensor

__all__ = ["LocalTopK"]

_LOCAL_TOP_K = "_lightning_ext_local_top_k"


class LocalTopK:
    """This rank's own top-k, kept exactly as stock Lightning keeps it on this rank, to vote with.

    Stock Lightning records each rank's own value under each rank's own file name and evicts by each rank's own
    ordering, so on an un-synced metric the ranks' states drift apart, while only rank 0's is real on disk. Under a
    vote policy the callback's visible state is rank 0's on every rank; this private view keeps what stock would have
    kept here (keyed by save order, since only scores and their order matter to a vote), so that each rank's vote is
    the one stock Lightning would cast.
    """

    def __init__(self) -> None:
        self.scores: dict[int, Tensor] = {}
        self.kth: int | None = None
        self._next = 0
        self._mirrors: tuple[str, ...] = ()

    @classmethod
    def of(cls, callback: ModelCheckpoint) -> "LocalTopK":
        """The callback's view, rebuilt from its visible state if that changed behind our back (e.g. a resume)."""
        view: LocalTopK | None = callback.__dict__.get(_LOCAL_TOP_K)
        if view is None or view._mirrors != tuple(callback.best_k_models):
            view = cls()
            for path, score in callback.best_k_models.items():
                if path == callback.kth_best_model_path:
                    view.kth = view._next
                view.scores[view._next] = score
                view._next += 1
            view._mirrors = tuple(callback.best_k_models)
            callback.__dict__[_LOCAL_TOP_K] = view
        return view

    @contextmanager
    def installed(self, callback: ModelCheckpoint) -> Iterator[None]:
        """Within the block, the callback's top-k attributes are this rank's own."""
        saved = (callback.best_k_models, callback.kth_best_model_path, callback.__dict__.get("kth_value"))
        callback.best_k_models = self.scores  # type: ignore[assignment]
        callback.kth_best_model_path = self.kth  # type: ignore[assignment]
        if self.kth is not None:
            callback.kth_value = self.scores[self.kth]
        try:
            yield
        finally:
            callback.best_k_models, callback.kth_best_model_path = saved[0], saved[1]
            if saved[2] is not None:
                callback.kth_value = saved[2]

    def record(self, callback: ModelCheckpoint, score: Tensor) -> None:
        """Record a save as ``ModelCheckpoint._update_best_and_save`` would have on this rank."""
        k = len(self.scores) + 1 if callback.save_top_k == -1 else callback.save_top_k
        if len(self.scores) == k and k > 0 and self.kth is not None:
            self.scores.pop(self.kth)
        if torch.isnan(score):
            score = torch.tensor(float("inf" if callback.mode == "min" else "-inf"), device=score.device)
        self.scores[self._next] = score
        self._next += 1
        if len(self.scores) == k:
            worst = max if callback.mode == "min" else min
            self.kth = worst(self.scores, key=self.scores.__getitem__)
        self._mirrors = tuple(callback.best_k_models)
