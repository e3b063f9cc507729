"""Which DDP forward passes broadcast before the module runs (the rebuilt buckets' order, the buffers), recorded."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from lightning_ext._collective import is_world
from lightning_ext._watch.facts import Recorder

__all__ = ["forward_syncs", "unwatch", "watch"]


def forward_syncs(ddp: Any, synced_backwards: int) -> tuple[str, ...]:
    """What ``ddp``'s forward pass, called now, broadcasts from rank 0 before its module runs: ``"buckets"``,
    ``"buffers"``, both, or nothing. ``synced_backwards``: the backward passes with gradient sync since the first
    forward pass that prepared one (in grad mode, outside ``no_sync``).

    As torch 2.13's ``DistributedDataParallel._pre_forward`` and its C++ reducer decide (every rank alike):

    * the buckets (``Reducer::rebuild_buckets``, two broadcasts of rank 0's assignment): in grad mode, once in a run
      (DDP's ``_has_rebuilt_buckets``), where ``static_graph`` is set or ``find_unused_parameters`` is not, once a
      backward pass with gradient sync has marked the parameters ready through the reducer's hooks (they fill
      ``rebuilt_params_``): so at the forward pass after the first synced backward pass, or, with ``static_graph``,
      after the second (the first iteration's ``delay_all_reduce`` marks them ready without that record);
    * the buffers (``_sync_buffers``, one broadcast): where ``will_sync_module_buffers()``: with
      ``broadcast_buffers=True`` and buffers, unless the last forward pass ran without grad mode or gradient sync; not
      with a buffer communication hook, whose communication is the user's.

    Neither with ``_delay_all_reduce_all_params`` or the Python reducer (compiled autograd): ``_pre_forward`` returns
    before them: :func:`watch` leaves such a model alone, as it does one on a group of some ranks. A torch whose DDP
    lacks one of these attributes gets nothing: the pass is not recorded. Called at each forward pass: a few attribute
    reads, the cheapest first.
    """
    try:
        rebuild = (
            not ddp._has_rebuilt_buckets  # first: after the rebuild, the rest is not read
            and synced_backwards >= (2 if ddp.static_graph else 1)
            and (ddp.static_graph or not ddp.find_unused_parameters)
            and torch.is_grad_enabled()
        )
        buffers = ddp.will_sync_module_buffers() and "buffer_hook" not in ddp.__dict__
    except AttributeError:
        return ()
    if rebuild:
        return ("buckets", "buffers") if buffers else ("buckets",)
    return ("buffers",) if buffers else ()


def _considered(ddp: Any) -> bool:
    """Whether ``ddp``'s passes may broadcast where :func:`forward_syncs` says (fixed when the model is built)."""
    try:
        return not (ddp._use_python_reducer or ddp._delay_all_reduce_all_params) and is_world(ddp.process_group)
    except AttributeError:
        return False


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
        syncs = forward_syncs(ddp, recorder.backwards - armed if self.trusted and armed is not None else 0)
        if armed is None and torch.is_grad_enabled() and ddp.require_backward_grad_sync:
            self.armed_at = recorder.backwards  # this pass prepares the reducer for a backward pass with sync
        if not syncs:
            return self.pre_forward(ddp, *inputs, **kwargs)
        with recorder.forward_pass(syncs):
            result = self.pre_forward(ddp, *inputs, **kwargs)
        if "buckets" in syncs and not ddp._has_rebuilt_buckets:
            self.trusted = False
        return result


def watch(ddp: Any, recorder: Recorder) -> None:
    """Record ``ddp``'s forward passes that broadcast (a DDP module on the default group, with the C++ reducer;
    anything else is left alone; idempotent)."""
    if (
        isinstance(ddp, DistributedDataParallel)
        and _considered(ddp)
        and not isinstance(ddp.__dict__.get("_pre_forward"), _Watched)
    ):
        ddp.__dict__["_pre_forward"] = _Watched(ddp, recorder)


def unwatch(ddp: Any) -> None:
    """Undo :func:`watch`."""
    if isinstance(getattr(ddp, "__dict__", {}).get("_pre_forward"), _Watched):
        del ddp.__dict__["_pre_forward"]
