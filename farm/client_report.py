"""Device reports from the device side (docs/evidence.md): the standard library only,
like ``farm.client``. An app that loads the artifact itself calls ``report``::

    from farm.client_report import report
    report("http://farm:8080", report_token, artifact=result.artifact, soc="SM8650",
           runtime_version="2.51.0", outcome="loads", load_ms=8.1, first_inference_ms=2.3,
           onnxruntime="1.31.1", ep_package="onnxruntime-qnn", ep_version="2.7.0")

``farm install --report`` and ``farm report`` use the same call. The report is checked here
before it is sent (the service checks it again: it trusts no device), the answer is read up to
``MAX_ANSWER_BYTES``, held to its shape (``farm.client.shapes.REPORT_ANSWER``) and bound to
the question (the artifact it names). The token is a ``report`` token (``farm token create
NAME --scope report``): it can report and do nothing else.
"""

from __future__ import annotations

import hashlib
import json
import math
import platform
import re
import socket
from datetime import UTC, datetime
from typing import Any

from farm.core.errors import ServerError, UsageError

MAX_ANSWER_BYTES = 64 * 1024
MAX_ERROR_CHARS = 4000  # the service refuses longer error texts: the tail is kept (the cause is last)
OUTCOMES = ("loads", "fails", "crashed")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_IDENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@/+-]*")
# What the service refuses in free text (farm.core.text.unprintable: Unicode categories Cc, Cf,
# Zl, Zp, Cs, Co, Cn: controls incl. CR/LF/tab and C1, format and bidi characters); here each is
# replaced by a space before sending (this module is standard library only, like farm.client).
_HIDDEN = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"})
# Hosts the farm itself could be (registry.reports.FARM_HOSTS): a QNN runtime there is the HTP
# simulator, and the service refuses its reports (422 not-device-evidence).
SIMULATOR_ARCHES = frozenset({"x86_64", "amd64", "x64", "x86-64", "x86", "i386", "i686"})


def device_id() -> str:
    """A stable, anonymous id of this machine: sha256 of /etc/machine-id (or the host name), 32
    hex digits (FARM_DEVICE_ID, when set, is taken as it is: a fleet's own ids, simulated devices).
    The service counts one device once, however often it reports."""
    import os

    given = os.environ.get("FARM_DEVICE_ID", "").strip()
    if given:
        return given
    seed = ""
    for path in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        try:
            with open(path) as f:
                seed = f.read(256).strip()
            if seed:
                break
        except OSError:
            continue
    seed = seed or socket.gethostname()
    return hashlib.sha256(f"ctxfarm-device:{seed}".encode()).hexdigest()[:32]


def _text(value: str | None, limit: int) -> str | None:
    import unicodedata

    if value is None:
        return None
    text = str(value)
    if not (text.isascii() and text.isprintable()):
        text = "".join(" " if unicodedata.category(ch) in _HIDDEN else ch for ch in text)
    return text[:limit]


def host_arch() -> str:
    """This machine's CPU architecture as the service takes it (``platform.machine()``)."""
    return platform.machine() or "unknown"


def is_simulator_host(arch: str | None = None) -> bool:
    """Whether a QNN runtime here would be the HTP simulator (x86_64/x86): never device evidence."""
    return (arch or host_arch()).strip().lower() in SIMULATOR_ARCHES


def make_report(*, artifact: str, soc: str, runtime_version: str, outcome: str, onnxruntime: str,
                device: str | None = None, device_model: str | None = None, os_name: str | None = None,
                ep_package: str | None = None, ep_version: str | None = None, driver: str | None = None,
                error: str | None = None, load_ms: float | None = None, first_inference_ms: float | None = None,
                peak_memory_mb: float | None = None, fingerprint: str | None = None,
                psnr_db: float | None = None, arch: str | None = None) -> dict[str, Any]:
    """The JSON body of ``POST /v1/reports``, checked (a usage error names the bad field).
    ``arch``: the CPU architecture the runtime ran on (default: this machine's)."""
    if not isinstance(artifact, str) or not _DIGEST.fullmatch(artifact):
        raise UsageError(f"artifact {str(artifact)[:80]!r} is not a manifest digest (sha256:...)")
    if outcome not in OUTCOMES:
        raise UsageError(f"outcome {outcome!r} is not one of {', '.join(OUTCOMES)}")
    ident = device or device_id()
    if not _IDENT.fullmatch(ident) or len(ident) > 128:
        raise UsageError(f"device id {ident[:80]!r} is not an identifier (letters, digits, ._:@/+-)")
    body: dict[str, Any] = {
        "artifact": artifact, "device_id": ident,
        "device_model": _text(device_model or platform.node() or "unknown", 128),
        "soc": str(soc)[:64], "os": _text(os_name or f"{platform.system()} {platform.release()}".strip(), 128),
        "arch": str(arch or host_arch())[:16],
        "runtime_version": str(runtime_version)[:64], "onnxruntime": str(onnxruntime)[:32], "outcome": outcome,
        "reported_at": datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
    }
    for key, value, limit in (("ep_package", ep_package, 64), ("ep_version", ep_version, 32), ("driver", driver, 128),
                              ("fingerprint", fingerprint, 128)):
        if value is not None:
            body[key] = _text(value, limit)
    if error is not None:
        body["error"] = _text(error, 10 * MAX_ERROR_CHARS)[-MAX_ERROR_CHARS:]  # type: ignore[index]
    for key, number in (("load_ms", load_ms), ("first_inference_ms", first_inference_ms),
                        ("peak_memory_mb", peak_memory_mb), ("psnr_db", psnr_db)):
        if number is not None:
            if isinstance(number, bool) or not isinstance(number, int | float) or not math.isfinite(number) \
                    or number < 0:
                raise UsageError(f"{key} {number!r} is not a non-negative number")
            body[key] = round(float(number), 3)
    return body


def send(server: str, token: str | None, body: dict[str, Any], *, timeout: float = 30.0) -> dict[str, Any]:
    """POST the report; returns the service's answer (``report`` id, ``runtime``, ``soc``), checked."""
    from farm.client import Client, shapes

    if not token:
        raise UsageError("a report needs a report token", hint="farm token create NAME --scope report; then "
                                                               "--report-token or FARM_REPORT_TOKEN")
    answer = Client(server, token, timeout=timeout).json("POST", "/v1/reports", body)
    shapes.conform(answer, shapes.REPORT_ANSWER, "the service's answer to a report", ServerError,
                   "the service sent an answer this client refuses: tell the service's operators")
    if answer["artifact"] != body["artifact"]:
        raise ServerError("the service's answer to a report is not one: "
                          f"{json.dumps(answer, default=str)[:200]}")
    return {k: answer[k] for k in ("report", "artifact", "runtime", "soc", "outcome") if k in answer}


def report(server: str, token: str | None, **fields: Any) -> dict[str, Any]:
    """``make_report(**fields)`` then ``send``: the one call for apps that load artifacts themselves."""
    timeout = float(fields.pop("timeout", 30.0))
    return send(server, token, make_report(**fields), timeout=timeout)
