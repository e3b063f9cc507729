"""``SyncQueue``: a rank's synced logged values, synced together at points every rank reaches (docs/synced-logging.md).

A step value is held until the hook that logged it returns, an epoch round's values until the round starts; then one
all-reduce per reduce op and dtype syncs them, through Lightning's own ``strategy.reduce``, after the group's check.
"""

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

__all__ = ["Held", "SyncQueue", "exact_mean_input", "pack_key"]

Reduce = Callable[[Tensor, str], Tensor]
BeforePack = Callable[[list[Any], str, tuple[Any, ...]], None]


@dataclass(frozen=True)
class Held:
    """One value waiting for its sync.

    Attributes:
        metric: the ``_ResultMetric`` it belongs to (its ``meta`` says the key, the hook, the reduce op).
        tensor: what Lightning's ``meta.sync`` was given: synced in place, as Lightning's own sync does.
        reduce_op: the op Lightning asked for (``"mean"``, ``"sum"``, ``"max"``, ``"min"``).

    """

    metric: Any
    tensor: Tensor
    reduce_op: str


def pack_key(held: Held) -> tuple[str, torch.dtype, torch.device]:
    """What values share one all-reduce: the same reduce op, dtype and device."""
    return held.reduce_op, held.tensor.dtype, held.tensor.device


class SyncQueue:
    """The synced logged values of one rank in one run.

    Args:
        reduce: Lightning's ``strategy.reduce`` of the world group, without its barrier (``(tensor, reduce_op)``).
        before_pack: called on every rank with the result metrics of the values about to sync, the phase and the packs'
            layout (each pack's op, dtype, size and device), before any collective: the hang check of the group (it
            raises if the ranks differ, so that no rank's all-reduce meets another's of another dtype).

    """

    def __init__(self, reduce: Reduce, before_pack: BeforePack) -> None:
        self._reduce = reduce
        self._before_pack = before_pack
        self.held: list[Held] = []
        self._metric: Any = None  # the result metric whose value Lightning syncs now, and in which phase
        self._phase = ""
        self._synced: dict[int, list[Tensor]] = {}  # an epoch round's results, by id(result metric), in call order

    @contextmanager
    def logging(self, metric: Any, phase: str) -> Iterator[None]:
        """Within the block, Lightning syncs ``metric``'s ``"step"`` value (in ``forward``) or ``"epoch"`` value."""
        previous = self._metric, self._phase
        self._metric, self._phase = metric, phase
        try:
            yield
        finally:
            self._metric, self._phase = previous

    def take(self, tensor: Any, reduce_op: Any) -> Tensor | None:
        """Lightning's ``strategy.reduce`` of a logged value: its result, or ``None`` when it syncs as stock does.

        A step value is held and returned as it is (this rank's value until the hook ends, then synced in place); an
        epoch value of a round returns the result synced with the round.
        """
        metric = self._metric
        if metric is None or not isinstance(tensor, Tensor) or not isinstance(reduce_op, str):
            return None
        if self._phase == "step":
            self.held.append(Held(metric, tensor, reduce_op))
            return tensor
        results = self._synced.get(id(metric))
        return results.pop(0) if results else None

    def flush(self) -> None:
        """Sync the held step values (every rank calls this at the same hook ends)."""
        if not self.held:
            return
        held, self.held = self.held, []
        self._sync(held, "step")

    @contextmanager
    def epoch_round(self, metrics: Sequence[Any]) -> Iterator[None]:
        """Sync the epoch values of ``metrics`` (a round, in Lightning's order) together; Lightning's ``compute()``
        of each then gets its results within the block."""
        inputs = [held for metric in metrics for held in _sync_inputs(metric)]
        if inputs:
            self._sync(inputs, "epoch")
            for held in inputs:
                self._synced.setdefault(id(held.metric), []).append(held.tensor)
        try:
            yield
        finally:
            self._synced.clear()

    def _sync(self, held: Sequence[Held], phase: str) -> None:
        packs: dict[tuple[str, torch.dtype, torch.device], list[Held]] = {}
        for one in held:
            packs.setdefault(pack_key(one), []).append(one)
        packed = [(op, members, _pack(members)) for (op, _, _), members in packs.items()]
        layout = tuple((op, str(t.dtype).removeprefix("torch."), t.numel(), t.device.type) for op, _, t in packed)
        self._before_pack([one.metric for one in held], phase, layout)
        for index, (reduce_op, members, tensor) in enumerate(packed):
            if reduce_op in _EXTREMES:
                packed[index] = (reduce_op, members, _extreme(tensor, reduce_op, self._reduce))
            else:
                packed[index] = (reduce_op, members, self._reduce(tensor, reduce_op))
        for _, members, tensor in packed:
            if len(members) == 1 and tensor.data_ptr() == members[0].tensor.data_ptr():
                continue  # a lone value was reduced in place, as Lightning's own sync does
            targets = [one.tensor for one in members]
            results = [part.view(target.shape) for part, target in zip(tensor, targets, strict=True)]
            torch._foreach_copy_(targets, results)


def _pack(members: list[Held]) -> Tensor:
    """The values of one all-reduce, flat: a lone value as a view of itself (synced in place, with no copy in or out:
    the one-value hook is the common case, and each copy is a kernel launch on a GPU), else concatenated."""
    if len(members) == 1:
        return members[0].tensor.reshape(1)
    return torch.cat([one.tensor.reshape(1) for one in members])


_EXTREMES = {"max": -math.inf, "min": math.inf}  # each extreme's neutral value


def _extreme(values: Tensor, reduce_op: str, reduce: Reduce) -> Tensor:
    """The max or min over the ranks, NaN where any rank's value is NaN (as ``torch.max``/``torch.min`` have it).

    A backend's max or min keeps or drops a NaN depending on the rank it came from (gloo compares ``a < b``), so a
    NaN travels as a flag beside the values, in the same all-reduce: 1 for max (its max is 1 if any rank has NaN),
    -1 for min.
    """
    nan = torch.isnan(values)
    flag = 1.0 if reduce_op == "max" else -1.0
    sent = torch.cat([values.masked_fill(nan, _EXTREMES[reduce_op]), nan.to(values.dtype) * flag])
    reduced = reduce(sent, reduce_op)
    count = values.numel()
    return reduced[:count].masked_fill(reduced[count:] != 0, math.nan)


def _sync_inputs(metric: Any) -> list[Held]:
    """What Lightning's ``compute()`` of a tensor metric syncs, in its order: the value, then a mean's batch count.

    The same tensors as it passes to ``meta.sync``: a clone of the value, and the count as the float mean of the
    integers that lightning-ext's ``strategy.reduce`` makes of it (an exact mean, see ``exact_mean_input``).
    """
    meta = metric.meta
    inputs = [Held(metric, metric.value.clone(), meta.sync.op)]
    if meta.is_mean_reduction:
        inputs.append(Held(metric, exact_mean_input(metric.cumulated_batch_size, meta.sync.op), meta.sync.op))
    return inputs


def exact_mean_input(tensor: Any, reduce_op: Any) -> Any:
    """``tensor`` as a float tensor when ``strategy.reduce`` is asked for the mean of integers, else ``tensor``.

    Lightning's ``_sync_ddp`` divides an integer sum by the world size in place, truncating it: a logged mean's batch
    count, so a synced epoch mean is wrong when the ranks' batch-size totals differ (Lightning #21859). The mean of the
    same numbers as floats is exact.

    Example:
        >>> exact_mean_input(torch.tensor(7), "mean").dtype == torch.get_default_dtype()
        True
        >>> exact_mean_input(torch.tensor(7), "sum").dtype
        torch.int64

    """
    if (
        isinstance(tensor, torch.Tensor)
        and isinstance(reduce_op, str)
        and reduce_op.lower() in ("mean", "avg")
        and not (torch.is_floating_point(tensor) or torch.is_complex(tensor))
    ):
        return tensor.to(torch.get_default_dtype())
    return tensor
