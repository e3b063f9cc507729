"""Run a fixed set of scenarios in rank pools and print every outcome as JSON (one line).

Run once as is (runtime seams) and once against a patched Lightning copy with runtime patching off (native seams):
the two outputs must be identical. Usage: python mode_outcomes.py WORKDIR
"""

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))

from tests.helpers.decision_scenarios import CKPT, ES_TABLE_3, STEP_CKPT, STEP_TABLE, TABLE_3  # noqa: E402
from tests.helpers.logging_scenarios import full_script  # noqa: E402
from tests.helpers.pool import RankPool  # noqa: E402


def _files(directory: Path) -> dict[str, str]:
    return {str(p.relative_to(directory)): p.read_text() for p in sorted(directory.rglob("*.csv"))}


def main() -> None:
    import lightning

    import lightning_ext.strategies._runtime

    work = Path(sys.argv[1])
    outcomes: dict = {"patch_mode": lightning_ext.strategies._runtime.patch_mode(), "lightning": lightning.__file__}
    pool = RankPool(3)
    try:
        for name in ("stock", "default", "mean", "majority", "rank_zero"):
            spec = "stock" if name == "stock" else ({} if name == "default" else {"checkpoint_policy": name})
            root = work / f"ckpt_{name}"
            outcomes[f"checkpoint/{name}"] = pool.run(
                "tests.helpers.decision_scenarios:fit", (str(root), spec, TABLE_3), checkpoint=CKPT, max_epochs=5
            )
            es_spec = "stock" if name == "stock" else ({} if name == "default" else {"early_stopping_policy": name})
            outcomes[f"early_stopping/{name}"] = pool.run(
                "tests.helpers.decision_scenarios:fit",
                (str(work / f"es_{name}"), es_spec, ES_TABLE_3),
                early_stopping={"monitor": "val_loss", "patience": 1},
                max_epochs=6,
            )
        step_pool = RankPool(2)
        try:
            for name, spec in (("stock", "stock"), ("default", {}), ("mean", {"checkpoint_policy": "mean"})):
                outcomes[f"step_checkpoint/{name}"] = step_pool.run(
                    "tests.helpers.decision_scenarios:fit",
                    (str(work / f"step_{name}"), spec, []),
                    checkpoint=STEP_CKPT,
                    train_table=STEP_TABLE,
                    max_epochs=5,
                )
        finally:
            step_pool.close()
        for name, spec in (("stock", "stock"), ("per_rank", {"per_rank_metrics": True})):
            root = work / f"metrics_{name}"
            results = pool.run(
                "tests.helpers.logging_scenarios:fit",
                (str(root), full_script(3)),
                strategy=spec,
                epochs=2,
                batches=3,
                val_dataloaders=2,
                timeout=120,
            )
            outcomes[f"metrics/{name}"] = {
                "callback_metrics": [r["callback_metrics"] for r in results],
                "files": _files(Path(results[0]["log_dir"])),
            }
    finally:
        pool.close()
    print("OUTCOMES " + json.dumps(outcomes, sort_keys=True))


if __name__ == "__main__":
    main()
