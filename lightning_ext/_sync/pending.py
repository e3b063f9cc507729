"""The trainer's metrics read while a hook's synced values are pending: each such read warned about, once per line.

Inside the hook that logged them, the coalesced sync holds a rank's own values until the hook returns; stock Lightning
gives the synced ones there. A read of them names the key, the user's line, what stock gives, and the fix.
"""

import sys
import warnings
from collections.abc import Iterable, Sequence
from typing import Any

from lightning_ext._sync.queue import Held
from lightning_ext._watch.sites import user_frame
from lightning_ext.errors import UnsyncedReadWarning

__all__ = ["PendingMetrics", "pending_names"]

_STOCK = {"mean": "the mean", "sum": "the sum", "max": "the maximum", "min": "the minimum"}


def pending_names(held: Sequence[Held]) -> dict[str, Held]:
    """The names under which ``trainer.callback_metrics``, ``logged_metrics`` and ``progress_bar_metrics`` show the
    held step values (``x``, ``x_step`` when also logged per epoch, a dataloader's suffix), as Lightning forks them."""
    names: dict[str, Held] = {}
    for one in held:
        meta = one.metric.meta
        suffix = (
            f"/dataloader_idx_{meta.dataloader_idx}"
            if meta.add_dataloader_idx and meta.dataloader_idx is not None
            else ""
        )
        for name in (meta.name, meta.forked_name(True)):
            names[name + suffix] = one
    return names


class PendingMetrics(dict[str, Any]):
    """What ``trainer.callback_metrics`` (or ``logged_metrics``, ``progress_bar_metrics``) returned, while values are
    pending: reading one of those warns; writes go to the trainer's own dictionary as well.

    Args:
        metrics: the trainer's dictionary.
        pending: the pending values by the names they have there.
        rank: this rank.
        warned: the lines warned about in this run (each is warned about once).

    """

    def __init__(self, metrics: dict[str, Any], pending: dict[str, Held], rank: int, warned: set[Any]) -> None:
        super().__init__(metrics)
        self._source, self._rank, self._warned = metrics, rank, warned
        self._pending = {name: held for name, held in pending.items() if name in metrics}

    def __getitem__(self, key: str) -> Any:
        value = super().__getitem__(key)
        self._read([key])
        return value

    def get(self, key: str, default: Any = None) -> Any:
        self._read([key])
        return super().get(key, default)

    def items(self) -> Any:
        self._read(self)
        return super().items()

    def values(self) -> Any:
        self._read(self)
        return super().values()

    def copy(self) -> dict[str, Any]:
        self._read(self)
        return dict(super().items())

    def __setitem__(self, key: str, value: Any) -> None:
        self._source[key] = value
        self._pending.pop(key, None)
        super().__setitem__(key, value)

    def __delitem__(self, key: str) -> None:
        del self._source[key]
        self._pending.pop(key, None)
        super().__delitem__(key)

    def update(self, *args: Any, **kwargs: Any) -> None:
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def pop(self, key: str, *default: Any) -> Any:
        if key in self:
            self._read([key])
            self._source.pop(key, None)
        return super().pop(key, *default)

    def _read(self, keys: Iterable[str]) -> None:
        read = [key for key in keys if key in self._pending]
        if read:
            _warn(read, self._pending, self._rank, self._warned)


def _warn(keys: list[str], pending: dict[str, Held], rank: int, warned: set[Any]) -> None:
    """Warn about ``keys`` read at the user's line (once per line), naming that line as the warning's place."""
    frame = user_frame(sys._getframe(2))
    where = ("<unknown>", 0) if frame is None else (frame.f_code.co_filename, frame.f_lineno)
    if where in warned:
        return
    warned.add(where)
    site = "an unknown line" if frame is None else f"{where[0]}:{where[1]} in {frame.f_code.co_name}"
    first = pending[keys[0]]
    hook = first.metric.meta.fx
    named = ", ".join(repr(key) for key in keys[:3]) + (f" and {len(keys) - 3} more" if len(keys) > 3 else "")
    ops = {pending[key].reduce_op for key in keys}
    stock = _STOCK.get(first.reduce_op, "the value reduced") if len(ops) == 1 else "the values reduced"
    own = "are rank {rank}'s own values: they sync" if len(keys) > 1 else "is rank {rank}'s own value: it syncs"
    message = (
        f"{named} read at {site} {own.format(rank=rank)} when {hook} returns, and stock Lightning gives {stock} over"
        f' every rank here. Read it after {hook} returns, or pass log_sync="per_value".\n'
        "Inside the hook that logged it with sync_dist=True, lightning-ext's coalesced sync still holds this rank's"
        " value (docs/synced-logging.md); every read of it there is this rank's, so a branch on it can differ by rank."
    )
    warnings.warn_explicit(message, UnsyncedReadWarning, where[0], where[1])
