"""Unit tests: no servers, no toolchain. Makes ``tests.common`` importable however pytest is run."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# `pytest` (unlike `python -m pytest`) does not put the repository root on sys.path, and the
# editable install maps only the project packages, not tests/.
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
