"""The per-host memory check, read from the telemetry columns of the per-rank files and the ranks' host records."""

import math

import pandas as pd

from lightning_ext._files.csv_format import HOST_USED_BYTES, RSS_BYTES, WORKERS_RSS_BYTES

__all__ = ["HOST_SHARE", "host_memory"]

RSS, WORKERS_RSS, HOST_USED = RSS_BYTES, WORKERS_RSS_BYTES, HOST_USED_BYTES
HOST_SHARE = 0.5  # "most of the host's memory"
_HOST_COLUMNS = [
    "host", "ranks", "step", "held", "memory", "share", "biggest_rank", "biggest", "biggest_rss", "biggest_workers",
    "warn",
]  # fmt: skip


def host_memory(table: pd.DataFrame, hosts: pd.DataFrame, *, share: float = HOST_SHARE) -> pd.DataFrame:
    """Per host: the most of its memory its ranks held together at one step, and the biggest rank then.

    ``held`` at a step is the sum over the host's ranks of ``rss + workers_rss``, each rank's latest reading at or
    before that step (the ranks read their memory at their own times), from the first step where every one of them
    has a reading; capped by the host's memory in use (``host_used``, the largest of the ranks' latest readings): a
    page that a rank shares with its forked workers is in each one's RSS. ``warn`` when ``held`` is more than
    ``share`` of the host's memory.

    Args:
        table: the long table, with the telemetry memory columns.
        hosts: :func:`~lightning_ext.rank_metrics.read_rank_hosts`: index ``rank``; ``host``, ``host_memory_bytes``.
        share: the share of a host's memory beyond which ``warn`` is set.

    Returns:
        One row per host, the largest share first: ``host``, ``ranks``, ``step`` (the peak), ``held``, ``memory``
        (the host's), ``share``, ``biggest_rank``, ``biggest`` (its rss + workers), ``biggest_rss``,
        ``biggest_workers``, ``warn``.

    Raises:
        ValueError: the table has no telemetry.

    Example:
        >>> table = pd.DataFrame({"rank": [0, 1, 2, 3], "step": [9] * 4,
        ...                       "telemetry/rss_bytes": [90e9, 92e9, 2e9, 2e9],
        ...                       "telemetry/workers_rss_bytes": [1e9, 0.0, 0.0, 0.0],
        ...                       "telemetry/host_used_bytes": [190e9, 190e9, 10e9, 10e9]})
        >>> hosts = pd.DataFrame({"host": ["a", "a", "b", "b"], "host_memory_bytes": [256e9] * 4},
        ...                      index=pd.Index([0, 1, 2, 3], name="rank"))
        >>> host_memory(table, hosts)[["host", "ranks", "held", "share", "biggest_rank", "warn"]]
          host  ranks          held     share  biggest_rank   warn
        0    a      2  1.830000e+11  0.714844             1   True
        1    b      2  4.000000e+09  0.015625             2  False

    """
    if RSS not in table.columns:
        raise ValueError(
            f"The table has no {RSS!r} column: the per-rank files hold no telemetry"
            " (turn it on with PerRankMetrics(telemetry=True))"
        )
    rows = table.loc[table[RSS].notna() & table["rank"].isin(hosts.index)]
    rows = rows.drop_duplicates(["rank", "step"], keep="last")  # a rank's last reading at a step
    workers = rows[WORKERS_RSS].fillna(0.0) if WORKERS_RSS in rows.columns else pd.Series(0.0, index=rows.index)
    used = rows[HOST_USED] if HOST_USED in rows.columns else pd.Series(math.inf, index=rows.index)
    readings = rows.assign(rss=rows[RSS], workers=workers, used=used.fillna(math.inf))
    # rank x step, each rank's latest reading carried forward to the later steps
    latest = {name: readings.pivot(index="step", columns="rank", values=name).sort_index().ffill() for name in
              ("rss", "workers", "used")}  # fmt: skip
    result = []
    for host, ranks in hosts["host"].groupby(hosts["host"], sort=True):
        mine = [rank for rank in ranks.index if rank in latest["rss"].columns]
        if not mine:
            continue
        rss, own_workers = latest["rss"][mine], latest["workers"][mine]
        complete = rss.notna().all(axis=1)
        held = (rss + own_workers)[complete].sum(axis=1)
        held = held.where(
            held <= latest["used"][mine][complete].max(axis=1), latest["used"][mine][complete].max(axis=1)
        )
        step = held.idxmax()
        each = (rss + own_workers).loc[step]
        biggest = int(each.sort_index().idxmax())
        memory = float(hosts.loc[hosts["host"] == host, "host_memory_bytes"].max())
        fraction = float(held[step]) / memory if memory > 0 else math.nan
        figures = [float(each[biggest]), float(rss.at[step, biggest]), float(own_workers.at[step, biggest])]
        result.append([str(host), len(mine), int(step), float(held[step]), memory, fraction, biggest, *figures])
        result[-1].append(fraction > share)
    frame = pd.DataFrame(result, columns=_HOST_COLUMNS)
    frame = frame.sort_values(["share", "host"], ascending=[False, True], kind="stable", na_position="last")
    return frame.reset_index(drop=True)
