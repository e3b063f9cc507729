"""What the user runs and reads: ``lightning-ext check`` and ``python -m lightning_ext.check``, their lines, JSON,
exit codes, errors; and that the check loads neither Lightning nor torch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.check_corpus import CORPUS, expected_findings, programs

REPO = Path(__file__).resolve().parents[2]


def _run(*arguments: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *arguments], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


def test_both_commands_print_ruff_style_lines_and_exit_1_when_something_is_found() -> None:
    expected = sum(len(expected_findings(path)) for path in programs())
    outputs = []
    for command in (["-m", "lightning_ext", "check"], ["-m", "lightning_ext.check"]):
        process = _run(*command, "tests/check/corpus")
        assert process.returncode == 1, process.stderr
        lines = process.stdout.splitlines()
        assert lines[-1] == f"Found {expected} finding(s) in {len(programs())} file(s)."
        outputs.append(lines)
    assert outputs[0] == outputs[1]
    first = "tests/check/corpus/all_gather_callback_strategy.py:16:13: LX204 trainer.strategy.all_gather(...)"
    assert outputs[0][0].startswith(first), outputs[0][0]


def test_the_line_a_user_reads_names_the_call_the_guard_what_happens_and_the_fix() -> None:
    process = _run("-m", "lightning_ext.check", "tests/check/corpus/log_is_global_zero_validation_epoch_end.py")
    assert process.stdout.splitlines()[0] == (
        "tests/check/corpus/log_is_global_zero_validation_epoch_end.py:11:13: LX101 self.log('val_acc',"
        " sync_dist=True) under the rank guard on line 10: every other rank goes on; stock DDP hangs, and"
        " lightning-ext's checks raise DivergentLoggingError. Fix: log it on every rank, or with rank_zero_only=True."
    )
    process = _run("-m", "lightning_ext.check", "tests/check/corpus/log_early_return.py")
    assert (
        "LX101 self.log('epoch_summary', sync_dist=True) after the early return under the rank guard on line 10:"
        in (process.stdout)
    )
    process = _run("-m", "lightning_ext.check", "tests/check/corpus/log_helper_method.py")
    assert "under the rank guard on line 10, through the call on line 11: every other rank goes on" in process.stdout


def test_json_output_holds_every_finding_with_its_location_guard_and_runtime_error() -> None:
    process = _run("-m", "lightning_ext.check", "--format", "json", "tests/check/corpus")
    assert process.returncode == 1
    document = json.loads(process.stdout)
    found = {(Path(entry["filename"]).name, entry["location"]["row"], entry["code"]) for entry in document}
    assert found == {(path.name, line, code) for path in programs() for line, code in expected_findings(path)}
    entry = next(e for e in document if e["filename"].endswith("log_is_global_zero_validation_epoch_end.py"))
    assert entry == {
        "code": "LX101",
        "name": "synced logging under a rank guard",
        "message": entry["message"],
        "filename": "tests/check/corpus/log_is_global_zero_validation_epoch_end.py",
        "location": {"row": 11, "column": 13},
        "end_location": {"row": 11, "column": 53},
        "guard": {"row": 10},
        "error": "DivergentLoggingError",
    }
    keys = next(e for e in document if e["code"] == "LX103")
    assert keys["guard"] is None


def test_correct_programs_exit_0() -> None:
    correct = [str(path.relative_to(REPO)) for path in programs() if not expected_findings(path)]
    process = _run("-m", "lightning_ext.check", *correct)
    assert (process.returncode, process.stdout) == (0, f"{len(correct)} file(s): all clear.\n")
    process = _run("-m", "lightning_ext.check", "--format", "json", *correct)
    assert (process.returncode, json.loads(process.stdout)) == (0, [])


def test_a_missing_path_or_a_file_that_is_not_python_exits_2_naming_it(tmp_path: Path) -> None:
    broken = tmp_path / "broken.py"
    broken.write_text("import lightning\nif self.global_rank == 0\n    pass\n")
    process = _run(
        "-m", "lightning_ext.check", str(broken), str(tmp_path / "missing.py"), str(CORPUS / "log_else_branch.py")
    )
    assert process.returncode == 2
    assert process.stderr.splitlines() == [
        f"lightning-ext check: error: {tmp_path / 'missing.py'}: no such file or folder",
        f"lightning-ext check: error: {broken}:2:25: cannot parse it: expected ':'",
    ]
    assert "log_else_branch.py:13:13: LX101" in process.stdout  # the files that parse are checked all the same


def test_usage_errors_exit_2() -> None:
    assert _run("-m", "lightning_ext", "check").returncode == 2
    assert _run("-m", "lightning_ext.check", "--format", "xml", "tests/check/corpus").returncode == 2


def test_the_check_loads_neither_lightning_nor_torch_nor_the_other_commands_imports() -> None:
    """Nor pandas, which ``lightning-ext ranks`` needs: pre-commit starts the check on every commit."""
    code = (
        "import sys\n"
        "from lightning_ext.__main__ import main\n"
        "code = main(['check', 'tests/check/corpus'])\n"
        "loaded = {name.split('.')[0] for name in sys.modules}\n"
        "print(code, sorted(loaded & {'torch', 'lightning', 'pytorch_lightning', 'pandas'}), file=sys.stderr)\n"
    )
    process = _run("-c", code)
    assert process.stderr.splitlines()[-1] == "1 []"


@pytest.mark.parametrize("name", ["__pycache__", ".venv", "build", "site-packages"])
def test_a_folder_walk_skips_what_ruff_skips_but_a_file_given_is_read(tmp_path: Path, name: str) -> None:
    inside = tmp_path / name
    inside.mkdir()
    (inside / "model.py").write_text((CORPUS / "log_else_branch.py").read_text())
    assert _run("-m", "lightning_ext.check", str(tmp_path)).returncode == 0
    assert _run("-m", "lightning_ext.check", str(inside / "model.py")).returncode == 1


def test_a_base_class_from_another_file_checked_with_it_makes_a_lightning_module(tmp_path: Path) -> None:
    """``class Model(Base)`` with ``Base`` a LightningModule of a package beside it: found when both are checked."""
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "__init__.py").write_text("from .base import Base\n")
    (tmp_path / "models" / "base.py").write_text(
        "import lightning as L\n\n\nclass Base(L.LightningModule):\n    pass\n"
    )
    (tmp_path / "train.py").write_text(
        "from models import Base\n\n\nclass Model(Base):\n    def on_train_epoch_end(self):\n"
        "        if self.global_rank == 0:\n            self.trainer.strategy.barrier()\n"
    )
    process = _run("-m", "lightning_ext.check", ".", cwd=tmp_path)
    assert process.stdout.splitlines()[0].startswith("train.py:7:13: LX203"), process.stdout
    assert _run("-m", "lightning_ext.check", "train.py", cwd=tmp_path).returncode == 0  # alone: no LightningModule


def test_a_bare_noqa_silences_every_code_on_its_line(tmp_path: Path) -> None:
    """(The corpus cannot hold a bare ``# noqa``: ruff's RUF100 removes one that silences none of ruff's codes.)"""
    source = (CORPUS / "barrier_training_step.py").read_text()
    marked = tmp_path / "marked.py"
    marked.write_text(
        source.replace("self.trainer.strategy.barrier()  # expect: LX203", "self.trainer.strategy.barrier()  # noqa")
    )
    assert marked.read_text() != source
    assert _run("-m", "lightning_ext.check", str(marked)).returncode == 0
    assert _run("-m", "lightning_ext.check", str(CORPUS / "barrier_training_step.py")).returncode == 1
