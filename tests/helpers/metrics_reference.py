"""What each per-rank file and rank 0's synced ``metrics.csv`` must hold for a logging script (one process).

Written from Lightning's and torchmetrics' own reduction code, without lightning_ext. Reductions are done the way
Lightning does them, in float32 (``value * batch_size`` accumulated in order, divided by the summed batch size), so the
comparison can be exact:

* a tensor logged with ``reduce_fx="mean"`` is weighted by its batch size; synced on gloo, Lightning averages the
  summed value and the batch-size count over the ranks; stock Lightning truncates the integer count (README, "Noticed
  upstream"), lightning-ext's strategies average it as a float32, and the reference does the latter; each rank's own
  value is the plain local weighted mean;
* a ``torchmetrics.MeanMetric`` drops NaN values (its default ``nan_strategy="warn"``) and is always synced by
  torchmetrics itself (states summed over ranks), whatever ``sync_dist`` says;
* a synced ``max``/``min`` with a NaN on some rank is left unchecked (:data:`UNSPECIFIED`): gloo's MAX/MIN all-reduce
  keeps or drops a NaN depending on which rank holds it (seen here: ``[1, nan, 5]`` reduces to 1.0 under MAX, and
  ``[nan, 1]`` to NaN). The per-rank files are checked in full.

The parent test maps each CSV row to the (epoch, batch) it belongs to through its ``epoch`` and ``step`` columns.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

import torch

F32 = torch.float32
UNSPECIFIED = "unspecified: gloo MAX/MIN all-reduce of a NaN"
Cells = dict[tuple[str, int, int, str], Any]


def forked(entry: dict[str, Any], on_step: bool) -> str:
    options = entry["options"]
    name = entry["name"]
    if options.get("on_step", False) and options.get("on_epoch", True):
        name = f"{name}_{'step' if on_step else 'epoch'}"
    if "dataloader_idx" in entry and entry.get("dataloaders", 1) > 1:
        name += f"/dataloader_idx_{entry['dataloader_idx']}"
    return name


def _reduce_name(entry: dict[str, Any]) -> str:
    return str(entry["options"].get("reduce_fx", "mean"))


def _is_torchmetric(entry: dict[str, Any]) -> bool:
    return entry.get("kind") == "torchmetric"


def _values_and_sizes(entry: dict[str, Any], rank: int, epoch: int) -> tuple[list[float], list[int]]:
    values = entry["values"][rank][epoch]
    sizes = entry["batch_sizes"][rank][epoch] if entry["batch_sizes"] is not None else [1] * len(values)
    return values, sizes


def _weighted_sum(entry: dict[str, Any], rank: int, epoch: int) -> tuple[torch.Tensor, int]:
    """Lightning's accumulation for a mean: ``value * batch_size`` summed in order, and the summed batch size."""
    values, sizes = _values_and_sizes(entry, rank, epoch)
    total = torch.tensor(0.0, dtype=F32)
    for value, size in zip(values, sizes):
        total = total + torch.tensor(value, dtype=F32) * size
    return total, sum(sizes)


def _metric_states(entry: dict[str, Any], rank: int, epoch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``MeanMetric``'s ``mean_value`` and ``weight`` on this rank: NaN values (and their weights) are dropped."""
    values, sizes = _values_and_sizes(entry, rank, epoch)
    total, weight = torch.tensor(0.0, dtype=F32), torch.tensor(0.0, dtype=F32)
    for value, size in zip(values, sizes):
        if math.isnan(value):
            continue
        total = total + torch.tensor(value, dtype=F32) * torch.tensor(float(size), dtype=F32)
        weight = weight + torch.tensor(float(size), dtype=F32)
    return total, weight


def _local_epoch(entry: dict[str, Any], rank: int, epoch: int) -> torch.Tensor:
    if _is_torchmetric(entry):
        total, weight = _metric_states(entry, rank, epoch)
        return total / weight
    how = _reduce_name(entry)
    if how == "mean":
        total, count = _weighted_sum(entry, rank, epoch)
        return total / count
    tensors = [torch.tensor(value, dtype=F32) for value in entry["values"][rank][epoch]]
    if how == "sum":
        total = torch.tensor(0.0, dtype=F32)
        for tensor in tensors:
            total = total + tensor
        return total
    return torch.stack(tensors).max() if how == "max" else torch.stack(tensors).min()


def _synced(entry: dict[str, Any]) -> bool:
    """Lightning syncs a tensor only with ``sync_dist=True`` and not ``rank_zero_only``; torchmetrics always syncs."""
    if _is_torchmetric(entry):
        return True
    return bool(entry["options"].get("sync_dist", False)) and not entry["options"].get("rank_zero_only", False)


def _extreme(how: str, per_rank: torch.Tensor) -> Any:
    if len(per_rank) > 1 and bool(torch.isnan(per_rank).any()):
        return UNSPECIFIED
    return per_rank.max() if how == "max" else per_rank.min()


def _global_epoch(entry: dict[str, Any], world: int, epoch: int) -> Any:
    if not _synced(entry):
        return _local_epoch(entry, 0, epoch)
    if _is_torchmetric(entry):
        states = [_metric_states(entry, rank, epoch) for rank in range(world)]
        return torch.stack([s[0] for s in states]).sum() / torch.stack([s[1] for s in states]).sum()
    how = _reduce_name(entry)
    if how == "mean":
        sums = [_weighted_sum(entry, rank, epoch) for rank in range(world)]
        # as the gloo sync does it under lightning-ext's strategies: both sums averaged over ranks in float32 (the
        # count as a float: stock Lightning would truncate it), then divided; a one-step sum / count rounds
        # differently at world size 3
        averaged = torch.stack([total for total, _ in sums]).sum() / world
        return averaged / (torch.tensor(float(sum(count for _, count in sums)), dtype=F32) / world)
    locals_ = torch.stack([_local_epoch(entry, rank, epoch) for rank in range(world)])
    return locals_.sum() if how == "sum" else _extreme(how, locals_)


def _global_step(entry: dict[str, Any], world: int, epoch: int, batch: int) -> Any:
    values = torch.tensor([entry["values"][rank][epoch][batch] for rank in range(world)], dtype=F32)
    if not _synced(entry):
        return values[0]
    how = _reduce_name(entry)
    if how in ("max", "min"):
        return _extreme(how, values)
    return values.mean() if how == "mean" else values.sum()


def _plain(value: Any) -> Any:
    return value if isinstance(value, str) else float(value)


def expected_cells(script: dict[str, list[dict[str, Any]]], world: int, epochs: int, batches: int) -> dict[Any, Cells]:
    """``{rank or "synced": {(kind, epoch, batch, column): value}}``; kind is ``"step"``, ``"train_epoch"`` or
    ``"val_epoch"``.

    Values logged with ``rank_zero_only=True`` are expected in rank 0's files only.
    """
    cells: dict[Any, Cells] = {rank: {} for rank in range(world)}
    cells["synced"] = {}
    for stage, entries in script.items():
        for entry in entries:
            options = entry["options"]
            zero_only = options.get("rank_zero_only", False)
            for epoch in range(epochs):
                if stage == "train" and options.get("on_step", False):
                    for batch in range(batches):
                        column = forked(entry, on_step=True)
                        synced = _global_step(entry, world, epoch, batch)
                        cells["synced"][("step", epoch, batch, column)] = _plain(synced)
                        for rank in range(1 if zero_only else world):
                            cells[rank][("step", epoch, batch, column)] = float(
                                torch.tensor(entry["values"][rank][epoch][batch], dtype=F32)
                            )
                if options.get("on_epoch", True):
                    column = forked(entry, on_step=False)
                    key = (f"{stage}_epoch", epoch, -1, column)
                    cells["synced"][key] = _plain(_global_epoch(entry, world, epoch))
                    for rank in range(1 if zero_only else world):
                        cells[rank][key] = float(_local_epoch(entry, rank, epoch))
    return cells


def observed_cells(table: Any, batches: int, step_columns: set[str], train_epoch_columns: set[str]) -> Cells:
    """The same keys, read from one CSV (a pandas DataFrame of one file; a logged NaN reads as missing there)."""
    rows = [
        {column: None if _missing(row[column]) else float(row[column]) for column in table.columns}
        for _, row in table.iterrows()
    ]
    return _cells(rows, batches, step_columns, train_epoch_columns)


def file_cells(path: Path, batches: int, step_columns: set[str], train_epoch_columns: set[str]) -> Cells:
    """The same keys, read from the CSV file itself: an empty cell is missing, ``nan``/``inf`` are values."""
    with open(path, newline="") as handle:
        rows = [
            {column: None if cell == "" else float(cell) for column, cell in row.items()}
            for row in csv.DictReader(handle)
        ]
    return _cells(rows, batches, step_columns, train_epoch_columns)


def comparable(cells: Cells, expected: Cells) -> Cells:
    """NaN-safe cells for ``==``; where the expectation is :data:`UNSPECIFIED`, any observed value stands for it."""
    plain: Cells = {}
    for key, value in cells.items():
        if expected.get(key) == UNSPECIFIED:
            plain[key] = UNSPECIFIED
        elif isinstance(value, float) and math.isnan(value):
            plain[key] = "nan"
        else:
            plain[key] = value
    return plain


def _cells(rows: list[dict[str, float | None]], batches: int, step_columns: set[str], epoch_columns: set[str]) -> Cells:
    cells: Cells = {}
    for row in rows:
        epoch, step = int(row["epoch"]), int(row["step"])  # type: ignore[arg-type]
        present = {column for column, value in row.items() if column not in ("epoch", "step") and value is not None}
        if present & step_columns:
            kind, batch = "step", step - epoch * batches
        elif present & epoch_columns:
            kind, batch = "train_epoch", -1
        else:
            kind, batch = "val_epoch", -1
        for column in present:
            cells[(kind, epoch, batch, column)] = row[column]
    return cells


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))
