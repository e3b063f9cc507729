"""A user's job written for the standalone package (``import pytorch_lightning as pl``), launched as users launch it.

``tests/helpers/scripts/pytorch_lightning_user.py`` is run as ``python <script> <out>``: ``Trainer(devices=2)`` starts
the second rank itself. Nothing in the script is renamed or generated: it is what a ``pytorch_lightning`` user writes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.pytorch_lightning_job import RUN_TIMEOUT, check_job, start

pytestmark = pytest.mark.slow


def test_a_pytorch_lightning_users_job_runs_the_policies_the_names_the_rank_files_and_the_hang_checks(
    tmp_path: Path,
) -> None:
    job = start(tmp_path, PITFALL="log_dir")
    code = job.wait(RUN_TIMEOUT)
    job.kill()
    check_job(tmp_path, code, job.output(tail=40000))
