"""A static check of Lightning code: collective calls under a rank guard, found before the job starts.

``lightning-ext check PATH...`` (or ``python -m lightning_ext.check``) reads Python files with :mod:`ast`; it imports
neither Lightning nor torch. The rules and the codes: docs/check.md.
"""

from lightning_ext.check.codes import KINDS, Kind
from lightning_ext.check.files import Checked, check_paths
from lightning_ext.check.findings import Finding
from lightning_ext.check.source import check_source

__all__ = ["KINDS", "Checked", "Finding", "Kind", "check_paths", "check_source"]
