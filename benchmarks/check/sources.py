"""Lightning's code for the check's benchmark: its ``examples/`` and ``tests/tests_pytorch/`` (which neither its
wheels nor its sdists ship, so they are extracted from a clone of its repository into a cache folder once), and the
installed ``lightning`` and ``pytorch_lightning`` packages.

``python -m benchmarks.check.sources --git-dir PATH [--ref TAG]`` extracts them (``git archive``; the default tag is
the installed Lightning's version) into ``$LIGHTNING_SOURCES`` or ``~/.cache/lightning-ext/lightning-sources``.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import io
import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

__all__ = ["PARTS", "default_root", "extract", "installed", "main", "parts_at"]

PARTS = ("examples", "tests/tests_pytorch")
_RECORD = "SOURCE.json"


def default_root() -> Path:
    """Where the extracted parts are: ``$LIGHTNING_SOURCES``, else ``~/.cache/lightning-ext/lightning-sources``."""
    given = os.environ.get("LIGHTNING_SOURCES")
    return Path(given) if given else Path.home() / ".cache" / "lightning-ext" / "lightning-sources"


def parts_at(root: Path) -> tuple[dict[str, Path], dict[str, str]]:
    """The parts extracted under ``root`` (those present), and where they came from (``ref``, ``commit``)."""
    found = {part: root / part for part in PARTS if (root / part).is_dir()}
    record = root / _RECORD
    origin: dict[str, str] = json.loads(record.read_text()) if record.is_file() else {}
    return found, origin


def installed() -> dict[str, Path]:
    """The installed packages' source folders (found without importing them)."""
    found = {}
    for name in ("lightning", "pytorch_lightning"):
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations:
            found[f"installed {name}"] = Path(next(iter(spec.submodule_search_locations)))
    return found


def extract(git_dir: Path, ref: str, root: Path) -> str:
    """Extract the parts at ``ref`` from the repository ``git_dir`` into ``root`` (replacing what was there); the
    commit."""
    git = ["git", "--git-dir", str(git_dir)]
    commit = subprocess.run([*git, "rev-parse", "--verify", f"{ref}^{{commit}}"], capture_output=True, text=True)
    if commit.returncode != 0:
        tags = subprocess.run([*git, "tag", "--list", "2.*"], capture_output=True, text=True, check=True).stdout
        raise SystemExit(f"{ref!r} is not in {git_dir}; its 2.x tags: {' '.join(tags.split()[-12:])} (pass --ref)")
    archive = subprocess.run([*git, "archive", "--format=tar", ref, *PARTS], capture_output=True, check=True).stdout
    for part in PARTS:
        shutil.rmtree(root / part, ignore_errors=True)
    root.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(root, filter="data")
    sha = commit.stdout.strip()
    (root / _RECORD).write_text(json.dumps({"ref": ref, "commit": sha}) + "\n")
    return sha


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.check.sources", description=__doc__)
    parser.add_argument("--git-dir", type=Path, required=True, help="a clone of Lightning's repository (its .git)")
    parser.add_argument("--ref", default=None, help="the tag (default: the installed Lightning's version)")
    parser.add_argument("--to", type=Path, default=None, help="the folder (default: $LIGHTNING_SOURCES or the cache)")
    args = parser.parse_args(argv)
    ref = args.ref or importlib.metadata.version("lightning")
    root = args.to or default_root()
    commit = extract(args.git_dir, ref, root)
    print(f"extracted {', '.join(PARTS)} at {ref} ({commit[:10]}) into {root}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
