"""The names of ``torch.distributed``'s functions by what they ask of the ranks: one list for the hang checks (which
count each call of a collective), the static check (which finds them in source) and the benchmarks (which count every
exchange). Where a name is looked up, one that this torch lacks is skipped."""

__all__ = ["COLLECTIVES", "POINT_TO_POINT"]

# every rank of the group must call each of these, in the same order. Torch 2.13 deprecates `all_gather_into_tensor`
# and `reduce_scatter_tensor` for the `_single` names; `_all_gather_base` and `_reduce_scatter_base` are older, private
# names still found in user code. A wrapper of ``torch.distributed``'s attributes sees the call a user makes, not the
# one a listed function makes inside torch (its module's own name): one call counts once.
COLLECTIVES = (
    "_all_gather_base",
    "_reduce_scatter_base",
    "all_gather",
    "all_gather_coalesced",
    "all_gather_into_tensor",
    "all_gather_object",
    "all_gather_single",
    "all_reduce",
    "all_reduce_coalesced",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "broadcast",
    "broadcast_object_list",
    "gather",
    "gather_object",
    "monitored_barrier",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_single",
    "reduce_scatter_tensor",
    "scatter",
    "scatter_object_list",
)
# one rank sends, another receives: not symmetric, so not counted by the hang checks
POINT_TO_POINT = ("batch_isend_irecv", "irecv", "isend", "recv", "recv_object_list", "send", "send_object_list")
