"""The GPU part, only where ``torch.cuda.is_available()``: the same decision subjects on CUDA tensors.

* ``nccl/cuda W=1``: one rank on the GPU with an NCCL process group. The policies make no collective at world size 1
  (a local decision; the monitored value still comes from the device), while stock ``reduce_boolean_decision`` still
  puts its flag on the device and runs its ``barrier`` and ``all_reduce``.
* ``gloo/cuda W=2``: two ranks sharing ``cuda:0`` with gloo, which all-reduces CUDA tensors through host memory. If
  this torch's gloo refuses CUDA tensors, :func:`probe` says why and the session is reported as skipped.

Training-step time is measured on CPU ranks only (the per-rank cost is host-side work in the logger connector). On
a machine without CUDA, :func:`gpu_sessions` plans nothing and returns the note that the command prints.
"""

import torch
import torch.distributed as dist

from benchmarks.comm.plan import SessionSpec

__all__ = ["gpu_sessions", "probe", "rank_device"]


def gpu_sessions() -> tuple[list[SessionSpec], str]:
    """The GPU sessions to run here (none without CUDA), and a line saying what was done or why not."""
    if not torch.cuda.is_available():
        return [], "GPU part skipped: torch.cuda.is_available() is False on this machine."
    name = torch.cuda.get_device_name(0)
    sessions = [SessionSpec("nccl", "cuda", 1), SessionSpec("gloo", "cuda", 2)]
    return sessions, f"GPU part on {name}: NCCL at world size 1, and gloo with CUDA tensors at world size 2 (one GPU)."


def rank_device(kind: str) -> torch.device:
    """The device of a rank of a ``"cpu"`` or ``"cuda"`` session (every CUDA rank uses ``cuda:0``, made current).

    Raises:
        ValueError: ``kind`` is neither ``"cpu"`` nor ``"cuda"``.

    """
    if kind == "cpu":
        return torch.device("cpu")
    if kind == "cuda":
        torch.cuda.set_device(0)
        return torch.device("cuda", 0)
    raise ValueError(f"device must be 'cpu' or 'cuda', got {kind!r}")


def probe(device: torch.device) -> str | None:
    """``None`` if the process group can all-reduce a tensor on ``device``; else why not (the session is skipped)."""
    try:
        tensor = torch.ones(2, dtype=torch.int64, device=device)
        dist.all_reduce(tensor)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    except (RuntimeError, ValueError) as exc:
        return f"{dist.get_backend()} cannot all-reduce a {device.type} tensor here: {type(exc).__name__}: {exc}"
    return None
