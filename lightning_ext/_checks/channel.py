"""The hang checks' channel, opened at set-up within ``check_channel_timeout``: on every rank, or on none.

Every rank learns the outcome through the store, so where a pair cannot connect every rank warns alike and goes on
without the checks, or raises one ``CheckChannelError`` (docs/multi-node.md, "What the checks need of the network").
"""

import json
import os
import re
import warnings
from collections.abc import Sequence
from typing import Any

from lightning_ext import _collective, errors
from lightning_ext._network import IFNAME_VARIABLE, channel_place
from lightning_ext.errors import mark_joint

__all__ = ["open_channel"]

_MARGIN = 30.0  # seconds beyond the timeout a rank waits for every rank's outcome (their set-ups started apart)


def open_channel(
    store: Any, rank: int, routes: Sequence[str | None], hosts: Sequence[str], timeout: float, required: bool
) -> _collective.CheckChannel | None:
    """This rank's channel, connected; ``None`` (with a warning on every rank) if some pair could not connect in time.

    Args:
        store: a store under the run's namespace.
        rank: this rank.
        routes: every rank's route to ``MASTER_ADDR`` (the local address it leaves from), in rank order.
        hosts: every rank's host name, in rank order.
        timeout: seconds every pair may take to connect.
        required: the run cannot go on without the checks (``uneven_batches="truncate"``): raise instead of warning.

    Raises:
        CheckChannelError: on every rank, where ``required`` and some pair could not connect.

    """
    place = channel_place(rank, routes, hosts)
    store.set(f"channel/place/{rank}", json.dumps([hosts[rank], place.describe()]))
    channel = _collective.CheckChannel(rank, len(hosts))
    failure = None
    try:
        channel.connect(store, place, timeout)
    except RuntimeError as error:
        channel.close()
        reason = re.sub(r"\[[^\]]*\.(cc|cpp|h):\d+\] ?", "", str(error).strip().splitlines()[0])[:200]
        mine = f"rank {rank} ({hosts[rank]}, {place.describe()})"
        if channel.partner is None:  # its device: the interface or address cannot be bound here
            failure = f"{mine} could not listen there: {reason}"
        else:
            theirs = _place_of(store, channel.partner) or f"rank {channel.partner}"
            failure = f"{mine} could not connect to {theirs}: {reason}"
    outcome = _collective.agree_in_store(store, "channel", rank, len(hosts), failure, timeout + _MARGIN)
    if outcome is None:
        return channel
    channel.close()
    message = _message(outcome, timeout, required)
    if required:
        raise mark_joint(errors.CheckChannelError(message))
    warnings.warn(message, errors.CheckChannelWarning, stacklevel=2)
    return None


def _place_of(store: Any, rank: int) -> str | None:
    """``rank 1 (host-b, address 10.0.0.2 on interface eth0)``, as that rank published it (if it got that far)."""
    key = f"channel/place/{rank}"
    if not store.check([key]):
        return None
    host, place = json.loads(store.get(key))
    return f"rank {rank} ({host}, {place})"


def _message(outcome: str, timeout: float, required: bool) -> str:
    """The warning or error every rank shows: what failed where, what the channel binds, and what to do."""
    chosen = os.environ.get(IFNAME_VARIABLE)
    setting = f"{IFNAME_VARIABLE}={chosen} here" if chosen else f"{IFNAME_VARIABLE} is unset here"
    master = _collective.store_host() or "unknown"
    ending = (
        "uneven_batches='truncate' needs the checks, so the run stops here."
        if required
        else "The run goes on without hang checks (as with hang_checks=False)."
    )
    return (
        f"lightning-ext's hang checks could not connect their channel within {timeout:g} s: {outcome}.\n"
        f"The channel (gloo over TCP, beside the training group) binds the interface that reaches MASTER_ADDR"
        f" ({master}) unless {IFNAME_VARIABLE} names one ({setting}).\n"
        f"Set {IFNAME_VARIABLE} to the interface that reaches the other hosts, allow more time with"
        f" check_channel_timeout, or pass hang_checks=False. {ending}"
    )
