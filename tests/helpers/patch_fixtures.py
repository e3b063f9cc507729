"""Synthetic ``lightning`` trees and patch series, made with real ``git format-patch``.

:func:`make_git_series` commits a base tree in a fresh git repository, copies its ``lightning/`` directory as the
pristine target, makes one commit per patch, and turns the commits into a series with ``git format-patch``. Git runs
with no system or user configuration, so nothing on the machine changes the patch format.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

Edit = Callable[[bytes], bytes]
Snapshot = dict[str, tuple[bytes, int, int]]

OLD_MTIME_NS = 1_000_000_000 * 10**9  # 2001: any write the tool makes changes a file's mtime


def _lines(count: int, stem: str, ending: str = "\n") -> str:
    return "".join(f"    {stem}_{index} = {index}{ending}" for index in range(count))


BASE: dict[str, bytes] = {
    "version.info": b"2.6.6\n",
    "__init__.py": b'"""A synthetic lightning package."""\n',
    "pytorch/__init__.py": b"",
    "pytorch/callbacks/model_checkpoint.py": ("class ModelCheckpoint:\n" + _lines(40, "checkpoint")).encode(),
    "pytorch/callbacks/early_stopping.py": ("class EarlyStopping:\r\n" + _lines(12, "stopping", "\r\n")).encode(),
    "pytorch/trainer/trainer.py": ("class Trainer:\n" + _lines(10, "trainer")).encode().rstrip(b"\n"),
}


def replace(old: str, new: str) -> Edit:
    """An edit that replaces exactly one occurrence of ``old``."""

    def edit(data: bytes) -> bytes:
        if data.count(old.encode()) != 1:
            raise ValueError(f"{old!r} is not in the file exactly once")
        return data.replace(old.encode(), new.encode())

    return edit


# Two patches: 0001 edits model_checkpoint.py twice (two hunks) and the CRLF file; 0002 edits model_checkpoint.py
# next to 0001's first change (so it depends on it) and the end of trainer.py, which has no final newline.
SERIES: list[tuple[str, dict[str, list[Edit]]]] = [
    (
        "Add the checkpoint seam",
        {
            "pytorch/callbacks/model_checkpoint.py": [
                replace("    checkpoint_4 = 4\n", "    checkpoint_4 = 4\n    seam = True  # lightning-ext\n"),
                replace("    checkpoint_33 = 33\n", "    checkpoint_33 = -33\n"),
            ],
            "pytorch/callbacks/early_stopping.py": [replace("    stopping_6 = 6\r\n", "    stopping_6 = 'six'\r\n")],
        },
    ),
    (
        "Add the trainer seam",
        {
            "pytorch/callbacks/model_checkpoint.py": [replace("    checkpoint_6 = 6\n", "    checkpoint_6 = 'six'\n")],
            "pytorch/trainer/trainer.py": [replace("    trainer_9 = 9", "    trainer_9 = 9\n    seam = True")],
        },
    ),
]


@dataclass(frozen=True)
class GitSeries:
    """A pristine target, a series, and the files as the series should leave them.

    Attributes:
        target: the pristine ``lightning`` package directory (copy it before changing it).
        series: the directory of ``NNNN-*.patch`` files.
        patch_names: the patch file names, in order.
        original: every file of the target, by package-relative path.
        patched: the files the series changes, with the whole series applied.

    """

    target: Path
    series: Path
    patch_names: tuple[str, ...]
    original: dict[str, bytes]
    patched: dict[str, bytes]


def git(repo: Path, *args: str) -> str:
    """Run git in ``repo`` with no system or user configuration; return its output."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(repo),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_AUTHOR_NAME": "Test",
        "GIT_AUTHOR_EMAIL": "test@example.invalid",
        "GIT_COMMITTER_NAME": "Test",
        "GIT_COMMITTER_EMAIL": "test@example.invalid",
    }
    done = subprocess.run(
        ["git", "-c", "core.autocrlf=false", *args],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout


def make_git_series(
    root: Path,
    *,
    base: Mapping[str, bytes] = BASE,
    commits: Sequence[tuple[str, Mapping[str, Sequence[Edit]]]] = SERIES,
) -> GitSeries:
    """Commit ``base`` under ``lightning/``, copy it as the target, commit each edit set, and format-patch them."""
    repo = root / "repo"
    package = repo / "lightning"
    for relative, data in base.items():
        (package / relative).parent.mkdir(parents=True, exist_ok=True)
        (package / relative).write_bytes(data)
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "Base")
    target = root / "site-packages" / "lightning"
    shutil.copytree(package, target)
    changed: set[str] = set()
    for subject, edits in commits:
        for relative, file_edits in edits.items():
            path = package / relative
            data = path.read_bytes() if path.exists() else b""
            for edit in file_edits:
                data = edit(data)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            changed.add(relative)
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", subject, "-m", f"Why: {subject.lower()}.")
    series = root / "series"
    git(repo, "format-patch", "-q", "-o", str(series), f"HEAD~{len(commits)}")
    return GitSeries(
        target=target,
        series=series,
        patch_names=tuple(sorted(path.name for path in series.glob("*.patch"))),
        original=dict(base),
        patched={relative: (package / relative).read_bytes() for relative in sorted(changed)},
    )


def copy_target(source: Path, destination: Path) -> Path:
    """Copy a target tree and set every file's mtime to :data:`OLD_MTIME_NS`; return the copy."""
    shutil.copytree(source, destination, symlinks=True)
    for path in destination.rglob("*"):
        if path.is_file() and not path.is_symlink():
            os.utime(path, ns=(OLD_MTIME_NS, OLD_MTIME_NS))
    return destination


def snapshot(root: Path) -> Snapshot:
    """Every file under ``root`` (not following symlinks): its bytes, mtime and mode."""
    found: Snapshot = {}
    for directory, _, names in os.walk(root):
        for name in names:
            path = Path(directory, name)
            info = path.lstat()
            data = b"" if path.is_symlink() else path.read_bytes()
            found[path.relative_to(root).as_posix()] = (data, info.st_mtime_ns, info.st_mode)
    return found


def contents(root: Path) -> dict[str, bytes]:
    """Every file under ``root``: its bytes."""
    return {name: data for name, (data, _, _) in snapshot(root).items()}
