"""How the device client reads a service's error answer: the code a user sees is the one the
service meant, even when the answer has no body (a HEAD's) or is a 5xx about the request."""

from __future__ import annotations

import io
import json
import urllib.error

import pytest

from farm.client.transport import error_of


def _answer(status: int, body: bytes | None) -> urllib.error.HTTPError:
    fp = io.BytesIO(body) if body is not None else None
    return urllib.error.HTTPError("http://farm/v1/x", status, "Reason", {}, fp)  # type: ignore[arg-type]


def _body(code: str, hint: str = "the hint") -> bytes:
    return json.dumps({"error": {"code": code, "message": "the message", "hint": hint}}).encode()


@pytest.mark.parametrize("status,code", [(401, "unauthorized"), (403, "forbidden"), (404, "not-found"),
                                         (413, "too-large"), (429, "rate-limited")])
def test_a_bodiless_answer_is_named_by_its_status(status: int, code: str) -> None:
    for body in (None, b""):
        err = error_of(_answer(status, body))
        assert err.code == code and f"HTTP {status}" in err.message


def test_a_bodiless_5xx_is_the_services_failure() -> None:
    assert error_of(_answer(502, None)).code == "server-error"


def test_a_503_no_worker_keeps_the_services_code_and_hint() -> None:
    err = error_of(_answer(503, _body("no-worker", "this farm builds QNN 2.51.0")))
    assert err.code == "no-worker" and err.hint == "this farm builds QNN 2.51.0"


@pytest.mark.parametrize("code", ["internal-error", "storage-error", "bad-config", "some-newer-code"])
def test_the_services_own_failures_are_server_error(code: str) -> None:
    err = error_of(_answer(503, _body(code, "restart the S3 store")))
    assert err.code == "server-error" and "restart the S3 store" not in (err.hint or "")
