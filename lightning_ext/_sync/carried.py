"""A hook's step values carried by their check: reduced within the check's own exchange, with no collective.

CPU values on gloo that fit the check's message ride it: each round of its recursive doubling reduces them in the lower
rank's operand order, so every rank ends with the same bits; where the check disagrees they are never read
(docs/synced-logging.md, "How the values ride the check").
"""

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from lightning_ext._exchange_rounds import CARRY_BYTES

__all__ = ["CarriedPacks"]

_DTYPES: dict[torch.dtype, Any] = {
    torch.float32: np.float32,
    torch.float64: np.float64,
    torch.int32: np.int32,
    torch.int64: np.int64,
}
# a mean sums here; the coalesced sync divides by the world size afterwards, as Lightning's gloo sync does. numpy's
# maximum and minimum keep a NaN, as torch.max and torch.min do.
_UFUNCS: dict[str, Callable[..., Any]] = {"sum": np.add, "mean": np.add, "max": np.maximum, "min": np.minimum}

Pack = tuple[Tensor, str]  # a 1-D packed tensor and the reduce op of its values


def _canonical(result: Any, lower: Any, higher: Any, ufunc: Callable[..., Any]) -> None:
    """The bits IEEE leaves to the machine, made the same on both partners: a NaN's sign and payload (which operand's
    NaN an addition keeps may depend on numpy's loop), and the sign of a max or min of two zeros (+0 is the larger)."""
    if ufunc is not np.add:
        zeros = (lower == 0) & (higher == 0)
        if zeros.any():
            sign = 1 if ufunc is np.maximum else -1  # max(-0, +0) = -0 + +0 = +0; min = -(+0 + -0) = -0
            result[zeros] = sign * (sign * lower[zeros] + sign * higher[zeros])
    np.copyto(result, np.nan, where=np.isnan(result))


def _size(tensor: Tensor) -> int:
    """The bytes a pack takes in the carried area, rounded up to 8 (each pack starts aligned)."""
    return -(-tensor.numel() * tensor.element_size() // 8) * 8


class CarriedPacks:
    """The packs of one hook's step values, in the byte area a check carries (``_exchange_rounds.Carried``).

    Args:
        packs: each 1-D packed tensor with its reduce op; they must :meth:`fit`.

    """

    def __init__(self, packs: Sequence[Pack]) -> None:
        self.data = np.zeros(CARRY_BYTES, dtype=np.uint8)
        self.layout = tuple(
            (reduce_op, str(tensor.dtype).removeprefix("torch."), tensor.numel()) for tensor, reduce_op in packs
        )
        self._segments: list[tuple[Tensor, int, int, Any, Callable[..., Any]]] = []
        offset = 0
        for tensor, reduce_op in packs:
            dtype, end = _DTYPES[tensor.dtype], offset + tensor.numel() * tensor.element_size()
            self.data[offset:end].view(dtype)[:] = tensor.detach().numpy()
            self._segments.append((tensor, offset, end, dtype, _UFUNCS[reduce_op]))
            offset += _size(tensor)

    @staticmethod
    def fit(packs: Sequence[Pack]) -> bool:
        """Whether ``packs`` can ride a check: CPU tensors of a carried dtype and op, together within its area."""
        return (
            all(
                tensor.device.type == "cpu" and tensor.dtype in _DTYPES and reduce_op in _UFUNCS
                for tensor, reduce_op in packs
            )
            and sum(_size(tensor) for tensor, _ in packs) <= CARRY_BYTES
        )

    def combine(self, theirs: Any, first: bool) -> None:
        """Reduce a partner's running values into this rank's (``first``: this rank's operand comes first)."""
        with np.errstate(all="ignore"):  # inf - inf and a float32 overflow are what torch gives, silently
            self._combine(theirs, first)

    def _combine(self, theirs: Any, first: bool) -> None:
        for _, start, end, dtype, ufunc in self._segments:
            mine, other = self.data[start:end].view(dtype), theirs[start:end].view(dtype)
            lower, higher = (mine, other) if first else (other, mine)
            result = ufunc(lower, higher)
            if result.dtype.kind == "f":
                _canonical(result, lower, higher, ufunc)
            mine[:] = result

    def unpack(self) -> None:
        """Write the reduced values back into the packed tensors (once the check completed and agreed)."""
        for tensor, start, end, dtype, _ in self._segments:
            tensor.copy_(torch.from_numpy(self.data[start:end].view(dtype)))
