"""Where the ranks line up before a synced value: the time per step in Lightning's barrier or in the check.

Lightning's ``_sync_ddp`` runs a barrier before each synced value's all-reduce; with the hang checks on, a check takes
that barrier's place. Both wait for the slowest rank, so each alone carries the step's scheduling noise, but their
difference, paired fit by fit (run back to back in the same repeat), is what the check itself costs: the figure to
read beside the step-time ratio, whose noise on a small shared machine is larger than the targets.
"""

from dataclasses import dataclass

from benchmarks.comm.row_cost import Spread
from benchmarks.comm.session import SessionResult
from benchmarks.comm.training import BASELINES, SYNCED

__all__ = ["SyncCost", "sync_costs", "sync_lines"]

_CHECKED = ("hang_checks", "hang_checks_debug", "hang_checks_5_synced")


@dataclass(frozen=True)
class SyncCost:
    """The time per step spent lining up, in one session; the JSON ``sync_point`` entry.

    Attributes:
        session: the session's label.
        stock_us: stock's time per step in barriers (median over the fits, and range).
        checked_us: per checked configuration, its time per step in checks and barriers.
        extra_us: per checked configuration, its time minus its stock baseline's, fit by fit, per synced value.

    """

    session: str
    stock_us: Spread
    checked_us: dict[str, Spread]
    extra_us: dict[str, Spread]


def sync_costs(results: list[SessionResult]) -> list[SyncCost]:
    """One :class:`SyncCost` per session that measured the training step."""
    costs = []
    for result in results:
        training = result.training
        if training is None or not training.sync_ns.get("stock"):
            continue
        micros = {config: [ns / 1000 for ns in fits] for config, fits in training.sync_ns.items()}
        stock = micros["stock"]
        costs.append(
            SyncCost(
                session=result.spec.label,
                stock_us=Spread.of(stock),
                checked_us={config: Spread.of(micros[config]) for config in _CHECKED if config in micros},
                extra_us={
                    config: Spread.of(
                        [
                            (ours - base) / SYNCED.get(config, 1)
                            for ours, base in zip(micros[config], micros[BASELINES.get(config, "stock")], strict=True)
                        ]
                    )
                    for config in _CHECKED
                    if config in micros
                },
            )
        )
    return costs


def sync_lines(costs: list[SyncCost]) -> list[str]:
    """The Markdown section: one bullet per session and checked configuration."""
    lines = []
    for cost in costs:
        lines.append(f"- {cost.session}, stock: {cost.stock_us} per step in Lightning's barriers.")
        lines += [
            f"- {cost.session}, `{config}`: {cost.checked_us[config]} per step in checks (and barriers left);"
            f" **{cost.extra_us[config].median:+.1f} µs per synced value** against"
            f" `{BASELINES.get(config, 'stock')}`'s barriers, fit by fit"
            f" (range {cost.extra_us[config].low:+.1f} to {cost.extra_us[config].high:+.1f})."
            for config in cost.checked_us
        ]
    return lines
