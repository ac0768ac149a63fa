"""Validate a command's --json output against the JSON Schema the CLI ships for it
(farm/cli/schemas/<name>.json, draft 2020-12)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SCHEMAS = Path(__file__).resolve().parents[2] / "farm" / "cli" / "schemas"


def valid(name: str, text: str | Any) -> Any:
    """The parsed document (``text`` may be already parsed); fails listing the first errors."""
    from jsonschema import Draft202012Validator

    doc = json.loads(text) if isinstance(text, str) else text
    schema = json.loads((SCHEMAS / f"{name}.json").read_text())
    errors = sorted(Draft202012Validator(schema).iter_errors(doc), key=lambda e: list(e.path))
    assert not errors, f"{name}: " + "; ".join(f"{list(e.path)}: {e.message}" for e in errors[:5])
    return doc
