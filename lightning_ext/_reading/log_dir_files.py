"""Every rank's file, parts, markers, host record and earlier runs' files under a log directory, in one listing."""

import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fsspec import AbstractFileSystem

from lightning_ext._files.csv_format import HOST_SUFFIX
from lightning_ext._files.markers import SUFFIX, parse_marker
from lightning_ext._files.storage import glob_escape, split_location

__all__ = ["RankFiles", "list_rank_files"]

_RANK = "(0|[1-9][0-9]*)"


@dataclass
class RankFiles:
    """What :func:`list_rank_files` found, by rank; paths are the filesystem's, :attr:`shown` makes them readable."""

    fs: AbstractFileSystem
    shown: Callable[[str], str]
    files: dict[int, str] = field(default_factory=dict)
    parts: dict[int, list[str]] = field(default_factory=dict)
    markers: dict[int, str] = field(default_factory=dict)
    rotated: dict[int, list[str]] = field(default_factory=dict)  # earlier runs' files, by their number
    hosts: dict[int, str] = field(default_factory=dict)  # host records (per-rank telemetry)
    sizes: dict[str, int] = field(default_factory=dict)  # bytes of each file and part, as listed

    @property
    def ranks(self) -> list[int]:
        """Every rank with a file or parts (not those with a marker only)."""
        return sorted(self.files.keys() | self.parts.keys())

    def read_markers(self) -> list[tuple[int, tuple[dict[str, Any], str]]]:
        """Each marked rank, in order, with its marker's record and path (``.incomplete`` files; see markers.py)."""
        return [
            (rank, (parse_marker(self.fs.cat_file(path), self.shown(path)), path))
            for rank, path in sorted(self.markers.items())
        ]

    def read_hosts(self, ranks: list[int]) -> dict[int, dict[str, Any]]:
        """The host record of each of ``ranks`` that has a readable one (``.host`` files; see telemetry.py)."""
        found = {}
        for rank in ranks:
            path = self.hosts.get(rank)
            if path is None:
                continue
            try:
                record = json.loads(self.fs.cat_file(path))
            except (OSError, ValueError):  # unreadable or cut short: that rank's host is unknown
                continue
            if isinstance(record, dict) and isinstance(record.get("host"), str):
                found[rank] = record
        return found


def list_rank_files(log_dir: str, filename: str) -> RankFiles:
    """Every rank's file, parts, marker and earlier runs' files under ``log_dir`` (a path or an fsspec URL).

    Raises:
        FileNotFoundError: ``log_dir`` is not a directory.

    """
    fs, root, local = split_location(log_dir)
    if not fs.isdir(root):
        raise FileNotFoundError(f"No such log directory: {log_dir}")
    base = fs._strip_protocol(root).rstrip("/") if local else root.rstrip("/")
    shown: Callable[[str], str] = (
        (lambda path: os.path.join(log_dir, path[len(base) + 1 :])) if local else fs.unstrip_protocol
    )
    found = RankFiles(fs, shown)
    prefix, suffix = filename.split("{rank}")
    tails = r"(|\.part-[0-9a-f]{16}-[0-9]+|\.[1-9][0-9]*|" + re.escape(SUFFIX) + "|" + re.escape(HOST_SUFFIX) + ")"
    own = re.compile(re.escape(prefix) + _RANK + re.escape(suffix) + tails)
    patterns = [_pattern(base, prefix, suffix)]
    flat = None
    if "/" in filename:
        flat_prefix, flat_suffix = prefix.replace("/", "_"), suffix.replace("/", "_")
        flat = re.compile(re.escape(flat_prefix) + _RANK + re.escape(flat_suffix + SUFFIX))
        patterns.append(f"{glob_escape(base)}/{glob_escape(flat_prefix)}*{glob_escape(flat_suffix + SUFFIX)}")
    fallbacks: dict[int, str] = {}
    listed = {path: info for pattern in patterns for path, info in fs.glob(pattern, detail=True).items()}
    for path in sorted(listed):
        relative = path[len(base) + 1 :]
        if listed[path].get("type") == "directory":
            continue
        if (match := own.fullmatch(relative)) is not None:
            rank, tail = int(match[1]), match[2]
            found.sizes[path] = int(listed[path].get("size") or 0)
            if tail == "":
                found.files[rank] = path
            elif tail == SUFFIX:
                found.markers[rank] = path
            elif tail == HOST_SUFFIX:
                found.hosts[rank] = path
            elif tail.startswith(".part-"):
                found.parts.setdefault(rank, []).append(path)
            else:
                found.rotated.setdefault(rank, []).append(path)
        elif flat is not None and (match := flat.fullmatch(relative)) is not None:
            fallbacks[int(match[1])] = path
    for paths in found.rotated.values():
        paths.sort(key=lambda path: int(path.rsplit(".", 1)[1]))
    for rank, paths in found.parts.items():
        found.files.setdefault(rank, paths[0][: paths[0].rindex(".part-")])
    found.markers = {**fallbacks, **found.markers}  # beside the file first
    return found


def _pattern(base: str, prefix: str, suffix: str) -> str:
    return f"{glob_escape(base)}/{glob_escape(prefix)}*" + (f"{glob_escape(suffix)}*" if suffix else "")
