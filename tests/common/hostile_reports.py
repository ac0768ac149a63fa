"""The hostile device-report corpus: one case per class of report the service must
refuse, with the status and code it must refuse it with, and nothing written. The unit tests
parse each; tests/integration/test_reports_hostile.py posts each to the real service (SQLite
and PostgreSQL) against a real SM8650 artifact built with QNN 2.51.0, then checks that resolve's
answer for real devices did not move.

``over``: fields replacing those of a good report (``good_report``); ``None`` as a value drops
the field."""

from __future__ import annotations

from typing import Any

# (class, over, HTTP status, code)
CASES: list[tuple[str, dict[str, Any], int, str]] = [
    # who reported, on what
    ("simulator host (x86_64)", {"arch": "x86_64"}, 422, "not-device-evidence"),
    ("simulator host (amd64 spelling)", {"arch": "AMD64"}, 422, "not-device-evidence"),
    ("simulator host (32-bit x86)", {"arch": "i686"}, 422, "not-device-evidence"),
    ("no platform", {"arch": None}, 400, "usage"),
    ("unknown platform", {"arch": "pdp11"}, 400, "usage"),
    # reports obey the rules they report on
    ("another SoC than the build's", {"soc": "SM8750"}, 422, "report-soc-mismatch"),
    ("an older HTP arch than the build's", {"soc": "SM8550"}, 422, "report-soc-mismatch"),
    ("older runtime than the build's SDK says loads", {"runtime_version": "2.47.0"}, 422, "report-runtime-mismatch"),
    ("older runtime than the build's SDK says fails", {"runtime_version": "2.47.0", "outcome": "fails",
                                                      "error": "QNN_CONTEXT_ERROR"}, 422, "report-runtime-mismatch"),
    ("an SoC the catalog lacks", {"soc": "SM9999"}, 400, "unknown-target"),
    # printable means printable
    ("C0 control (NUL)", {"device_model": "Pixel\x00"}, 400, "usage"),
    ("ESC CSI colour", {"device_model": "\x1b[31mPixel"}, 400, "usage"),
    ("C1 CSI (lone 0x9b)", {"os": "Android\x9b2J"}, 400, "usage"),
    ("C1 NEL", {"driver": "v1\x85v2"}, 400, "usage"),
    ("line feed in error", {"outcome": "fails", "error": "ok\nFAKE LOG LINE"}, 400, "usage"),
    ("carriage return", {"os": "Android 15\rAndroid 16"}, 400, "usage"),
    ("tab", {"device_model": "Pixel\t9"}, 400, "usage"),
    ("bidi override (RLO)", {"device_model": "Pixel \u202e9 lexiP"}, 400, "usage"),
    ("bidi isolate (FSI)", {"os": "Android \u2068x\u2069"}, 400, "usage"),
    ("format: zero-width space", {"driver": "v\u200b1"}, 400, "usage"),
    ("format: byte-order mark", {"device_model": "\ufeffPixel"}, 400, "usage"),
    ("line separator", {"error": "a\u2028b", "outcome": "crashed"}, 400, "usage"),
    ("DEL", {"os": "Android\x7f"}, 400, "usage"),
]


def good_report(artifact: str, **over: Any) -> dict[str, Any]:
    """A report every check admits, for an SM8650 artifact built with QNN 2.51.0."""
    body: dict[str, Any] = {"artifact": artifact, "device_id": "dev-1", "device_model": "Galaxy S24", "soc": "SM8650",
                            "os": "Android 15", "arch": "aarch64", "runtime_version": "2.51.0",
                            "onnxruntime": "1.31.1", "outcome": "loads"}
    for k, v in over.items():
        if v is None:
            body.pop(k, None)
        else:
            body[k] = v
    return body
