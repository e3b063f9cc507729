"""The machine: its default name (which names the output files) and the metadata block of the results."""

import datetime
import os
import platform
import re
import sys
from typing import Any

import lightning
import torch

import lightning_ext.strategies._runtime

__all__ = ["default_machine", "load_average", "metadata", "slugify"]


def slugify(text: str) -> str:
    """Lower case, runs of anything but letters, digits and ``_`` made one ``-``: a safe file name.

    Example:
        >>> slugify("NVIDIA H100 80GB HBM3")
        'nvidia-h100-80gb-hbm3'

    """
    return re.sub(r"[^a-z0-9_]+", "-", text.lower()).strip("-_") or "machine"


def default_machine() -> str:
    """The CUDA device's name, slugified, where there is one; else ``cpu-<N>core-<arch>``."""
    if torch.cuda.is_available():
        return slugify(torch.cuda.get_device_name(0))
    return f"cpu-{os.cpu_count() or 0}core-{slugify(platform.machine() or 'unknown')}"


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages, where the platform has them (a busy machine shows here)."""
    return [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None


def metadata(
    *, machine: str, counts: dict[str, Any], notes: list[str], load_before: list[float] | None
) -> dict[str, Any]:
    """Versions, hardware, the counts used, the date, the load before and after, and the notes on the method."""
    return {
        "machine": machine,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python -m benchmarks.comm", *sys.argv[1:]]),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "lightning": lightning.__version__,
        "lightning_ext": lightning_ext.__version__,
        "patch_mode": lightning_ext.strategies._runtime.patch_mode(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "load_average_before": load_before,
        "load_average_after": load_average(),
        "cuda_device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "counts": counts,
        "notes": notes,
    }
