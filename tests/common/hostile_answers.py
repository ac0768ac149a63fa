"""The corpus of hostile service answers for the device client: each case mutates a consistent
``Scenario`` (``tests/common/hostile_server.py``) and names the error code the client must give.
A new attack is one more row. ``Where`` gives a case the paths outside ``--dest`` that it aims
at: ``victim`` is an existing file that must survive, ``planted`` a path that must not appear."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.common.hostile_server import BIN, MODEL, Raw, Scenario, Slow, canonical, ranged


@dataclass(frozen=True)
class Where:
    victim: Path
    planted: Path


@dataclass(frozen=True)
class Case:
    name: str
    code: str  # the error the client must raise; "ok" for an answer it must accept
    mutate: Callable[[Scenario, Where], None]
    ask: dict[str, Any] = field(default_factory=dict)  # install() arguments over the defaults
    # How the client fetches the blobs: "stream" (one request per file) and "ranged" (RANGE
    # parts over several connections, tests/integration/test_hostile_server.py makes the
    # small blobs of the scenario large enough for it). A case about ranges runs ranged only.
    modes: tuple[str, ...] = ("stream", "ranged")


def _file(s: Scenario, name: str) -> dict[str, Any]:
    return next(f for f in s.manifest["files"] if f["name"] == name)


def _set(path: str, value: Any) -> Callable[[Scenario, Where], None]:
    """Set ``answer.x`` or ``manifest.x.y`` (dots), or the ``.bin`` file entry's ``files.KEY``."""
    def mutate(s: Scenario, w: Where) -> None:
        where, *keys = path.split(".")
        obj: Any = _file(s, "model_ctx_qnn.bin") if where == "files" else getattr(s, where)
        for k in keys[:-1]:
            obj = obj[k]
        obj[keys[-1]] = value(w) if callable(value) else value
    return mutate


def _raw(path: str, raw: Callable[[Scenario], Raw]) -> Callable[[Scenario, Where], None]:
    def mutate(s: Scenario, w: Where) -> None:
        s.seal()
        target = path.replace("{bin}", s.digest_of("model_ctx_qnn.bin")).replace("{manifest}", s.answer["artifact"])
        s.routes[target] = raw(s)
    return mutate


def _manifest_bytes(data: bytes) -> Callable[[Scenario, Where], None]:
    def mutate(s: Scenario, w: Where) -> None:
        s.manifest_bytes = data
    return mutate


def _redirect(location: str, status: int = 302) -> Callable[[Scenario], Raw]:
    return lambda s: Raw(status, [("Location", location.replace("{bin}", s.digest_of("model_ctx_qnn.bin")))])


def _nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def _lying_manifest_digest(s: Scenario, w: Where) -> None:
    """The answer names one manifest digest, the blob under it is another manifest."""
    s.seal()
    other = dict(s.manifest, ctxModel="model_ctx_qnn.bin")
    data = canonical(other)
    s.keep_answer_digest = True
    s.manifest_bytes = data
    s.answer["manifest_size"] = len(data)


def _blob_longer_declared(s: Scenario, w: Where) -> None:
    s.seal()
    s.routes[f"/v1/blobs/{s.digest_of('model_ctx_qnn.bin')}"] = Raw(200, [], BIN + b"X" * 100)


def _blob_longer_undeclared(good: bool) -> Callable[[Scenario, Where], None]:
    def mutate(s: Scenario, w: Where) -> None:
        s.seal()
        body = (BIN if good else b"Y" * len(BIN)) + b"X" * 4096
        s.routes[f"/v1/blobs/{s.digest_of('model_ctx_qnn.bin')}"] = Raw(200, [], body, length=False)
    return mutate


def _loop(s: Scenario, w: Where) -> None:
    s.seal()
    path = f"/v1/blobs/{s.digest_of('model_ctx_qnn.bin')}"
    s.routes[path] = Raw(302, [("Location", path)])


def _chain(s: Scenario, w: Where) -> None:
    s.seal()
    s.routes[f"/v1/blobs/{s.digest_of('model_ctx_qnn.bin')}"] = Raw(302, [("Location", "/hop/0")])
    for i in range(20):
        s.routes[f"/hop/{i}"] = Raw(302, [("Location", f"/hop/{i + 1}")])


def _good_redirect(s: Scenario, w: Where) -> None:
    """A presigned-URL style 307 to another path of the same host: followed, without the token."""
    s.seal()
    digest = s.digest_of("model_ctx_qnn.bin")
    s.routes[f"/v1/blobs/{digest}"] = Raw(307, [("Location", f"/store/{digest[7:]}?X-Amz-Signature=abc")])
    s.routes[f"/store/{digest[7:]}"] = Raw(200, [], BIN)


def _plant(s: Scenario, w: Where) -> None:
    """An absolute "digest" whose blob the server serves: the old client wrote it there."""
    digest = f"sha256:{w.planted}"
    _file(s, "model_ctx_qnn.bin").update(digest=digest, size=len(b"planted"))
    s.blobs[digest] = b"planted"


def _signature(sig: Any) -> Callable[[Scenario, Where], None]:
    def mutate(s: Scenario, w: Where) -> None:
        s.answer["signatures"] = sig
    return mutate


def _ranges(answer: Callable[[Any, bytes, bool], Raw]) -> Callable[[Scenario, Where], None]:
    """The .bin's route answers each request with ``answer(request, BIN, first)``, ``first``
    whether it asks from byte 0 (the first range, the one a client asks first)."""
    def mutate(s: Scenario, w: Where) -> None:
        s.seal()
        s.routes[f"/v1/blobs/{s.digest_of('model_ctx_qnn.bin')}"] = lambda request: answer(
            request, BIN, (request.headers.get("Range") or "bytes=0-").startswith("bytes=0-"))
    return mutate


def _later(bad: Callable[[Any, bytes], Raw]) -> Callable[[Any, bytes, bool], Raw]:
    """Honest for the first range, ``bad`` for every later one."""
    return lambda request, data, first: ranged(request, data) if first else bad(request, data)


def _shifted(request: Any, data: bytes) -> Raw:
    """The bytes asked, labelled one byte later than they are (a server off by one)."""
    good = ranged(request, data)
    start, end = (int(x) for x in dict(good.headers)["Content-Range"][6:].split("/")[0].split("-"))
    return Raw(206, [("Content-Range", f"bytes {start + 1}-{end + 1}/{len(data)}")], good.body)


def _range_headers(request: Any, data: bytes, **change: Any) -> Raw:
    good = ranged(request, data)
    return Raw(good.status, change.get("headers", good.headers), change.get("body", good.body),
               change.get("length", True))


def _content_range_total(request: Any, data: bytes) -> Raw:
    good = ranged(request, data)
    cr = dict(good.headers)["Content-Range"]
    return Raw(206, [("Content-Range", cr.split("/")[0] + f"/{len(data) * 2}")], good.body)


def _ranged_redirect(s: Scenario, w: Where) -> None:
    """A presigned-URL style 307 for every request to the service; the store honours ranges.
    After the first range, the client asks the store directly."""
    s.seal()
    digest = s.digest_of("model_ctx_qnn.bin")
    s.routes[f"/v1/blobs/{digest}"] = Raw(307, [("Location", f"/store/{digest[7:]}?X-Amz-Signature=abc")])
    s.routes[f"/store/{digest[7:]}"] = lambda request: ranged(request, BIN)


def _store_expires(s: Scenario, w: Where) -> None:
    """The store refuses the presigned URL after its first range (it expired): the client asks the
    service again for each refused range, and the service redirects afresh."""
    s.seal()
    digest = s.digest_of("model_ctx_qnn.bin")
    seen = [0]

    def store(request: Any) -> Raw:
        seen[0] += 1
        if "fresh" not in request.path and seen[0] > 1:
            return Raw(403, [], b"<Error><Code>AccessDenied</Code><Message>Request has expired</Message></Error>")
        return ranged(request, BIN)
    s.routes[f"/v1/blobs/{digest}"] = lambda request: Raw(
        307, [("Location", f"/store/{digest[7:]}?X-Amz-Signature={'fresh' if seen[0] else 'old'}")])
    s.routes[f"/store/{digest[7:]}"] = store


RANGED = ("ranged",)
RANGE_CASES: list[Case] = [
    Case("ranges ignored: 200 with the whole blob to every Range", "ok",
         _ranges(lambda request, data, first: Raw(200, [], data)), modes=RANGED),
    Case("ranges: presigned-style redirect, the other ranges straight from the store", "ok", _ranged_redirect,
         modes=RANGED),
    Case("ranges: the presigned URL expires mid-download, redirected afresh", "ok", _store_expires, modes=RANGED),
    Case("ranges: a later range answered 200 with the whole blob", "server-error",
         _ranges(_later(lambda request, data: Raw(200, [], data))), modes=RANGED),
    Case("ranges: a later range answered 200 with just its bytes", "server-error",
         _ranges(_later(lambda request, data: Raw(200, [], ranged(request, data).body))), modes=RANGED),
    Case("ranges: the first range answered 206 with the whole blob", "server-error",
         _ranges(lambda request, data, first: Raw(206, [("Content-Range", f"bytes 0-{len(data) - 1}/{len(data)}")], data)),
         modes=RANGED),
    Case("ranges: wrong Content-Range (off by one)", "server-error", _ranges(_later(_shifted)), modes=RANGED),
    Case("ranges: Content-Range of another total size", "server-error", _ranges(_later(_content_range_total)),
         modes=RANGED),
    Case("ranges: no Content-Range", "server-error",
         _ranges(_later(lambda request, data: _range_headers(request, data, headers=[]))), modes=RANGED),
    Case("ranges: more bytes than asked, declared", "server-error",
         _ranges(_later(lambda request, data: _range_headers(request, data, body=ranged(request, data).body + b"X" * 500))),
         modes=RANGED),
    Case("ranges: more bytes than asked, undeclared: reading stops at the range's end", "ok",
         _ranges(_later(lambda request, data: _range_headers(request, data, body=ranged(request, data).body + b"X" * 500,
                                                             length=False))), modes=RANGED),
    Case("ranges: fewer bytes than asked, connection closed", "server-error",
         _ranges(_later(lambda request, data: _range_headers(request, data, body=ranged(request, data).body[:10],
                                                             length=False))), modes=RANGED),
    Case("ranges: content changes between requests", "digest-mismatch",
         _ranges(lambda request, data, first: ranged(request, data if first else bytes(255 - b for b in data))),
         modes=RANGED),
    Case("ranges: 416 to a range of the blob", "server-error",
         _ranges(_later(lambda request, data: Raw(416, [("Content-Range", f"bytes */{len(data)}")], b""))),
         modes=RANGED),
]

TRUSTED = "11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo="  # an ed25519 public key (base64 of 32 bytes)

CASES: list[Case] = [
    # The control: the unmodified scenario installs.
    Case("control", "ok", lambda s, w: None),
    Case("presigned-style redirect", "ok", _good_redirect),
    Case("blob longer, no length, right prefix: reading stops at the declared size", "ok", _blob_longer_undeclared(True)),
    # Paths from digests and names (the critical class).
    Case("digest path traversal", "bad-manifest", _set("files.digest", lambda w: "sha256:../victim/keep.txt")),
    Case("digest path traversal, declared smaller than the victim (deleted it)", "bad-manifest",
         lambda s, w: (_set("files.digest", "sha256:../victim/keep.txt")(s, w), _set("files.size", 1)(s, w))),
    Case("digest absolute path, served (planted it)", "bad-manifest", _plant),
    Case("digest absolute path", "bad-manifest", _set("files.digest", lambda w: f"sha256:{w.planted}")),
    Case("digest uppercase hex", "bad-manifest", _set("files.digest", "sha256:" + "AB" * 32)),
    Case("digest other algorithm", "bad-manifest", _set("files.digest", "md5:" + "ab" * 16)),
    Case("digest not text", "bad-manifest", _set("files.digest", 12345)),
    Case("name traversal", "bad-manifest", _set("files.name", "../victim/keep.txt")),
    Case("name absolute", "bad-manifest", _set("files.name", lambda w: str(w.planted))),
    Case("name backslash", "bad-manifest", _set("files.name", "..\\..\\evil.bin")),
    Case("name drive", "bad-manifest", _set("files.name", "C:evil.bin")),
    Case("name NUL", "bad-manifest", _set("files.name", "a\x00.bin")),
    Case("name dot component", "bad-manifest", _set("files.name", "a/./b.bin")),
    Case("name empty component", "bad-manifest", _set("files.name", "a//b.bin")),
    Case("name hidden", "bad-manifest", _set("files.name", ".ctxfarm-lock")),
    Case("name control character", "bad-manifest", _set("files.name", "a\x1b[2J.bin")),
    Case("name too long", "bad-manifest", _set("files.name", "a" * 5000)),
    Case("name is a list", "bad-manifest", _set("files.name", ["a"])),
    Case("name twice", "bad-manifest", _set("files.name", "model_ctx.onnx")),
    Case("name both file and directory", "bad-manifest", _set("files.name", "model_ctx.onnx/x.bin")),
    Case("ctxModel outside the files", "bad-manifest", _set("manifest.ctxModel", "../victim/keep.txt")),
    # Sizes.
    Case("size negative", "bad-manifest", _set("files.size", -1)),
    Case("size a string", "bad-manifest", _set("files.size", str(len(BIN)))),
    Case("size a float", "bad-manifest", _set("files.size", float(len(BIN)))),
    Case("size a bool", "bad-manifest", _set("files.size", True)),
    Case("size astronomical", "bad-manifest", _set("files.size", 2**64)),
    Case("sizes past the device's free space (64 TiB declared)", "storage-error",
         lambda s, w: s.manifest["files"].extend({"name": f"huge{i}.bin", "digest": "sha256:" + f"{i:064x}",
                                                  "size": 1 << 40} for i in range(64))),
    # Manifest shape.
    Case("manifest not JSON", "bad-manifest", _manifest_bytes(b"\x89PNG not json")),
    Case("manifest a list", "bad-manifest", _manifest_bytes(b"[1, 2, 3]")),
    Case("manifest nested past the stack", "bad-manifest", _manifest_bytes(_nested(200_000))),
    Case("manifest NaN", "bad-manifest", _manifest_bytes(b'{"model": NaN}')),
    Case("manifest without files", "bad-manifest", _set("manifest.files", [])),
    Case("manifest files not a list", "bad-manifest", _set("manifest.files", {"a": 1})),
    Case("manifest target not an object", "bad-manifest", _set("manifest.target", "SM8650")),
    Case("manifest unknown backend", "bad-manifest", _set("manifest.backend", "cuda")),
    Case("manifest file entry a string", "bad-manifest", _set("manifest.files", ["model_ctx.onnx"])),
    # The manifest must be the one named, and say what the answer said.
    Case("manifest digest mismatch", "bad-manifest", _lying_manifest_digest),
    Case("manifest for another target", "bad-manifest", _set("manifest.target.name", "SM8550")),
    Case("manifest for another model", "bad-manifest", _set("manifest.model", "sha256:" + "cd" * 32)),
    Case("manifest for another toolchain", "bad-manifest", _set("manifest.toolchain.version", "2.49.40")),
    Case("manifest for another backend", "bad-manifest", _set("manifest.backend", "trt")),
    # The answer: shape, size and binding to the question.
    Case("answer not JSON", "server-error", _raw("/v1/resolve", lambda s: Raw(200, [], b"<html>hello</html>"))),
    Case("answer a list", "server-error", lambda s, w: setattr(s, "answer", [])),
    Case("answer oversized, declared", "server-error",
         _raw("/v1/resolve", lambda s: Raw(200, [], b" " * (5 << 20)))),
    Case("answer oversized, undeclared", "server-error",
         _raw("/v1/resolve", lambda s: Raw(200, [], b" " * (5 << 20), length=False))),
    Case("answer nested past the stack", "server-error", _raw("/v1/resolve", lambda s: Raw(200, [], _nested(200_000)))),
    Case("answer artifact traversal", "server-error",
         lambda s, w: (s.seal(), s.answer.update(artifact="sha256:../../victim/keep.txt"),
                       setattr(s, "keep_answer_digest", True))),
    Case("answer artifact absolute", "server-error",
         lambda s, w: (s.seal(), s.answer.update(artifact=f"sha256:{w.planted}"), setattr(s, "keep_answer_digest", True))),
    Case("answer artifact missing", "server-error",
         lambda s, w: (s.seal(), s.answer.pop("artifact"), setattr(s, "keep_answer_digest", True))),
    Case("answer model not a digest", "server-error", _set("answer.model", "../../x")),
    Case("answer manifest_size a string", "server-error",
         lambda s, w: (s.seal(), s.answer.update(manifest_size="10"), setattr(s, "keep_answer_digest", True))),
    Case("answer manifest_size huge", "server-error",
         lambda s, w: (s.seal(), s.answer.update(manifest_size=1 << 40), setattr(s, "keep_answer_digest", True))),
    Case("answer manifest_size too small", "server-error",
         lambda s, w: (s.seal(), s.answer.update(manifest_size=10), setattr(s, "keep_answer_digest", True))),
    Case("answer URLs to file:// and elsewhere: never used", "ok",
         _set("answer.manifest_url", lambda w: f"file://{w.victim}")),
    Case("answer signatures not a list", "server-error", _signature("all good")),
    Case("answer signatures entries not objects", "server-error", _signature([1, 2])),
    Case("answer for another backend", "server-error",
         lambda s, w: (s.answer.update(backend="trt"), s.manifest.update(backend="trt"))),
    Case("answer for another SoC", "server-error",
         lambda s, w: (s.answer.update(target="SM8550"), s.manifest["target"].update(name="SM8550"))),
    Case("answer for another model", "server-error",
         lambda s, w: (s.answer.update(model="sha256:" + "cd" * 32), s.manifest.update(model="sha256:" + "cd" * 32)),
         ask={"model": MODEL}),
    Case("answer built by a newer QNN than the device runs", "server-error",
         lambda s, w: (s.answer.update(toolchain="2.52.0"), s.manifest["toolchain"].update(version="2.52.0"))),
    Case("answer a TensorRT engine for another TensorRT", "server-error",
         lambda s, w: (s.answer.update(backend="trt", target="sm_89", toolchain="10.13.0.35+linux-x86-64"),
                       s.manifest.update(backend="trt", target={"name": "sm_89"},
                                         toolchain={"version": "10.13.0.35+linux-x86-64"})),
         ask={"soc": None, "qnn": None, "gpu": "sm_89", "trt": "10.14.1.48"}),
    # Error answers: relayed only as documented 4xx codes, cleaned; the service's failures are its own.
    Case("500 internal-error", "server-error", _raw("/v1/resolve", lambda s: Raw(
        500, [], json.dumps({"error": {"code": "internal-error", "message": "boom"}}).encode()))),
    Case("500 bad-config", "server-error", _raw("/v1/resolve", lambda s: Raw(
        500, [], json.dumps({"error": {"code": "bad-config", "message": "FARM_BROKER_URL is not set"}}).encode()))),
    Case("4xx unknown code", "server-error", _raw("/v1/resolve", lambda s: Raw(
        418, [], json.dumps({"error": {"code": "teapot", "message": "short and stout"}}).encode()))),
    Case("4xx error body a string", "server-error", _raw("/v1/resolve", lambda s: Raw(400, [], b'"nope"'))),
    Case("4xx error body oversized", "server-error", _raw("/v1/resolve", lambda s: Raw(400, [], b" " * (1 << 20)))),
    Case("404 no-match relayed, escapes cleaned", "no-match", _raw("/v1/resolve", lambda s: Raw(
        404, [], json.dumps({"error": {"code": "no-match", "message": "nothing \x1b[31mred\x1b[0m",
                                       "hint": "\x1b]0;title\x07"}}).encode()))),
    # Blobs: declared sizes, digests.
    Case("blob longer than declared", "server-error", _blob_longer_declared),
    Case("blob longer, no length, wrong bytes", "digest-mismatch", _blob_longer_undeclared(False)),
    Case("blob shorter, declared", "server-error",
         _raw("/v1/blobs/{bin}", lambda s: Raw(200, [], BIN[:100]))),
    Case("blob shorter, connection closed", "server-error",
         _raw("/v1/blobs/{bin}", lambda s: Raw(200, [], BIN[:100], length=False))),
    Case("blob other bytes", "digest-mismatch", _raw("/v1/blobs/{bin}", lambda s: Raw(200, [], b"Z" * len(BIN)))),
    Case("blob 206 to a request without Range", "server-error", _raw("/v1/blobs/{bin}", lambda s: Raw(
        206, [("Content-Range", f"bytes 0-{len(BIN) - 1}/{len(BIN)}")], BIN))),
    Case("manifest longer than declared", "server-error", _raw("/v1/blobs/{manifest}", lambda s: Raw(
        200, [], s.blobs[s.answer["artifact"]] + b" " * 10))),
    # Redirects: http(s) only, bounded, no loops.
    Case("redirect to file://", "server-error", _raw("/v1/blobs/{bin}", _redirect("file:///etc/passwd"))),
    Case("redirect to ftp://", "server-error", _raw("/v1/blobs/{bin}", _redirect("ftp://127.0.0.1/x"))),
    Case("redirect to data:", "server-error", _raw("/v1/blobs/{bin}", _redirect("data:,hello"))),
    Case("redirect of the answer to file://", "server-error", _raw("/v1/resolve", _redirect("file:///etc/passwd", 307))),
    Case("redirect loop", "server-error", _loop),
    Case("redirect chain past the bound", "server-error", _chain),
    # Headers past http.client's bounds.
    Case("too many headers", "server-error", _raw("/v1/resolve", lambda s: Raw(
        200, [(f"X-H{i}", "v") for i in range(300)], b"{}"))),
    Case("header line too long", "server-error", _raw("/v1/resolve", lambda s: Raw(200, [("X-Long", "v" * 70_000)], b"{}"))),
    Case("status line garbage", "server-error", _raw("/v1/resolve", lambda s: Raw(999, [], b"{}"))),
    # Slow peers: a device waits a bounded time (the tests ask for a 1 s timeout).
    Case("answer never comes", "server-error",
         lambda s, w: s.routes.update({"/v1/resolve": Slow(stall=5)}), ask={"timeout": 1.0}),
    Case("answer trickles past its deadline", "server-error",
         lambda s, w: s.routes.update({"/v1/resolve": Slow(body=b" " * 100 + b"{}", per_byte=0.1)}),
         ask={"timeout": 1.0}),
    # Signatures, with a trusted key configured: never internal-error.
    Case("signature garbage", "signature-invalid",
         _signature([{"public_key": TRUSTED, "signature": "!!not base64!!"}]), ask={"trusted_keys": [TRUSTED]}),
    Case("signature missing", "unsigned", _signature([]), ask={"trusted_keys": [TRUSTED]}),
    Case("signature by another key", "signature-invalid",
         _signature([{"public_key": "AAAA", "signature": "AAAA"}]), ask={"trusted_keys": [TRUSTED]}),
    *RANGE_CASES,
]


# ---- a wrong type in each field a device reads, of each answer kind ------------------------------
# Every value of another JSON type than the field's: a device refuses each with the answer kind's
# code (server-error for an answer, bad-manifest for a document fetched by its digest) before
# any field is used, and places nothing.
WRONG: dict[str, list[Any]] = {
    "text": [5, ["x"], {"x": 1}, None, True],
    "whole": ["10", 1.5, [1], {"x": 1}, None, True],
    "list": ["x", 5, {"x": 1}, None],
    "object": ["x", 5, ["x"], None],
}
_SIGNED = [{"public_key": "AAAA", "signature": "AAAA"}]
_STAGES = {"stages": [{"file": "model_ctx.onnx", "role": "embeddings"}]}
_GRAPHS = [{"ctxModel": "model_ctx.onnx", "name": "prefill"}]

# (field path, its type, what the document holds there first when the field is inside an
# optional part; the answer's digest and size fields are kept as set, not resealed).
RESOLVE_FIELDS: list[tuple[str, str, tuple[str, Any] | None]] = [
    ("artifact", "text", None), ("model", "text", None), ("backend", "text", None), ("target", "text", None),
    ("toolchain", "text", None), ("manifest_size", "whole", None), ("signatures", "list", None),
    ("signatures.0", "object", ("signatures", _SIGNED)),
    ("signatures.0.public_key", "text", ("signatures", _SIGNED)),
    ("signatures.0.signature", "text", ("signatures", _SIGNED)),
]
MANIFEST_FIELDS: list[tuple[str, str, tuple[str, Any] | None]] = [
    ("model", "text", None), ("backend", "text", None), ("ctxModel", "text", None), ("target", "object", None),
    ("target.name", "text", None), ("toolchain", "object", None), ("toolchain.version", "text", None),
    ("files", "list", None), ("files.1", "object", None), ("files.1.name", "text", None),
    ("files.1.digest", "text", None), ("files.1.size", "whole", None), ("options", "object", None),
    ("options.hardware_compatibility_level", "text", None),
    ("genai", "object", None), ("genai.stages", "list", ("genai", _STAGES)),
    ("genai.stages.0", "object", ("genai", _STAGES)), ("genai.stages.0.file", "text", ("genai", _STAGES)),
    ("genai.stages.0.role", "text", ("genai", _STAGES)),
    ("graphs", "list", None), ("graphs.0", "object", ("graphs", _GRAPHS)),
    ("graphs.0.ctxModel", "text", ("graphs", _GRAPHS)), ("graphs.0.name", "text", ("graphs", _GRAPHS)),
]
PACKAGE_ANSWER_FIELDS: list[tuple[str, str, tuple[str, Any] | None]] = [
    ("digest", "text", None), ("record_size", "whole", None), ("signatures", "list", None),
    ("signatures.0", "object", ("signatures", _SIGNED)),
    ("signatures.0.public_key", "text", ("signatures", _SIGNED)),
    ("signatures.0.signature", "text", ("signatures", _SIGNED)),
]
REPORT_ANSWER_FIELDS: list[tuple[str, str, tuple[str, Any] | None]] = [
    ("report", "whole", None), ("artifact", "text", None), ("runtime", "text", None), ("soc", "text", None),
    ("outcome", "text", None),
]
PACKAGE_RECORD_FIELDS: list[tuple[str, str, tuple[str, Any] | None]] = [
    ("kind", "text", None), ("files", "list", None), ("files.1", "object", None), ("files.1.path", "text", None),
    ("files.1.digest", "text", None), ("files.1.size", "whole", None), ("directories", "list", None),
    ("directories.0", "text", None),
]


def put(doc: Any, path: str, value: Any) -> None:
    """``doc`` at ``path`` (dotted keys, list indexes as numbers) set to ``value``."""
    *keys, last = [int(k) if k.isdigit() else k for k in path.split(".")]
    for k in keys:
        doc = doc[k]
    doc[last] = value


@dataclass(frozen=True)
class TypeCase:
    """One wrong value at one field of one answer kind (``resolve``, ``manifest``,
    ``package-answer``, ``package-record``, ``report-answer``) and the code a device answers."""

    kind: str
    path: str
    value: Any
    code: str

    @property
    def name(self) -> str:
        return f"{self.kind}: {self.path} = {json.dumps(self.value)}"

    def mutate(self, s: Any) -> None:
        """Change a ``Scenario`` (resolve, manifest), a ``PackageScenario`` (the package kinds) or
        an object with an ``answer`` (the report answer)."""
        doc = {"resolve": "answer", "manifest": "manifest", "package-answer": "answer",
               "package-record": "record", "report-answer": "answer"}[self.kind]
        fields = {"resolve": RESOLVE_FIELDS, "manifest": MANIFEST_FIELDS, "package-answer": PACKAGE_ANSWER_FIELDS,
                  "package-record": PACKAGE_RECORD_FIELDS, "report-answer": REPORT_ANSWER_FIELDS}[self.kind]
        first = next(f[2] for f in fields if f[0] == self.path)
        if self.kind in ("resolve", "package-answer"):
            s.seal()  # the digest and size of the document it names, then the answer changed as is
            s.keep_answer_digest = True
        target = getattr(s, doc)
        if first is not None:
            target[first[0]] = json.loads(json.dumps(first[1]))
        put(target, self.path, self.value)


def _type_cases(kind: str, fields: list[tuple[str, str, tuple[str, Any] | None]], code: str) -> list[TypeCase]:
    return [TypeCase(kind, path, value, code) for path, of, _ in fields for value in WRONG[of]]


TYPE_CASES: list[TypeCase] = [*_type_cases("resolve", RESOLVE_FIELDS, "server-error"),
                              *_type_cases("manifest", MANIFEST_FIELDS, "bad-manifest")]
PACKAGE_TYPE_CASES: list[TypeCase] = [*_type_cases("package-answer", PACKAGE_ANSWER_FIELDS, "server-error"),
                                      *_type_cases("package-record", PACKAGE_RECORD_FIELDS, "bad-manifest")]
# POST /v1/reports (farm.client_report.send): the answer is ``REPORTED`` with one field changed.
REPORTED = {"report": 7, "artifact": "sha256:" + "cd" * 32, "runtime": "qnn:2.51.0", "soc": "SM8650", "outcome": "loads"}
REPORT_TYPE_CASES: list[TypeCase] = _type_cases("report-answer", REPORT_ANSWER_FIELDS, "server-error")
