"""The machine a benchmark runs on: the name that names its output files, and its load."""

import os
import platform
import re

__all__ = ["cpu_machine", "default_machine", "load_average", "slugify"]


def slugify(text: str) -> str:
    """Lower case, runs of anything but letters, digits and ``_`` made one ``-``: a safe file name.

    Example:
        >>> slugify("NVIDIA H100 80GB HBM3")
        'nvidia-h100-80gb-hbm3'

    """
    return re.sub(r"[^a-z0-9_]+", "-", text.lower()).strip("-_") or "machine"


def cpu_machine() -> str:
    """``cpu-<N>core-<arch>``: the name of a machine by its CPUs (what the scale benchmark measures)."""
    return f"cpu-{os.cpu_count() or 0}core-{slugify(platform.machine() or 'unknown')}"


def default_machine() -> str:
    """The CUDA device's name, slugified, where there is one; else :func:`cpu_machine`."""
    import torch  # only here: the scale benchmark, which does not need torch, uses this module too

    if torch.cuda.is_available():
        return slugify(torch.cuda.get_device_name(0))
    return cpu_machine()


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages, where the platform has them (a busy machine shows here)."""
    return [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None
