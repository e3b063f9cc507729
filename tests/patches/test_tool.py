"""The patch tool: check, apply and revert a ``git format-patch`` series on synthetic and real Lightning trees."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from lightning_ext import patches
from lightning_ext.patches import PatchError, SeriesNotApplicableError
from lightning_ext.patches.__main__ import main
from lightning_ext.patches._tool import find_series, installed_targets, load_series, target_version
from tests.helpers.patch_fixtures import GitSeries, contents, copy_target, git, make_git_series, replace, snapshot

MC = "pytorch/callbacks/model_checkpoint.py"
STOPPING = "pytorch/callbacks/early_stopping.py"
TRAINER = "pytorch/trainer/trainer.py"


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> GitSeries:
    return make_git_series(tmp_path_factory.mktemp("git-series"))


@pytest.fixture
def target(made: GitSeries, tmp_path: Path) -> Path:
    """A fresh pristine copy of the synthetic target, every file with an old mtime."""
    return copy_target(made.target, tmp_path / "site-packages" / "lightning")


def _expected(made: GitSeries) -> dict[str, bytes]:
    return {**made.original, **made.patched}


def test_series_is_split_into_single_hunk_patches(made: GitSeries) -> None:
    series = load_series(made.series)
    assert [patch.name for patch in series] == list(made.patch_names)
    first = series[0]
    assert [hunk.file for hunk in first.hunks] == [f"lightning/{name}" for name in (STOPPING, MC, MC)]
    for patch in series:  # headers read back exactly as git wrote them
        written = re.findall(r"^@@ -\S+ \+\S+ @@", (made.series / patch.name).read_text(), flags=re.MULTILINE)
        assert [hunk.header for hunk in patch.hunks] == written
    # each single-hunk patch starts where the file's earlier hunks have put its lines: 0001's first MC hunk adds one
    old_starts = [int(re.search(r"^@@ -(\d+)", hunk.diff, re.MULTILINE)[1]) for hunk in first.hunks[1:]]  # type: ignore[index]
    stated = [int(hunk.header.split()[1].split(",")[0][1:]) for hunk in first.hunks[1:]]
    assert old_starts == [stated[0], stated[1] + 1]
    assert first.hunks[0].expected[0].endswith("\r")  # CRLF kept (the "\n" ends every line)
    trainer = series[1].hunks[1]
    assert trainer.diff.endswith("+    seam = True\n\\ No newline at end of file\n")  # "\ No newline" kept for git
    assert "-    trainer_9 = 9\n\\ No newline at end of file\n" in trainer.diff


def test_check_on_a_pristine_tree_is_all_ok(made: GitSeries, target: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = snapshot(target)
    report = patches.check(target=target, series=made.series)
    assert report.state == "clean" and report.ok and report.version == "2.6.6"
    assert [(hunk.status, hunk.detail) for hunk in report.hunks] == [("OK", "")] * 5
    assert main(["check", "--target", str(target), "--series", str(made.series)]) == 0
    out = capsys.readouterr().out
    assert f"\n{made.patch_names[0]}\n" in out
    assert f"  lightning/{MC} @@ -4,6 +4,7 @@: OK" in out
    assert "result: the series applies cleanly (2 patches, 5 hunks)" in out
    assert snapshot(target) == before


@pytest.mark.parametrize(
    ("edit", "shown"),
    [
        (lambda data: b"# one\n# two\n" + data, "offset 2 lines"),
        (lambda data: data.removeprefix(b"class ModelCheckpoint:\n"), "offset -1 lines"),  # git's words
    ],
)
def test_check_reports_an_offset_and_apply_follows_it(
    made: GitSeries, target: Path, edit: Callable[[bytes], bytes], shown: str
) -> None:
    (target / MC).write_bytes(edit(made.original[MC]))
    report = patches.check(target=target, series=made.series)
    by_hunk = {(hunk.patch, hunk.header): (hunk.status, hunk.detail) for hunk in report.hunks if MC in hunk.file}
    assert set(by_hunk.values()) == {("OK", shown)} and len(by_hunk) == 3
    assert report.ok and f"lightning/{MC} @@ -4,6 +4,7 @@: OK ({shown})\n" in report.format()
    patches.apply(target=target, series=made.series)
    assert (target / MC).read_bytes() == edit(made.patched[MC])


def test_altered_context_fails_the_hunk_and_apply_touches_nothing(
    made: GitSeries, target: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (target / TRAINER).write_bytes(made.original[TRAINER].replace(b"trainer_7 = 7", b"trainer_7 = 'seven'"))
    os.utime(target / TRAINER, ns=(10**18, 10**18))
    before = snapshot(target)
    report = patches.check(target=target, series=made.series)
    assert report.state == "conflict" and not report.ok
    (failing,) = [hunk for hunk in report.hunks if hunk.status == "FAILS"]
    assert (failing.patch, failing.file, failing.header) == (
        made.patch_names[1],
        f"lightning/{TRAINER}",
        "@@ -8,4 +8,5 @@",
    )
    assert failing.detail == "line 9: expected '    trainer_7 = 7', found \"    trainer_7 = 'seven'\""
    assert main(["check", "--target", str(target), "--series", str(made.series)]) == 1
    out = capsys.readouterr().out
    assert f"  lightning/{TRAINER} @@ -8,4 +8,5 @@: FAILS\n    line 9: expected '    trainer_7 = 7', found" in out
    assert f"result: the series does not apply: {made.patch_names[1]}: 1 of 2 hunks fail\n" in out
    with pytest.raises(SeriesNotApplicableError, match="refusing to apply: the series does not apply"):
        patches.apply(target=target, series=made.series)
    assert main(["apply", "--target", str(target), "--series", str(made.series)]) == 1
    assert "error: refusing to apply" in capsys.readouterr().err
    assert snapshot(target) == before  # bytes, mtimes and modes of every file, and no stray temporary file


def test_apply_apply_revert_revert_round_trip(made: GitSeries, target: Path) -> None:
    (target / MC).chmod(0o754)
    pristine = snapshot(target)
    outcome = patches.apply(target=target, series=made.series)
    assert outcome.state == "clean"
    assert sorted(path.relative_to(target).as_posix() for path in outcome.written) == sorted(made.patched)
    assert contents(target) == _expected(made)
    assert (target / MC).stat().st_mode & 0o777 == 0o754
    applied = snapshot(target)

    again = patches.apply(target=target, series=made.series)
    assert (again.state, again.written) == ("applied", ())
    assert snapshot(target) == applied
    report = patches.check(target=target, series=made.series)
    assert report.state == "applied" and report.ok
    assert {hunk.status for hunk in report.hunks} == {"ALREADY APPLIED"}

    back = patches.revert(target=target, series=made.series)
    assert back.state == "applied" and len(back.written) == len(made.patched)
    after = snapshot(target)
    assert {name: (data, mode) for name, (data, _, mode) in after.items()} == {
        name: (data, mode) for name, (data, _, mode) in pristine.items()
    }
    nothing = patches.revert(target=target, series=made.series)
    assert (nothing.state, nothing.written) == ("clean", ())
    assert snapshot(target) == after


def test_partially_patched_tree_is_completed_by_apply_and_taken_out_by_revert(
    made: GitSeries, target: Path, tmp_path: Path
) -> None:
    first_only = tmp_path / "first-only"
    first_only.mkdir()
    shutil.copy(made.series / made.patch_names[0], first_only)
    patches.apply(target=target, series=first_only)
    partly = snapshot(target)
    report = patches.check(target=target, series=made.series)
    assert report.state == "partial" and report.ok
    assert [patch.name for patch in report.patches if patch.applied] == list(made.patch_names[:1])
    assert report.summary() == (
        f"the series is partially applied: applied: {made.patch_names[0]}; "
        f"not applied, and applies cleanly: {made.patch_names[1]}"
    )
    back = patches.revert(target=target, series=made.series)  # only 0001 is in: only its files change
    assert contents(target) == made.original
    assert sorted(path.relative_to(target).as_posix() for path in back.written) == [STOPPING, MC]
    patches.apply(target=target, series=first_only)
    assert contents(target) == {name: data for name, (data, _, _) in partly.items()}
    completed = patches.apply(target=target, series=made.series)  # 0002 goes on top of 0001
    assert completed.state == "partial" and contents(target) == _expected(made)
    assert sorted(path.relative_to(target).as_posix() for path in completed.written) == [MC, TRAINER]


def test_patch_only_partly_in_the_tree_is_a_conflict(made: GitSeries, target: Path) -> None:
    patches.apply(target=target, series=made.series)
    (target / STOPPING).write_bytes(made.original[STOPPING])  # one file of 0001 put back, say by a reinstall
    before = snapshot(target)
    report = patches.check(target=target, series=made.series)
    assert report.state == "conflict" and [patch.name for patch in report.patches if patch.applied] == [
        made.patch_names[1]
    ]
    first = report.patches[0]
    assert [(hunk.file, hunk.status) for hunk in first.hunks] == [
        (f"lightning/{STOPPING}", "OK"),
        (f"lightning/{MC}", "ALREADY APPLIED"),
        (f"lightning/{MC}", "ALREADY APPLIED"),
    ]
    message = f"{made.patch_names[0]}: 2 of 3 hunks already applied; applied: {made.patch_names[1]}"
    assert report.summary() == f"the series does not apply: {message}"
    for action in (patches.apply, patches.revert):
        with pytest.raises(SeriesNotApplicableError, match=f"to {action.__name__}: .*{message}; nothing was written"):
            action(target=target, series=made.series)
    assert snapshot(target) == before


@pytest.mark.parametrize("bad", ["{side}/lightning/../../etc/x", "/etc/x", "{side}//etc/x", "{side}/elsewhere/x.py"])
def test_paths_escaping_the_target_are_refused(made: GitSeries, target: Path, tmp_path: Path, bad: str) -> None:
    series = tmp_path / "series"
    shutil.copytree(made.series, series)
    second = series / made.patch_names[1]
    text = second.read_text()
    for side in "ab":
        text = text.replace(f"{side}/lightning/{TRAINER}", bad.format(side=side))
    second.write_text(text)
    before = snapshot(target)
    for action in (patches.check, patches.apply, patches.revert):
        reason = "it is not a path inside 'lightning/' without '..'"
        with pytest.raises(PatchError, match=f"{made.patch_names[1]}: refusing path .*: {reason}"):
            action(target=target, series=series)
    assert snapshot(target) == before  # not even 0001's valid files were touched


def test_symlink_out_of_the_target_is_refused(made: GitSeries, target: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    shutil.move(target / "pytorch" / "trainer", outside)
    (target / "pytorch" / "trainer").symlink_to(outside, target_is_directory=True)
    before, outside_before = snapshot(target), snapshot(outside)
    with pytest.raises(PatchError, match=f"refusing path 'lightning/{TRAINER}': it resolves outside the target"):
        patches.apply(target=target, series=made.series)
    assert (snapshot(target), snapshot(outside)) == (before, outside_before)


def test_write_failure_midway_restores_every_file(
    made: GitSeries, target: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_replace = os.replace
    calls: list[str] = []

    def failing_replace(source: str, destination: str | Path) -> None:
        calls.append(str(destination))
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        real_replace(source, destination)

    monkeypatch.setattr(os, "replace", failing_replace)
    before = snapshot(target)
    with pytest.raises(PatchError, match=r"No space left on device.*restored the 1 file\(s\) already written"):
        patches.apply(target=target, series=made.series)
    assert len(calls) == 3  # first file written, second failed, first restored
    after = snapshot(target)
    assert {name: (data, mode) for name, (data, _, mode) in after.items()} == {
        name: (data, mode) for name, (data, _, mode) in before.items()
    }  # same files (no temporary left), same bytes and modes


def test_cli_subprocess_refuses_with_a_report_and_one_error_line(made: GitSeries, target: Path) -> None:
    (target / TRAINER).write_bytes(made.original[TRAINER].replace(b"trainer_7 = 7", b"trainer_7 = 'seven'"))
    before = snapshot(target)
    done = subprocess.run(
        [sys.executable, "-m", "lightning_ext.patches", "apply", "--target", str(target), "--series", str(made.series)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr
    assert f"lightning/{TRAINER} @@ -8,4 +8,5 @@: FAILS" in done.stdout
    assert done.stderr.strip().splitlines() == [
        f"error: refusing to apply: the series does not apply: {made.patch_names[1]}: 1 of 2 hunks fail; "
        "nothing was written"
    ]
    assert snapshot(target) == before


def test_cli_messages_and_exit_codes(made: GitSeries, target: Path, capsys: pytest.CaptureFixture[str]) -> None:
    options = ["--target", str(target), "--series", str(made.series)]
    wrote = sorted(f"wrote {target / name}" for name in made.patched)
    for command, result, written in [
        ("apply", "applies cleanly", wrote),
        ("apply", "is already applied", []),
        ("revert", "is already applied", wrote),
        ("revert", "applies cleanly", []),
    ]:
        assert main([command, *options]) == 0
        out = capsys.readouterr().out.splitlines()
        assert out[-2 - len(written)] == f"result: the series {result} (2 patches, 5 hunks)"
        assert sorted(line.removeprefix(f"{command}: ") for line in out[-1 - len(written) : -1]) == written
        assert out[-1] == f"{command}: {len(written)} file(s) written in {target}"
    assert main(["check", "--target", str(target), "--series", str(target / "nowhere")]) == 1
    assert capsys.readouterr().err == f"error: the series directory {target / 'nowhere'} does not exist\n"
    for usage in ([], ["frobnicate"], ["check", "--bogus"]):
        with pytest.raises(SystemExit) as exited:
            main(usage)
        assert exited.value.code == 2


def test_default_series_is_looked_up_by_version(made: GitSeries, target: Path, tmp_path: Path) -> None:
    (target / "version.info").write_text("9.9.9\n")
    with pytest.raises(
        PatchError,
        match=r"no patch series for Lightning 9\.9\.9: .* \(available: lightning-2\.5\.6, lightning-2\.6\.6\)",
    ):
        patches.check(target=target)
    root = tmp_path / "patches"
    (root / "lightning-2.6.5").mkdir(parents=True)
    (root / "lightning-9.9.9").mkdir()
    assert find_series(target, root=root) == root / "lightning-9.9.9"
    (target / "version.info").write_text("2.6.7\n")
    with pytest.raises(PatchError, match=r"\(available: lightning-2\.6\.5, lightning-9\.9\.9\)"):
        find_series(target, root=root)
    (target / "version.info").write_text("2.5.6\n")  # from a checkout, the series are those in patches/
    assert find_series(target) == Path(__file__).resolve().parents[2] / "patches" / "lightning-2.5.6"


def test_creating_a_file_is_not_supported(tmp_path: Path) -> None:
    made = make_git_series(tmp_path, commits=[("Add a file", {"pytorch/new.py": [lambda _: b"x = 1\n"]})])
    with pytest.raises(PatchError, match=r"0001-Add-a-file\.patch: lightning/pytorch/new\.py: creating a file is not"):
        patches.check(target=made.target, series=made.series)


@pytest.mark.parametrize(
    ("change", "refused"),
    [
        (lambda repo: (repo / "lightning" / TRAINER).unlink(), f"lightning/{TRAINER}: deleting a file"),
        (lambda repo: git(repo, "mv", f"lightning/{TRAINER}", "lightning/moved.py"), "renaming a file"),
        (lambda repo: (repo / "lightning" / TRAINER).chmod(0o755), f"lightning/{TRAINER}: changing a file's mode"),
        (lambda repo: (repo / "lightning" / "version.info").write_bytes(b"\x00\xff"), "version.info: a binary change"),
    ],
)
def test_changes_other_than_text_edits_are_refused(
    tmp_path: Path, change: Callable[[Path], object], refused: str
) -> None:
    made = make_git_series(tmp_path, commits=[])
    repo = tmp_path / "repo"
    change(repo)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "Change")
    git(repo, "format-patch", "-q", "-M", "-o", str(tmp_path / "other"), "HEAD~1")
    before = snapshot(made.target)
    for action in (patches.check, patches.apply):
        with pytest.raises(PatchError, match=f"^0001-Change.patch: .*{re.escape(refused)} is not supported"):
            action(target=made.target, series=tmp_path / "other")
    assert snapshot(made.target) == before


def test_commit_message_that_looks_like_a_diff_is_ignored(tmp_path: Path) -> None:
    made = make_git_series(tmp_path, commits=[("Tweak", {MC: [replace("checkpoint_20 = 20", "checkpoint_20 = 0")]})])
    (patch,) = made.series.glob("*.patch")
    text = patch.read_text()
    head, rest = text.split("\n---\n", 1)
    patch.write_text(f"{head}\n--- a/lightning/{MC}\n+++ b/lightning/{MC}\n@@ -1 +1 @@\n---\n{rest}")
    (parsed,) = load_series(made.series)
    assert [(hunk.file, hunk.header) for hunk in parsed.hunks] == [(f"lightning/{MC}", "@@ -19,7 +19,7 @@")]
    assert patches.check(target=made.target, series=made.series).state == "clean"


def test_real_lightning_copy_check_apply_revert(tmp_path: Path) -> None:
    import lightning

    installed = installed_targets()[0]
    version = target_version(installed)
    assert version == lightning.__version__ and version in ("2.5.6", "2.6.6")  # the verified releases CI runs
    files = ["version.info", "__init__.py", "pytorch/callbacks/model_checkpoint.py"]
    digest_before = {name: hashlib.sha256((installed / name).read_bytes()).hexdigest() for name in files}
    source = (installed / files[2]).read_text(encoding="utf-8")
    anchor = "class ModelCheckpoint(Checkpoint):\n"
    assert source.count(anchor) == 1
    comment = f"{anchor}    # lightning-ext: the top-k decision is delegated when the strategy carries a policy\n"
    base = {name: (installed / name).read_bytes() for name in files}
    made = make_git_series(tmp_path, base=base, commits=[("Mark the seam", {files[2]: [replace(anchor, comment)]})])
    report = patches.check(target=made.target, series=made.series)
    assert report.state == "clean" and report.version == version
    patches.apply(target=made.target, series=made.series)
    assert (made.target / files[2]).read_text(encoding="utf-8") == source.replace(anchor, comment)
    patches.revert(target=made.target, series=made.series)
    assert contents(made.target) == base
    assert {name: hashlib.sha256((installed / name).read_bytes()).hexdigest() for name in files} == digest_before


def test_missing_git_is_reported_clearly_and_nothing_is_written(
    made: GitSeries, target: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    no_git = tmp_path / "bin"
    no_git.mkdir()
    before = snapshot(target)
    done = subprocess.run(
        [sys.executable, "-m", "lightning_ext.patches", "apply", "--target", str(target), "--series", str(made.series)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PATH": str(no_git)},
    )
    message = "no 'git' on PATH: the patch tool runs 'git apply' (install git, then try again)"
    assert (done.returncode, done.stdout, done.stderr) == (1, "", f"error: {message}\n")
    monkeypatch.setenv("PATH", str(no_git))
    for action in (patches.check, patches.apply, patches.revert):
        with pytest.raises(PatchError, match=re.escape(message)):
            action(target=target, series=made.series)
    assert snapshot(target) == before


def test_a_repository_around_the_scratch_copy_changes_nothing(
    made: GitSeries, target: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / ".gitattributes").write_text("* text eol=crlf\n")  # would turn every line ending git writes into CRLF
    monkeypatch.setattr(tempfile, "tempdir", str(repo))  # the tool's scratch copy now lies inside that repository
    patches.apply(target=target, series=made.series)
    assert contents(target) == _expected(made)


def test_importing_the_tool_is_light_and_patch_mode_loads_on_first_use() -> None:
    code = "import json, sys, lightning_ext.patches; print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert loaded.returncode == 0, loaded.stderr
    assert not {"lightning", "torch", "lightning_fabric", "pytorch_lightning"} & set(json.loads(loaded.stdout))
    from lightning_ext.strategies._runtime import patch_mode

    assert patches.patch_mode() == patch_mode() and patch_mode() in ("native", "runtime")
    with pytest.raises(AttributeError, match="has no attribute 'nothing'"):
        patches.nothing  # noqa: B018


def _run(*command: str | Path, **options: object) -> str:
    done = subprocess.run([str(part) for part in command], capture_output=True, text=True, timeout=300, **options)  # type: ignore[call-overload]
    assert done.returncode == 0, done.stdout + done.stderr
    return str(done.stdout)


@pytest.mark.slow
def test_the_built_wheel_ships_the_series_and_the_installed_tool_checks_it(tmp_path: Path) -> None:
    repo = Path(__file__).resolve().parents[2]
    source = tmp_path / "source"  # a clean copy, so that building leaves nothing in the checkout
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(repo / name, source)
    for name in ("lightning_ext", "patches"):
        shutil.copytree(repo / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    _run(*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", tmp_path / "dist", source)
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    shipped = set(zipfile.ZipFile(wheel).namelist())
    assert {path.relative_to(repo).as_posix() for path in (repo / "lightning_ext").rglob("*.py")} <= shipped
    series = {path.relative_to(repo / "patches").as_posix() for path in (repo / "patches").glob("lightning-*/*.patch")}
    assert len(series) >= 3 and {f"lightning_ext/patches/series/{name}" for name in series} <= shipped

    # A fresh virtual environment that sees this one's packages (lightning, torch, unidiff) through a .pth file
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", venv)
    python = venv / "bin" / "python"
    purelib = Path(_run(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))").strip())
    (purelib / "dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}  # not this checkout
    _run(*pip, "--python", python, "install", "--no-deps", "--no-index", wheel, env=environment)

    target = shutil.copytree(
        installed_targets()[0], tmp_path / "copy" / "lightning", ignore=shutil.ignore_patterns("*.pyc")
    )
    version = target_version(target)
    out = _run(python, "-m", "lightning_ext.patches", "check", "--target", target, cwd=tmp_path, env=environment)
    assert f"series: {purelib / 'lightning_ext' / 'patches' / 'series' / f'lightning-{version}'}\n" in out
    patch_files = list((repo / "patches" / f"lightning-{version}").glob("*.patch"))
    hunks = sum(len(re.findall(r"^@@ ", path.read_text(), flags=re.MULTILINE)) for path in patch_files)
    assert out.endswith(f"result: the series applies cleanly ({len(patch_files)} patches, {hunks} hunks)\n")
