"""The fork-style patch series against a copy of the installed Lightning: applied with the tool, then the same
behaviour as the runtime drop-in, with runtime patching switched off (so only the native seams can be at work)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning
import pytest
import pytorch_lightning

from tests.helpers.pytorch_lightning_job import check_job, start

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow

# where each verified release's _run_early_stopping_check hunk sits (its series, 0002)
EARLY_STOPPING_HUNK = {"2.5.6": "@@ -197,6 +198,11 @@", "2.6.6": "@@ -224,6 +225,11 @@"}
PATCHED_FILES = [
    "pytorch/callbacks/early_stopping.py",
    "pytorch/callbacks/model_checkpoint.py",
    "pytorch/core/module.py",
    "pytorch/loops/evaluation_loop.py",
    "pytorch/loops/fetchers.py",
    "pytorch/loops/fit_loop.py",
    "pytorch/loops/prediction_loop.py",
    "pytorch/strategies/parallel.py",
    "pytorch/trainer/call.py",
    "pytorch/trainer/connectors/logger_connector/logger_connector.py",
    "pytorch/trainer/connectors/logger_connector/result.py",
    "pytorch/trainer/trainer.py",
]


def _tool(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lightning_ext.patches", *args], capture_output=True, text=True, timeout=180, env=env
    )


@pytest.fixture(scope="module")
def patched_site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A directory holding a patched copy of the installed ``lightning`` package (put it first on PYTHONPATH)."""
    site = tmp_path_factory.mktemp("patched-site")
    shutil.copytree(Path(lightning.__file__).parent, site / "lightning", ignore=shutil.ignore_patterns("__pycache__"))
    applied = _tool("apply", "--target", str(site / "lightning"))
    assert applied.returncode == 0, applied.stdout + applied.stderr
    yield site


def _native_env(site: Path) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(site), str(REPO)]),
        "LIGHTNING_EXT_RUNTIME_PATCHING": "0",
        "LIGHTNING_EXT_EXPECT_NATIVE": str(site / "lightning"),
        "PYTHONWARNINGS": "ignore",
    }


def _outcomes(work: Path, env: dict[str, str] | None) -> dict[str, Any]:
    run = subprocess.run(
        [sys.executable, str(REPO / "tests" / "helpers" / "scripts" / "mode_outcomes.py"), str(work)],
        capture_output=True,
        text=True,
        timeout=400,
        env=env,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    line = next(line for line in run.stdout.splitlines() if line.startswith("OUTCOMES "))
    return json.loads(line[len("OUTCOMES ") :])


def _normalise(outcomes: dict[str, Any], work: Path) -> dict[str, Any]:
    text = json.dumps({k: v for k, v in outcomes.items() if k not in ("patch_mode", "lightning")}, sort_keys=True)
    return json.loads(text.replace(str(work), "<work>"))


@pytest.mark.ci  # minutes: whole suites and jobs again on the patched copy (make test skips it; CI runs it)
@pytest.mark.timeout(600)  # a limit: past the default 300 s on a machine that ran 3 times slower (2026-11-28)
def test_native_seams_give_the_same_results_as_the_runtime_drop_in(patched_site: Path, tmp_path: Path) -> None:
    runtime = _outcomes(tmp_path / "runtime", None)
    native = _outcomes(tmp_path / "native", _native_env(patched_site))
    assert runtime["patch_mode"] == "runtime" and native["patch_mode"] == "native"
    assert native["lightning"].startswith(str(patched_site))
    same_native, same_runtime = _normalise(native, tmp_path / "native"), _normalise(runtime, tmp_path / "runtime")
    # stock DDPStrategy on the patched Lightning: the same checkpoints and stop epochs as on the unpatched one
    for key in ("checkpoint/stock", "early_stopping/stock", "metrics/stock"):
        assert same_native[key] == same_runtime[key], key
    assert same_native == same_runtime  # and every policy and per-rank outcome is identical


@pytest.mark.ci  # minutes: whole suites and jobs again on the patched copy (make test skips it; CI runs it)
@pytest.mark.timeout(900)  # the suites' own run is bounded at 900 s below
def test_policy_per_rank_and_hang_suites_pass_against_the_patched_copy(patched_site: Path) -> None:
    suites = [
        "tests/decisions/test_trainer_policies.py",
        "tests/decisions/test_trainer_errors.py",
        "tests/decisions/test_trainer_nonfinite.py",
        "tests/per_rank/test_trainer_runs.py",
        "tests/per_rank/test_resume.py",
        # telemetry patches no class: its loop hooks are instance attributes, the same on a patched Lightning
        "tests/telemetry/test_telemetry.py::test_the_verdict_names_each_slowed_rank_and_its_phase",
        "tests/checks/test_checks.py",  # the hang-check seams (0004), natively
        "tests/decisions/test_record_runs.py",  # the decision record, made by the same seams
        "tests/setup/test_trainer_runs.py",  # the set-up checks' seam (0005), natively
        "tests/sync/test_collectives.py",  # the coalesced sync's seams where the hooks end (0006), natively
        # 0007, natively: the sync after each callback, the reads of pending values, the evaluation batches' end (at
        # 2 ranks: the main suite runs the other world sizes through the same seams)
        "tests/sync/test_readers.py::test_every_reader_sees_stocks_value[logging_callback_first-2]",
        "tests/sync/test_inside_the_hook.py",
        "tests/preemption/test_evaluation_stop.py::"
        "test_a_signal_in_an_evaluation_stops_every_rank_within_one_batch_and_resumes_to_the_reference[2]",
        "tests/preemption/test_evaluation_stop.py::"
        "test_a_signal_in_validate_test_or_predict_ends_every_rank_with_rank_signalled_error_within_one_batch[predict]",
    ]
    # not about the seams, and run in the main suite: stock Lightning's hang (the error half is the first test's
    # case), and the test pool's own deadline
    unrelated = [
        f"tests/decisions/test_trainer_errors.py::{name}"
        for name in (
            "test_stock_ddp_hangs_where_the_policy_strategy_raises",
            "test_pool_reports_a_hang_by_its_deadline",
        )
    ]
    deselect = [option for test in unrelated for option in ("--deselect", test)]
    # the suites' copies for pytorch_lightning have their own test below; the hypothesis properties search the same
    # seams as their examples do, and run in the main suite
    only = ["-k", "not pytorch_lightning and not property"]
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *deselect, *only, *suites],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=REPO,
        env={**_native_env(patched_site), "HYPOTHESIS_PROFILE": "quick"},  # the properties' search ran under ci
    )
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    assert " passed" in run.stdout and "failed" not in run.stdout.splitlines()[-1]


def test_check_names_the_file_and_hunk_on_an_altered_copy_and_apply_touches_nothing(tmp_path: Path) -> None:
    target = tmp_path / "lightning"
    shutil.copytree(Path(lightning.__file__).parent, target, ignore=shutil.ignore_patterns("__pycache__"))
    altered = target / "pytorch" / "callbacks" / "early_stopping.py"
    text = altered.read_text()
    altered.write_text(
        text.replace("        logs = trainer.callback_metrics\n", "        logs = dict(trainer.callback_metrics)\n")
    )
    before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in target.rglob("*.py")}
    checked = _tool("check", "--target", str(target))
    assert checked.returncode == 1
    hunk = EARLY_STOPPING_HUNK[lightning.__version__]
    assert f"lightning/pytorch/callbacks/early_stopping.py {hunk}: FAILS" in checked.stdout
    assert "logs = dict(trainer.callback_metrics)" in checked.stdout  # what it found instead
    applied = _tool("apply", "--target", str(target))
    assert applied.returncode == 1
    assert before == {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in target.rglob("*.py")}


def test_apply_is_idempotent_and_revert_restores_the_original_bytes(tmp_path: Path) -> None:
    target = tmp_path / "lightning"
    shutil.copytree(Path(lightning.__file__).parent, target, ignore=shutil.ignore_patterns("__pycache__"))
    original = {p: p.read_bytes() for p in target.rglob("*.py")}
    assert _tool("apply", "--target", str(target)).returncode == 0
    patched = {p: p.read_bytes() for p in target.rglob("*.py")}
    changed = sorted(str(p.relative_to(target)) for p in original if patched[p] != original[p])
    assert changed == PATCHED_FILES
    again = _tool("apply", "--target", str(target))
    assert again.returncode == 0 and "already applied" in again.stdout
    assert {p: p.read_bytes() for p in target.rglob("*.py")} == patched
    assert _tool("revert", "--target", str(target)).returncode == 0
    assert {p: p.read_bytes() for p in target.rglob("*.py")} == original


_SEAMS = """
import importlib, json
import lightning_ext.strategies._runtime as runtime
from lightning_ext import PolicyDDPStrategy

SEAMS = [
    ("lightning.pytorch.callbacks.model_checkpoint", "ModelCheckpoint", "_save_topk_checkpoint"),
    ("lightning.pytorch.callbacks.model_checkpoint", "ModelCheckpoint", "on_train_batch_end"),
    ("lightning.pytorch.callbacks.early_stopping", "EarlyStopping", "_run_early_stopping_check"),
    ("lightning.pytorch.trainer.connectors.logger_connector.logger_connector", "_LoggerConnector", "log_metrics"),
    ("lightning.pytorch.trainer.connectors.logger_connector.logger_connector", "_LoggerConnector", "on_batch_start"),
    ("lightning.pytorch.trainer.connectors.logger_connector.result", "_ResultMetric", "forward"),
    ("lightning.pytorch.trainer.connectors.logger_connector.result", "_ResultMetric", "compute"),
    ("lightning.pytorch.trainer.connectors.logger_connector.result", "_ResultCollection", "metrics"),
    ("lightning.pytorch.loops.fit_loop", "_FitLoop", "setup_data"),
    ("lightning.pytorch.loops.evaluation_loop", "_EvaluationLoop", "setup_data"),
    ("lightning.pytorch.loops.evaluation_loop", "_EvaluationLoop", "max_batches"),
    ("lightning.pytorch.loops.fetchers", "_PrefetchDataFetcher", "__next__"),
    ("lightning.pytorch.loops.fetchers", "_DataFetcher", "setup"),
    ("lightning.pytorch.trainer.trainer", "Trainer", "_run"),
    ("lightning.pytorch.trainer.trainer", "Trainer", "callback_metrics"),
    ("lightning.pytorch.trainer.trainer", "Trainer", "logged_metrics"),
    ("lightning.pytorch.trainer.trainer", "Trainer", "progress_bar_metrics"),
    ("lightning.pytorch.loops.evaluation_loop", "_EvaluationLoop", "_evaluation_step"),
    ("lightning.pytorch.loops.prediction_loop", "_PredictionLoop", "_predict_step"),
]

mode = runtime.patch_mode()
try:
    PolicyDDPStrategy()
    error = None
except RuntimeError as exc:
    error = str(exc)
wrapped = []
for module, cls, name in SEAMS:
    attribute = vars(getattr(importlib.import_module(module), cls))[name]
    function = attribute.fget if isinstance(attribute, property) else attribute
    if getattr(function, "__lightning_ext_seam__", False):
        wrapped.append(f"{cls}.{name}")
print("SEAMS " + json.dumps({"mode": mode, "error": error, "wrapped": sorted(wrapped)}))
"""


def _seams(site: Path, runtime_patching: str) -> dict[str, Any]:
    env = {**_native_env(site), "LIGHTNING_EXT_RUNTIME_PATCHING": runtime_patching}
    run = subprocess.run([sys.executable, "-c", _SEAMS], capture_output=True, text=True, timeout=180, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    line = next(line for line in run.stdout.splitlines() if line.startswith("SEAMS "))
    return dict(json.loads(line[len("SEAMS ") :]))


@pytest.mark.ci  # minutes: whole suites and jobs again on the patched copy (make test skips it; CI runs it)
def test_native_only_when_every_seam_is_a_series_without_the_hang_seams_is_completed_at_run_time(
    patched_site: Path, tmp_path: Path
) -> None:
    whole = _seams(patched_site, "0")
    assert whole == {"mode": "native", "error": None, "wrapped": []}

    site = tmp_path / "site"
    shutil.copytree(Path(lightning.__file__).parent, site / "lightning", ignore=shutil.ignore_patterns("__pycache__"))
    series = REPO / "patches" / f"lightning-{lightning.__version__}"
    first_three = tmp_path / "series"
    first_three.mkdir()
    for patch in sorted(series.glob("000[123]-*.patch")):
        shutil.copy(patch, first_three)
    applied = _tool("apply", "--target", str(site / "lightning"), "--series", str(first_three))
    assert applied.returncode == 0, applied.stdout + applied.stderr

    alone = _seams(site, "0")  # the decision seams are native, the hang seams are not: not enough alone
    assert alone["mode"] == "runtime" and alone["wrapped"] == []
    assert "cannot reach Lightning's callbacks" in alone["error"]
    completed = _seams(site, "1")  # the runtime wraps what the series lacks, and only that
    assert completed["mode"] == "runtime" and completed["error"] is None
    assert completed["wrapped"] == [
        "Trainer._run",
        "Trainer.callback_metrics",
        "Trainer.logged_metrics",
        "Trainer.progress_bar_metrics",
        "_DataFetcher.setup",
        "_EvaluationLoop._evaluation_step",
        "_EvaluationLoop.max_batches",
        "_EvaluationLoop.setup_data",
        "_FitLoop.setup_data",
        "_LoggerConnector.on_batch_start",
        "_PredictionLoop._predict_step",
        "_PrefetchDataFetcher.__next__",
        "_ResultCollection.metrics",
        "_ResultMetric.compute",
        "_ResultMetric.forward",
    ]


# ---- the series on the standalone package's tree, pytorch_lightning/ ------------------------------------------------
def _renamed(text: str) -> str:
    """``text`` as Lightning renames its sources for pytorch_lightning (.actions/assistant.py, _replace_imports)."""
    for unified, standalone in (("lightning.pytorch", "pytorch_lightning"), ("lightning.fabric", "lightning_fabric")):
        text = re.sub(rf"([^_/@]|^){re.escape(unified)}([^_\w/]|$)", rf"\g<1>{standalone}\g<2>", text, flags=re.M)
    return text


def test_the_series_on_a_pytorch_lightning_copy_is_the_lightning_series_renamed(tmp_path: Path) -> None:
    """Applied to both trees, each patched pytorch_lightning file is the patched lightning file, renamed."""
    unified = shutil.copytree(Path(lightning.__file__).parent, tmp_path / "lightning", ignore=_CACHES)
    standalone = shutil.copytree(
        Path(pytorch_lightning.__file__).parent, tmp_path / "pytorch_lightning", ignore=_CACHES
    )
    original = {p: p.read_bytes() for p in standalone.rglob("*.py")}
    for name in PATCHED_FILES:  # the rule is Lightning's: the installed files obey it before the series, too
        expected = _renamed((unified / name).read_text(encoding="utf-8"))
        assert (standalone / name.removeprefix("pytorch/")).read_text(encoding="utf-8") == expected, name
    for target in (unified, standalone):
        applied = _tool("apply", "--target", str(target))
        assert applied.returncode == 0, applied.stdout + applied.stderr
    changed = sorted(str(p.relative_to(standalone)) for p in original if p.read_bytes() != original[p])
    assert changed == [name.removeprefix("pytorch/") for name in PATCHED_FILES]
    for name in PATCHED_FILES:
        expected = _renamed((unified / name).read_text(encoding="utf-8"))
        assert (standalone / name.removeprefix("pytorch/")).read_text(encoding="utf-8") == expected, name
    assert _tool("revert", "--target", str(standalone)).returncode == 0
    assert {p: p.read_bytes() for p in standalone.rglob("*.py")} == original


def test_without_a_target_the_tool_takes_both_installed_packages_and_writes_all_or_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from lightning_ext.patches import __main__ as command

    checked = _tool("check")  # the installed packages themselves: check writes nothing
    assert checked.returncode == 0, checked.stdout + checked.stderr
    targets = [line.split()[1] for line in checked.stdout.splitlines() if line.startswith("target: ")]
    assert targets == [str(Path(lightning.__file__).parent), str(Path(pytorch_lightning.__file__).parent)]
    assert checked.stdout.count("result: the series applies cleanly") == 2

    clean = shutil.copytree(Path(lightning.__file__).parent, tmp_path / "lightning", ignore=_CACHES)
    altered = shutil.copytree(Path(pytorch_lightning.__file__).parent, tmp_path / "pytorch_lightning", ignore=_CACHES)
    stopping = altered / "callbacks" / "early_stopping.py"
    stopping.write_text(
        stopping.read_text().replace("logs = trainer.callback_metrics", "logs = dict(trainer.callback_metrics)")
    )
    before = {p: p.read_bytes() for target in (clean, altered) for p in target.rglob("*.py")}
    monkeypatch.setattr(command, "installed_targets", lambda: (clean, altered))
    assert command.main(["apply"]) == 1
    assert "pytorch_lightning/callbacks/early_stopping.py" in capsys.readouterr().out
    assert {p: p.read_bytes() for target in (clean, altered) for p in target.rglob("*.py")} == before  # neither


@pytest.mark.ci  # minutes: whole suites and jobs again on the patched copy (make test skips it; CI runs it)
def test_the_series_on_a_pytorch_lightning_copy_runs_a_users_job_natively(tmp_path: Path) -> None:
    site = tmp_path / "site"
    shutil.copytree(Path(pytorch_lightning.__file__).parent, site / "pytorch_lightning", ignore=_CACHES)
    applied = _tool("apply", "--target", str(site / "pytorch_lightning"))
    assert applied.returncode == 0, applied.stdout + applied.stderr
    env = {"PYTHONPATH": os.pathsep.join([str(site), str(REPO)]), "LIGHTNING_EXT_RUNTIME_PATCHING": "0"}
    code = "import pytorch_lightning as pl; from lightning_ext.patches import patch_mode as m; print(m(), pl.__file__)"
    mode = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=180, env={**os.environ, **env}
    )
    assert mode.stdout.split() == ["native", str(site / "pytorch_lightning" / "__init__.py")], mode.stderr[-3000:]
    job = start(tmp_path / "job", PITFALL="log_dir", **env)
    exit_code = job.wait(240)
    job.kill()
    check_job(tmp_path / "job", exit_code, job.output(tail=40000), installed=False)


_CACHES = shutil.ignore_patterns("__pycache__")
