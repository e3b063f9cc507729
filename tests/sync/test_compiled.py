"""A ``torch.compile``'d module that logs synced values trains under lightning-ext (Lightning #21837), launched.

Stock Lightning 2.5/2.6 fails there with ``InternalTorchDynamoError`` (dynamo cannot trace ``LightningModule.log``);
lightning-ext runs it eagerly, as Lightning's master does. The reference is the same script, not compiled, under stock
``DDPStrategy``: every step's synced loss must be the same.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.jobs import REPO, Job, clean_env

pytestmark = (
    pytest.mark.ci
)  # launched jobs: minutes of start-up CPU on 2 cores, so make test leaves them to CI (make test-ci)

SCRIPT = REPO / "tests" / "helpers" / "scripts" / "compiled_job.py"
TIMEOUT = 240.0


def run(kind: str, out: Path) -> tuple[dict[str, Any], str]:
    """Rank 0's outcome (empty if it wrote none), and the job's output."""
    out.mkdir()
    job = Job([sys.executable, str(SCRIPT), kind, str(out)], clean_env(), out / "job.log")
    code = job.wait(TIMEOUT)
    job.kill()
    assert code is not None, f"{kind} hung:\n{job.output()}"
    path = out / "outcome.json"
    return (json.loads(path.read_text()) if path.exists() else {}), job.output()


@pytest.mark.slow
@pytest.mark.timeout(2 * TIMEOUT + 60)
def test_a_compiled_module_trains_with_synced_logging_as_the_uncompiled_one(tmp_path: Path) -> None:
    ours, output = run("ours", tmp_path / "ours")
    reference, reference_output = run("eager", tmp_path / "eager")
    assert ours.get("error", "no outcome") is None, (ours, output)
    assert reference.get("error", "no outcome") is None, (reference, reference_output)
    assert len(ours["losses"]) == 8 and ours["losses"] == reference["losses"]


@pytest.mark.stock
@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT + 60)
def test_stock_lightning_fails_on_the_same_compiled_module(tmp_path: Path) -> None:
    stock, output = run("stock", tmp_path / "stock")
    # rank 0 writes its outcome unless Lightning's launcher ended it first, when rank 1 failed: then its output says
    assert stock.get("error", "InternalTorchDynamoError") == "InternalTorchDynamoError", stock
    assert "InternalTorchDynamoError: AttributeError: 'method' object has no attribute '__dict__'" in output
