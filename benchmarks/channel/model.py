"""The alpha-beta model on paper: one hang check between hosts against stock's NCCL barrier and all-reduce per value.

Every parameter is cited where it is defined; ``o`` (Python's time per round of a check) is measured here by
``python -m benchmarks.channel``. docs/hang-checks.md ("Cost at scale") quotes the table through the figures script.
"""

import math

from lightning_ext._exchange_rounds import exchange_partners

__all__ = [
    "ALPHA_US",
    "FAST_ALPHA_US",
    "GLOO_RING",
    "GPUS_PER_HOST",
    "NCCL_LATENCY_US",
    "check_us",
    "model_rows",
    "nccl_allreduce_us",
    "ring_check_us",
    "stock_us",
]

# One message between hosts through gloo over TCP: 263 µs, the p50 of gloo's allreduce_ring_chunked of one element on
# 4 machines with 40GbE (gloo's README, "Example output"), over its 2 (W - 1) = 6 messages one after the other.
GLOO_RING = (263.0, 6)  # (µs, messages one after the other)
ALPHA_US = GLOO_RING[0] / GLOO_RING[1]
# Not a published measurement: a network about three times faster than ALPHA_US's, to show how the verdict moves with
# alpha (the docs say so where they quote it).
FAST_ALPHA_US = 15.0
GPUS_PER_HOST = 8
# NCCL's own latency model (NVIDIA/nccl src/graph/tuning.cc, 2.8: baseLat, hwLat), tree algorithm with the LL
# protocol, which it picks for a few bytes: 4.4 µs, then per step 0.52 µs x 1.8 over NVLink inside a host (more than
# one host) and 5.0 µs between hosts, twice (up, then down) over the tree's depth. It is below what nccl-tests
# measures (an 8-byte all_reduce over InfiniBand across hosts: 40-47 µs, NVIDIA/nccl-tests#182): it favours stock.
NCCL_LATENCY_US = (4.4, 0.52 * 1.8, 5.0)  # (base, per NVLink step across hosts, per network step)
_NCCL_BASE_US, _NCCL_NVLINK_US, _NCCL_NET_US = NCCL_LATENCY_US


def nccl_allreduce_us(world_size: int) -> float:
    """One all-reduce of a few bytes over NCCL (its tree, by NCCL's own model): the host waits that long per call."""
    per_host = min(world_size, GPUS_PER_HOST)
    hosts = max(1, world_size // GPUS_PER_HOST)
    inside = (per_host - 1) * (_NCCL_NVLINK_US if hosts > 1 else 0.52)
    return _NCCL_BASE_US + 2 * (inside + math.log2(hosts) * _NCCL_NET_US)


def stock_us(world_size: int, values: int) -> float:
    """Stock's synced logging per step: a barrier and an all-reduce per value (the barrier waits for the all-reduce
    before it), and the SIGTERM flag's broadcast: ``2N + 1`` NCCL calls one after the other."""
    return (2 * values + 1) * nccl_allreduce_us(world_size)


def check_us(world_size: int, round_us: float, alpha_us: float = ALPHA_US) -> float:
    """One check: its rounds one after the other, each a message between hosts and Python's time per round."""
    return len(exchange_partners(0, world_size)) * (alpha_us + round_us)


def ring_check_us(world_size: int, round_us: float, alpha_us: float = ALPHA_US) -> float:
    """The same check as one gloo all-reduce on a world group: gloo's ring, 2 (W - 1) messages one after the other
    (gloo/allreduce.cc), and Python once."""
    return 2 * (world_size - 1) * alpha_us + round_us


def model_rows(
    round_us: float,
    sizes: tuple[int, ...] = (8, 64, 1024, 4096),
    values: tuple[int, ...] = (1, 5, 20),
    alpha_us: float = ALPHA_US,
) -> list[dict[str, float]]:
    """Per step, by world size and synced values: stock's time, and the coalesced sync's (the check, then one NCCL
    all-reduce of the values), with the check as recursive doubling (chosen) and as gloo's ring (not chosen)."""
    rows = []
    for size in sizes:
        for count in values:
            stock = stock_us(size, count)
            ours = check_us(size, round_us, alpha_us) + nccl_allreduce_us(size)
            ring = ring_check_us(size, round_us, alpha_us) + nccl_allreduce_us(size)
            rows.append({"world_size": size, "values": count, "rounds": len(exchange_partners(0, size)),
                         "stock_us": stock, "ours_us": ours, "ring_us": ring})  # fmt: skip
    return rows
