"""The hostile device lab report corpus: figures a signed report body (``registry.verification
.parse_body``) must refuse with ``usage`` before anything is recorded. Each is the raw JSON of one
field's value, put into an otherwise good canonical body (NaN and the infinities are not JSON a
canonical body can hold: an agent that signs them by hand is refused all the same).

(class, field, raw JSON value)"""

from __future__ import annotations

from typing import Any

CASES: list[tuple[str, str, str]] = [
    ("negative latency", "p50_ms", "-1.0"),
    ("negative load", "load_ms", "-0.001"),
    ("NaN latency", "p50_ms", "NaN"),
    ("Infinity load", "load_ms", "Infinity"),
    ("-Infinity PSNR", "psnr_db", "-Infinity"),
    ("1e308 latency", "p50_ms", "1e+308"),
    ("1e308 first inference", "first_inference_ms", "1e+308"),
    ("1e308 memory", "peak_memory_mb", "1e+308"),
    ("PSNR past the agent's 200 dB cap", "psnr_db", "1000.0"),
    ("a latency of more than a day", "p50_ms", "86400001"),
    ("a 400-digit integer", "peak_memory_mb", "1" + "0" * 400),
    ("a boolean figure", "p50_ms", "true"),
    ("a figure as text", "p50_ms", '"30"'),
    ("a figure as a list", "psnr_db", "[60]"),
    ("negative runs", "runs", "-5"),
    ("fractional runs", "runs", "3.5"),
    ("1e308 runs", "runs", "1e+308"),
]


def body_text(good: dict[str, Any], field: str, raw: str) -> str:
    """The canonical text of ``good`` with ``field``'s value written as ``raw``."""
    from farm.core.signed_reports import canonical

    marker = "__hostile_value__"
    text = canonical({**good, field: marker})
    assert text.count(f'"{marker}"') == 1
    return text.replace(f'"{marker}"', raw)
