"""What each per-rank file and rank 0's synced ``metrics.csv`` must hold for a logging script (one process).

Reductions are done the way Lightning does them, in float32 (``value * batch_size`` accumulated in order, divided by
the summed batch size), so the comparison can be exact. The parent test maps each CSV row to the (epoch, batch) it
belongs to through its ``epoch`` and ``step`` columns.
"""

from __future__ import annotations

import math
from typing import Any

import torch

F32 = torch.float32


def _forked(entry: dict[str, Any], on_step: bool) -> str:
    options = entry["options"]
    name = entry["name"]
    if options.get("on_step", False) and options.get("on_epoch", True):
        name = f"{name}_{'step' if on_step else 'epoch'}"
    if "dataloader_idx" in entry and entry.get("dataloaders", 1) > 1:
        name += f"/dataloader_idx_{entry['dataloader_idx']}"
    return name


def _reduce_name(entry: dict[str, Any]) -> str:
    return str(entry["options"].get("reduce_fx", "mean"))


def _local_epoch(entry: dict[str, Any], rank: int, epoch: int) -> torch.Tensor:
    values = entry["values"][rank][epoch]
    sizes = entry["batch_sizes"][rank][epoch] if entry["batch_sizes"] is not None else [1] * len(values)
    how = _reduce_name(entry)
    if how == "mean":
        total, count = torch.tensor(0.0, dtype=F32), 0
        for value, size in zip(values, sizes):
            total = total + torch.tensor(value, dtype=F32) * size
            count += size
        return total / count
    tensors = [torch.tensor(value, dtype=F32) for value in values]
    if how == "sum":
        total = torch.tensor(0.0, dtype=F32)
        for tensor in tensors:
            total = total + tensor
        return total
    return torch.stack(tensors).max() if how == "max" else torch.stack(tensors).min()


def _synced(entry: dict[str, Any]) -> bool:
    """Lightning syncs a value only with ``sync_dist=True`` and never a ``rank_zero_only=True`` one."""
    return bool(entry["options"].get("sync_dist", False)) and not entry["options"].get("rank_zero_only", False)


def _global_epoch(entry: dict[str, Any], world: int, epoch: int) -> torch.Tensor:
    if not _synced(entry):
        return _local_epoch(entry, 0, epoch)
    how = _reduce_name(entry)
    if how == "mean":
        totals, counts = [], 0
        for rank in range(world):
            values = entry["values"][rank][epoch]
            sizes = entry["batch_sizes"][rank][epoch] if entry["batch_sizes"] is not None else [1] * len(values)
            total = torch.tensor(0.0, dtype=F32)
            for value, size in zip(values, sizes):
                total = total + torch.tensor(value, dtype=F32) * size
            totals.append(total)
            counts += sum(sizes)
        # as Lightning's gloo sync does it: both sums averaged over ranks in float32 (the int count truncated), then
        # divided; a one-step sum / count rounds differently at world size 3
        averaged = torch.stack(totals).sum() / world
        return averaged / torch.tensor(counts / world).to(torch.int64)
    locals_ = torch.stack([_local_epoch(entry, rank, epoch) for rank in range(world)])
    return {"sum": locals_.sum(), "max": locals_.max(), "min": locals_.min()}[how]


def _global_step(entry: dict[str, Any], world: int, epoch: int, batch: int) -> torch.Tensor:
    values = torch.tensor([entry["values"][rank][epoch][batch] for rank in range(world)], dtype=F32)
    if not _synced(entry):
        return values[0]
    how = _reduce_name(entry)
    return {"mean": values.mean(), "sum": values.sum(), "max": values.max(), "min": values.min()}[how]


def expected_cells(
    script: dict[str, list[dict[str, Any]]], world: int, epochs: int, batches: int
) -> dict[Any, dict[tuple[str, int, int, str], float]]:
    """``{rank or "synced": {(kind, epoch, batch, column): value}}``; kind is ``"step"`` or ``"epoch"``.

    Values logged with ``rank_zero_only=True`` are expected in rank 0's files only.
    """
    cells: dict[Any, dict[tuple[str, int, int, str], float]] = {rank: {} for rank in range(world)}
    cells["synced"] = {}
    for stage, entries in script.items():
        for entry in entries:
            options = entry["options"]
            zero_only = options.get("rank_zero_only", False)
            for epoch in range(epochs):
                if stage == "train" and options.get("on_step", False):
                    for batch in range(batches):
                        column = _forked(entry, on_step=True)
                        synced = _global_step(entry, world, epoch, batch)
                        cells["synced"][("step", epoch, batch, column)] = float(synced)
                        for rank in range(1 if zero_only else world):
                            cells[rank][("step", epoch, batch, column)] = float(
                                torch.tensor(entry["values"][rank][epoch][batch], dtype=F32)
                            )
                if options.get("on_epoch", True):
                    column = _forked(entry, on_step=False)
                    key = (f"{stage}_epoch", epoch, -1, column)
                    cells["synced"][key] = float(_global_epoch(entry, world, epoch))
                    for rank in range(1 if zero_only else world):
                        cells[rank][key] = float(_local_epoch(entry, rank, epoch))
    return cells


def observed_cells(table: Any, batches: int, step_columns: set[str], train_epoch_columns: set[str]) -> dict:
    """The same keys, read from one CSV (a pandas DataFrame of one file)."""
    cells: dict[tuple[str, int, int, str], float] = {}
    for _, row in table.iterrows():
        epoch, step = int(row["epoch"]), int(row["step"])
        present = {column for column in table.columns if column not in ("epoch", "step") and not _missing(row[column])}
        if present & step_columns:
            kind, batch = "step", step - epoch * batches
        elif present & train_epoch_columns:
            kind, batch = "train_epoch", -1
        else:
            kind, batch = "val_epoch", -1
        for column in present:
            cells[(kind, epoch, batch, column)] = float(row[column])
    return cells


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))
