"""Simulate a whole series against a target, in memory, and work out where the target stands.

1. Every path is mapped and checked, and every file the series touches is read once, before anything else.
2. Reverse walk, last patch first: a patch is *applied* if all its hunks reverse-apply exactly (on the tree with the
   later applied patches already undone). If every patch is applied, the series is fully applied and the walk has
   rebuilt the original files.
3. Otherwise, forward walk from the rebuilt tree, first patch first, each patch in its place in the series: an
   applied patch is redone; the others are judged hunk by hunk (``OK``, ``ALREADY APPLIED``, ``FAILS``). If no patch
   was applied and every hunk is ``OK``, the series applies cleanly (the walk's result is what ``apply`` writes); if
   some were applied and all hunks of the others are ``OK``, the tree is partially patched; anything else is a
   conflict. With no patch applied the rebuilt tree is the current one, so the check is exactly "apply in order".

"""

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from lightning_ext.patches._errors import PatchError
from lightning_ext.patches._hunks import HunkOutcome, patch_lines
from lightning_ext.patches._paths import resolve_in_target
from lightning_ext.patches._report import HunkReport, HunkStatus, PatchReport, SeriesReport, SeriesState
from lightning_ext.patches._series import ENCODING, ERRORS, FileChange, Patch, Series, split_lines

__all__ = ["Plan", "simulate"]

_Tree = dict[PurePosixPath, list[str]]


@dataclass(frozen=True)
class Plan:
    """The report, and the file contents each action would write.

    Attributes:
        report: where the target stands, hunk by hunk.
        files: the real path of every file the series touches, by package-relative path.
        current: each file's bytes as read.
        patched: each file's bytes with the whole series applied (meaningful when the state is ``CLEAN``).
        original: each file's bytes with the whole series undone (meaningful when the state is ``APPLIED``).

    """

    report: SeriesReport
    files: dict[PurePosixPath, Path]
    current: dict[Path, bytes]
    patched: dict[Path, bytes]
    original: dict[Path, bytes]


def simulate(series: Series, *, target: Path, version: str | None) -> Plan:
    """Check every path of ``series``, read the files, and simulate the series on them.

    Args:
        series: the parsed series.
        target: the ``lightning`` package directory, resolved.
        version: the target's Lightning version, for the report.

    Raises:
        PatchError: a path escapes the target or names no file, or a file cannot be read.

    """
    files: dict[PurePosixPath, Path] = {}
    for patch in series.patches:
        for change in patch.changes:
            real = resolve_in_target(target, change.path, patch=patch.name)
            alias = next((other for other, path in files.items() if path == real and other != change.path), None)
            if alias is not None:
                raise PatchError(
                    f"{patch.name}: {change.shown} and lightning/{alias} are the same file (a symlink); not supported"
                )
            files[change.path] = real
    current: dict[Path, bytes] = {}
    for real in files.values():
        try:
            current[real] = real.read_bytes()
        except OSError as exc:
            raise PatchError(f"cannot read {real}: {exc}") from exc
    tree = {path: split_lines(current[real].decode(ENCODING, ERRORS)) for path, real in files.items()}

    original, applied = _reverse_walk(series.patches, tree)
    if len(applied) == len(series.patches):
        reports = tuple(_already_applied(patch) for patch in series.patches)
        state, patched = SeriesState.APPLIED, tree
    else:
        patched, reports = _forward_walk(series.patches, original, applied)
        every_ok = all(
            hunk.status is HunkStatus.OK for report in reports if not report.applied for hunk in report.hunks
        )
        state = SeriesState.CONFLICT if not every_ok else SeriesState.PARTIAL if applied else SeriesState.CLEAN
    report = SeriesReport(target=target, series=series.directory, version=version, state=state, patches=reports)
    return Plan(
        report=report,
        files=files,
        current=current,
        patched=_encoded(patched, files),
        original=_encoded(original, files),
    )


def _reverse_walk(patches: Iterable[Patch], tree: _Tree) -> tuple[_Tree, set[str]]:
    state = dict(tree)
    applied: set[str] = set()
    for patch in reversed(tuple(patches)):
        trial: _Tree = {}
        for change in reversed(patch.changes):
            lines, outcomes = patch_lines(trial.get(change.path, state[change.path]), change.hunks, reverse=True)
            trial[change.path] = lines
            if any(outcome.status is not HunkStatus.OK for outcome in outcomes):
                break
        else:
            applied.add(patch.name)
            state.update(trial)
    return state, applied


def _forward_walk(patches: Iterable[Patch], tree: _Tree, applied: set[str]) -> tuple[_Tree, tuple[PatchReport, ...]]:
    state = dict(tree)
    reports = []
    for patch in patches:
        hunks: list[HunkReport] = []
        for change in patch.changes:
            state[change.path], outcomes = patch_lines(state[change.path], change.hunks, reverse=False)
            hunks.extend(_hunk_reports(patch, change, outcomes))
        if patch.name in applied:  # it was undone by the reverse walk; redone here, so that later patches see it
            reports.append(_already_applied(patch))
        else:
            reports.append(PatchReport(name=patch.name, subject=patch.subject, applied=False, hunks=tuple(hunks)))
    return state, tuple(reports)


def _already_applied(patch: Patch) -> PatchReport:
    outcomes = (HunkOutcome(HunkStatus.ALREADY_APPLIED),)
    hunks = tuple(
        report for change in patch.changes for report in _hunk_reports(patch, change, outcomes * len(change.hunks))
    )
    return PatchReport(name=patch.name, subject=patch.subject, applied=True, hunks=hunks)


def _hunk_reports(patch: Patch, change: FileChange, outcomes: Iterable[HunkOutcome]) -> list[HunkReport]:
    return [
        HunkReport(
            patch=patch.name,
            file=change.shown,
            header=hunk.header,
            status=outcome.status,
            offset=outcome.offset,
            mismatch=outcome.mismatch,
        )
        for hunk, outcome in zip(change.hunks, outcomes, strict=True)
    ]


def _encoded(tree: _Tree, files: dict[PurePosixPath, Path]) -> dict[Path, bytes]:
    return {files[path]: "".join(lines).encode(ENCODING, ERRORS) for path, lines in tree.items()}
