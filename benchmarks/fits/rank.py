"""One rank of a launched fit (``python -m benchmarks.fits.rank CONFIG PLAN OUT``), started as torchrun starts ranks.

The first statement notes the time: the parent compares it, and each rank's first batch, with its own clock before
the launch. Configurations: ``stock`` (Lightning's ``DDPStrategy``; lightning-ext is not even imported), ``unsynced``
(stock, the values logged with ``sync_dist=False``: what logging costs with no sync), ``defaults``
(``PolicyDDPStrategy()``) and ``pitfall`` (the defaults; rank 0 alone logs one more synced value at its second batch,
under ``if self.trainer.is_global_zero:``). Each fit logs ``values`` values per step; rank 0 times its steps.
"""

import time

STARTED = time.time()

import json  # noqa: E402 (after the start time: imports are part of the set-up measured)
import os  # noqa: E402
import sys  # noqa: E402
from typing import Any  # noqa: E402

import lightning as L  # noqa: E402
import torch  # noqa: E402
from lightning.pytorch.loggers import CSVLogger  # noqa: E402
from lightning.pytorch.strategies import DDPStrategy  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

CONFIG, PLAN, OUT = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
if CONFIG in ("defaults", "pitfall"):
    from lightning_ext import PolicyDDPStrategy
IMPORTED = time.time()
FEATURES, BATCH = 16, 8


class Model(L.LightningModule):
    """A two-layer regression logging ``values`` values per step (synced unless ``synced`` is off) and one more."""

    def __init__(self, values: int, synced: bool) -> None:
        super().__init__()
        self.values, self.synced = values, synced
        self.diverged: float | None = None
        self.net = torch.nn.Sequential(torch.nn.Linear(FEATURES, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        prediction = self.net(x)
        loss = torch.nn.functional.mse_loss(prediction, y)
        for index in range(self.values):
            self.log(f"train_loss_{index}", loss + index, on_step=True, on_epoch=False, sync_dist=self.synced)
        self.log("train_mae", (prediction - y).abs().mean(), on_step=True, on_epoch=False)
        if CONFIG == "pitfall" and self.trainer.is_global_zero and batch_idx == 1:
            self.diverged = time.time()
            self.log("rank_zero_only_loss", loss, sync_dist=True)  # the founding pitfall
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Clock(L.Callback):
    """Each batch's start: wall time for the first (the set-up's end), monotonic for the steps."""

    def __init__(self) -> None:
        self.first: float | None = None
        self.starts_ns: list[int] = []

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if self.first is None:
            self.first = time.time()
        self.starts_ns.append(time.perf_counter_ns())


def _timed(owner: Any, name: str, spent: dict[str, float], key: str | None = None) -> None:
    """Add the wall time of every call of ``owner.name`` to ``spent[name]`` (the set-up's profile; a name that this
    version of lightning-ext does not have is left out, so that an older checkout can be profiled alike)."""
    original = getattr(owner, name, None)
    if original is None:
        return

    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            spent[key or name] = spent.get(key or name, 0.0) + time.perf_counter() - started

    setattr(owner, name, timed)


def _profile(spent: dict[str, float]) -> None:
    """Time the parts of set-up: the process group (stock's), and lightning-ext's own where it runs."""
    _timed(DDPStrategy, "setup_environment", spent)
    if CONFIG in ("defaults", "pitfall"):
        from lightning_ext import _collective
        from lightning_ext._checks import guard
        from lightning_ext._stall import monitor
        from lightning_ext._watch import watchdog
        from lightning_ext.strategies import mixin

        _timed(mixin, "agree", spent)  # the set-up's one exchange (each is looked up by name where it is called)
        _timed(guard.HangGuard, "start", spent)
        _timed(guard, "open_channel", spent)  # the channel, its pairs connected and its outcome agreed
        _timed(_collective.CheckChannel, "__init__", spent, "CheckChannel.__init__")  # before issue 39: the pairs
        _timed(watchdog.Watchdog, "__init__", spent, "Watchdog.__init__")
        _timed(monitor, "start", spent, "monitor.start")


def main() -> None:
    world_size, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    torch.set_num_threads(1)
    spent: dict[str, float] = {}
    _profile(spent)
    fits = []
    for values in PLAN["values"]:
        batches = PLAN["skip"] + PLAN["steps"] + 1
        strategy = PolicyDDPStrategy() if CONFIG in ("defaults", "pitfall") else DDPStrategy()
        clock = Clock()
        called = time.time()
        trainer = L.Trainer(
            accelerator="cpu",
            devices=world_size,
            strategy=strategy,
            max_epochs=1,
            max_steps=batches,
            logger=CSVLogger(os.path.join(OUT, "logs")),
            log_every_n_steps=1,
            callbacks=[clock],
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
            limit_val_batches=0,
        )
        generator = torch.Generator().manual_seed(0)
        size = world_size * batches * BATCH
        data = TensorDataset(
            torch.randn(size, FEATURES, generator=generator), torch.randn(size, 1, generator=generator)
        )
        model = Model(values, CONFIG != "unsynced")
        error: dict[str, Any] = {}
        try:
            trainer.fit(model, DataLoader(data, batch_size=BATCH))
        except Exception as raised:
            error = {"error": type(raised).__name__, "message": str(raised), "at": time.time()}
        if error and CONFIG != "pitfall":
            raise RuntimeError(error["message"])
        steps = [b - a for a, b in zip(clock.starts_ns, clock.starts_ns[1:], strict=False)][PLAN["skip"] :]
        fits.append(
            {
                "values": values,
                "called": called,
                "first_batch": clock.first,
                "step_ns": steps,
                "diverged": model.diverged,
            }
            | error
        )
        os.environ["WORLD_SIZE"] = str(world_size)  # LightningEnvironment.teardown removes it after every fit
    found = {"rank": rank, "started": STARTED, "imported": IMPORTED, "fits": fits, "spent": spent}
    with open(os.path.join(OUT, f"rank-{rank}.json"), "w") as handle:
        json.dump(found, handle)
    if torch.distributed.is_initialized():  # every configuration alike, after the measurements
        # rank 0 hosts the store: a rank still tearing down when rank 0 exits aborted ("terminate called without an
        # active exception", exit -6, stock as well), so the ranks leave together and close the group first
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
