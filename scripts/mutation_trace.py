"""A pytest plugin for scripts/mutation.py: which tests run each line of one module (``-p mutation_trace``).

``MUTATION_TRACE_MODULE`` names the module's file, ``MUTATION_TRACE_OUT`` the JSON file written at the end:
``{line: [test ids]}``, every line a test's set-up, call or tear-down ran, in any thread.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Generator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

_MODULE = str(Path(os.environ.get("MUTATION_TRACE_MODULE", "")).resolve())
_LINES: dict[int, set[str]] = {}
_current: list[str] = []


def _trace(frame: FrameType, event: str, arg: Any) -> Any:
    if frame.f_code.co_filename != _MODULE:
        return None  # no line events outside the module
    if event == "line" or event == "call":
        _LINES.setdefault(frame.f_lineno, set()).add(_current[-1])
    return _trace


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, None, None]:
    _current.append(item.nodeid)
    sys.settrace(_trace)
    threading.settrace(_trace)
    try:
        yield
    finally:
        sys.settrace(None)
        threading.settrace(None)
        _current.pop()


def pytest_sessionfinish(session: pytest.Session) -> None:
    out = os.environ.get("MUTATION_TRACE_OUT")
    if out:
        Path(out).write_text(json.dumps({line: sorted(tests) for line, tests in sorted(_LINES.items())}))
