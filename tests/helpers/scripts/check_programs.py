"""Programs of the static check's corpus (tests/check/corpus), run in one launch, one after another.

Usage: ``python check_programs.py OUT_DIR DEVICES PROGRAM [PROGRAM ...]`` with each PROGRAM a corpus file. A program
defines ``Model`` (a LightningModule) and may define Callback subclasses (each is given to the Trainer) and ``RUN``:
``{"stage": "fit" | "validate" | "test", "strategy": {PolicyDDPStrategy's options}}`` (default: fit, no options).
Each runs under a default ``Trainer`` (sanity check, checkpointing and logger on) with ``PolicyDDPStrategy`` and 2
batches per stage, and every rank writes ``OUT_DIR/<program>.<rank>.json``: ``error`` (the class name or null),
``message``. Between two programs every rank leaves the process group and the next run starts a new one (on the next
port of ``PORTS``), so a rank that a program left blocked in a collective is released before the next.
"""

import gc
import importlib.util
import inspect
import json
import os
import sys
import traceback

import lightning as L
import torch.distributed as dist

from lightning_ext import PolicyDDPStrategy


def run(path: str, out: str, devices: int) -> dict[str, object]:
    name = os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(f"corpus_{name}", path)
    assert spec is not None and spec.loader is not None
    program = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(program)
    settings = getattr(program, "RUN", {})
    callbacks = [
        value()
        for value in vars(program).values()
        if inspect.isclass(value) and issubclass(value, L.Callback) and value.__module__ == program.__name__
    ]
    trainer = L.Trainer(
        accelerator="cpu",
        devices=devices,
        strategy=PolicyDDPStrategy(**settings.get("strategy", {})),
        max_epochs=1,
        limit_train_batches=2,
        limit_val_batches=2,
        limit_test_batches=2,
        callbacks=callbacks,
        default_root_dir=os.path.join(out, name),
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    outcome: dict[str, object] = {"error": None, "message": None}
    try:
        getattr(trainer, settings.get("stage", "fit"))(program.Model())
    except Exception as error:
        outcome = {"error": type(error).__name__, "message": str(error), "traceback": traceback.format_exc()}
    return {**outcome, "rank": trainer.global_rank}


def main() -> None:
    out, devices, programs = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    ports = os.environ["PORTS"].split(",")
    for path, port in zip(programs, ports, strict=False):
        os.environ["MASTER_PORT"] = port
        outcome = run(path, out, devices)
        name = os.path.splitext(os.path.basename(path))[0]
        with open(os.path.join(out, f"{name}.{outcome['rank']}.json"), "w") as handle:
            json.dump(outcome, handle)
        if dist.is_initialized():
            dist.destroy_process_group()
        gc.collect()  # the group's last references go: its connections close, which releases a rank that the program
        # left blocked in a collective (it then raises the same error)


if __name__ == "__main__":
    main()
