"""Which DDP forward passes broadcast before the module runs (the rebuilt buckets' order, the buffers), recorded."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from lightning_ext._watch.facts import Recorder

__all__ = ["BUCKETS", "BUFFERS", "forward_syncs", "unwatch", "watch"]

BUCKETS = "the order of its rebuilt gradient buckets"
BUFFERS = "the module's buffers"


def forward_syncs(ddp: Any, backward_synced: bool) -> str:
    """What ``ddp``'s forward pass, called now, broadcasts from rank 0 before its module runs, in words; ``""``: none.

    As torch 2.13's ``DistributedDataParallel._pre_forward`` and its C++ reducer decide (every rank alike):

    * the buckets (``Reducer::rebuild_buckets``, a broadcast of rank 0's assignment): in grad mode, once in a run
      (DDP's ``_has_rebuilt_buckets``), where ``static_graph`` is set or ``find_unused_parameters`` is not, once a
      backward pass with gradient sync has marked the parameters ready (``backward_synced``: the reducer fills
      ``rebuilt_params_`` only then), so at the forward pass after the first synced step;
    * the buffers (``_sync_buffers``): where ``will_sync_module_buffers()``: with ``broadcast_buffers=True`` and
      buffers, unless the last forward pass ran without grad mode or gradient sync; not with a buffer communication
      hook, whose communication is the user's.

    Neither with ``_delay_all_reduce_all_params`` or the Python reducer (compiled autograd): ``_pre_forward`` returns
    before them. A torch whose DDP lacks one of these attributes gets ``""``: the pass is not recorded.
    """
    try:
        if ddp._use_python_reducer or ddp._delay_all_reduce_all_params:
            return ""
        rebuild = (
            backward_synced
            and torch.is_grad_enabled()
            and not ddp._has_rebuilt_buckets
            and (ddp.static_graph or not ddp.find_unused_parameters)
        )
        buffers = not hasattr(ddp, "buffer_hook") and ddp.will_sync_module_buffers()
    except AttributeError:
        return ""
    return " and ".join(what for what, made in ((BUCKETS, rebuild), (BUFFERS, buffers)) if made)


class _Watched:
    """``ddp._pre_forward``, run inside :meth:`Recorder.forward_pass` where it broadcasts (an instance attribute of
    ``ddp``: it holds ``ddp`` weakly, so that no cycle keeps the module, and its process group, alive)."""

    def __init__(self, ddp: DistributedDataParallel, recorder: Recorder) -> None:
        self.ddp, self.recorder = weakref.ref(ddp), recorder
        self.pre_forward: Callable[..., Any] = type(ddp)._pre_forward
        self.armed_at: int | None = None  # synced backward passes before the first forward that prepared one
        self.trusted = True  # whether the rebuild came where foreseen (if not, it is no longer foreseen)

    def __call__(self, *inputs: Any, **kwargs: Any) -> Any:
        ddp, recorder = self.ddp(), self.recorder
        assert ddp is not None  # the module calls its own attribute
        armed = self.armed_at
        syncs = forward_syncs(ddp, self.trusted and armed is not None and recorder.backwards > armed)
        if armed is None and torch.is_grad_enabled() and ddp.require_backward_grad_sync:
            self.armed_at = recorder.backwards  # this pass prepares the reducer for a backward pass with sync
        if not syncs:
            return self.pre_forward(ddp, *inputs, **kwargs)
        with recorder.forward_pass(syncs):
            result = self.pre_forward(ddp, *inputs, **kwargs)
        if BUCKETS in syncs and not ddp._has_rebuilt_buckets:
            self.trusted = False
        return result


def watch(ddp: Any, recorder: Recorder) -> None:
    """Record ``ddp``'s forward passes that broadcast (a DDP module; anything else is left alone; idempotent)."""
    if isinstance(ddp, DistributedDataParallel) and not isinstance(ddp.__dict__.get("_pre_forward"), _Watched):
        ddp.__dict__["_pre_forward"] = _Watched(ddp, recorder)


def unwatch(ddp: Any) -> None:
    """Undo :func:`watch`."""
    if isinstance(getattr(ddp, "__dict__", {}).get("_pre_forward"), _Watched):
        del ddp.__dict__["_pre_forward"]
