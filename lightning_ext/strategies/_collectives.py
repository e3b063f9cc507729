"""The strategy's collectives (``reduce``, ``barrier``, ``broadcast``, ``all_gather``): checked, timed, coalesced."""

from typing import TYPE_CHECKING, Any

from lightning.pytorch.strategies import ParallelStrategy
from typing_extensions import override

from lightning_ext import _collective
from lightning_ext._sync.queue import exact_mean_input
from lightning_ext._telemetry import step_timer

if TYPE_CHECKING:
    from lightning_ext._checks.guard import HangGuard
    from lightning_ext._sync.queue import SyncQueue

__all__ = ["CollectiveSeams"]

# To type checkers the seams are the strategy they are mixed into; at run time they sit before it in the MRO.
if TYPE_CHECKING:
    _Strategy = ParallelStrategy
else:
    _Strategy = object


class CollectiveSeams(_Strategy):
    """Lightning's own collective methods of the strategy, each asking the hang checks first and timed by telemetry;
    a logged value's ``reduce`` is held for its hook's coalesced sync. ``PolicyStrategyMixin`` sets the attributes."""

    _hang_guard: "HangGuard"
    _sync_queue: "SyncQueue | None"
    _step_timer: step_timer.StepTimer | None

    @override
    def reduce(self, tensor: Any, group: Any | None = None, reduce_op: Any = "mean") -> Any:
        tensor = exact_mean_input(tensor, reduce_op)
        queue = self._sync_queue
        if queue is not None and _collective.is_world(group):
            synced = queue.take(tensor, reduce_op)  # a logged value: it syncs with the others of its hook or round
            if synced is not None:
                return synced
        with step_timer.timing(self._step_timer, step_timer.COLLECTIVES):
            return self._hang_guard.reduce(super().reduce, tensor, group, reduce_op)  # type: ignore[safe-super]

    def _reduce_packed(self, tensor: Any, reduce_op: str) -> Any:
        """Lightning's own ``reduce`` of packed logged values, without its barrier (their check lined the ranks up)."""
        with step_timer.timing(self._step_timer, step_timer.COLLECTIVES), self._hang_guard.without_barrier():
            return super().reduce(tensor, group=None, reduce_op=reduce_op)  # type: ignore[safe-super]

    @override
    def barrier(self, name: str | None = None) -> None:
        with step_timer.timing(self._step_timer, step_timer.COLLECTIVES):
            self._hang_guard.check_call(f"strategy.barrier({'' if name is None else repr(name)})", ("barrier", name))
            super().barrier(name)  # type: ignore[safe-super]

    @override
    def broadcast(self, obj: Any, src: int = 0) -> Any:
        with step_timer.timing(self._step_timer, step_timer.COLLECTIVES):
            self._hang_guard.check_call(f"strategy.broadcast(src={src})", ("broadcast", src))
            return super().broadcast(obj, src)  # type: ignore[safe-super]

    @override
    def all_gather(self, tensor: Any, group: Any | None = None, sync_grads: bool = False) -> Any:
        with step_timer.timing(self._step_timer, step_timer.COLLECTIVES):
            if _collective.is_world(group):
                shape = tuple(tensor.shape) if hasattr(tensor, "shape") else None
                identity = ("all_gather", shape, str(getattr(tensor, "dtype", None)))
                self._hang_guard.check_call("strategy.all_gather()", identity, debug_only=True)
            return super().all_gather(tensor, group=group, sync_grads=sync_grads)
