"""Fuzzing (hypothesis) of everything hostile input reaches before a compile: model bytes and
external-data attributes, manifests, names and settings. The properties: only documented
errors come out (never another exception), and nothing is written outside the target."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from farm.core.bundle import inspect_model
from farm.core.errors import BadNameError, ConfigError, FarmError, InvalidModelError
from farm.core.names import check_name, check_tag, safe_relative, split_ref
from farm.core.settings import Settings
from registry.install import fetch_artifact
from registry.models import Artifact, ArtifactFile
from registry.store.base import put_bytes
from tests.common.index_rows import digest
from tests.common.onnx_models import conv_relu_add
from tests.common.store import InMemoryBlobStore

# CTXFARM_FUZZ_EXAMPLES raises the budget for a long local hunt (3000 per property found the
# FARM_HOME='[' crash fixed in farm.core.settings).
FUZZ = settings(max_examples=int(os.environ.get("CTXFARM_FUZZ_EXAMPLES", "150")), deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def base_model(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return conv_relu_add(tmp_path_factory.mktemp("base") / "m.onnx").read_bytes()


@pytest.fixture(scope="module")
def external_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, bytes]:
    d = tmp_path_factory.mktemp("ext")
    path = conv_relu_add(d / "m.onnx", external=True)
    return path.read_bytes(), (d / "m.data").read_bytes()


mutation = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 10_000), st.integers(0, 255)),
    st.tuples(st.just("cut"), st.integers(0, 10_000), st.just(0)),
    st.tuples(st.just("insert"), st.integers(0, 10_000), st.integers(0, 255)),
)


def mutate(data: bytes, ops: list[tuple[str, int, int]]) -> bytes:
    buf = bytearray(data)
    for op, pos, value in ops:
        if not buf:
            break
        pos %= len(buf)
        if op == "flip":
            buf[pos] = value
        elif op == "cut":
            del buf[pos:]
        else:
            buf.insert(pos, value)
    return bytes(buf)


@FUZZ
@given(ops=st.lists(mutation, min_size=1, max_size=6))
def test_mutated_models_are_a_bundle_or_invalid_model(base_model: bytes, ops: list[tuple[str, int, int]]) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "m.onnx"
        path.write_bytes(mutate(base_model, ops))
        try:
            bundle = inspect_model(path)
        except InvalidModelError:
            return
        assert bundle.digest.startswith("sha256:")


location = st.one_of(
    st.text(alphabet=st.sampled_from(list("ab./\\\x00:-_ ")), max_size=12),
    st.sampled_from(["m.data", "./m.data", "../m.data", "/etc/passwd", "C:\\x", "m.data/", ".", "", "model.onnx"]),
)
number = st.one_of(st.integers(-10, 10**6).map(str), st.text(max_size=4), st.just("99999999999999999999"))


@FUZZ
@given(loc=location, offset=st.none() | number, length=st.none() | number)
def test_external_data_attributes(external_model: tuple[bytes, bytes], loc: str, offset: str | None,
                                  length: str | None) -> None:
    onnx_bytes, data = external_model
    with tempfile.TemporaryDirectory() as d:
        root = Path(d) / "bundle"
        root.mkdir()
        (root / "m.data").write_bytes(data)
        model = onnx.load_from_string(onnx_bytes)
        for t in model.graph.initializer:
            entries = {e.key: e for e in t.external_data}
            entries["location"].value = loc
            for key, value in (("offset", offset), ("length", length)):
                if value is None:
                    continue
                if key in entries:
                    entries[key].value = value
                else:
                    t.external_data.add(key=key, value=value)
        (root / "m.onnx").write_bytes(model.SerializeToString())
        before = sorted(os.listdir(d))
        try:
            bundle = inspect_model(root / "m.onnx")
        except InvalidModelError:
            return
        finally:
            assert sorted(os.listdir(d)) == before
        for f in bundle.external:
            safe_relative(f.path)  # accepted locations are canonical and inside the bundle


json_value = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 2**60) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=5),
    max_leaves=20,
)
file_name = st.one_of(st.sampled_from(["m_ctx.onnx", "m.bin", "../x", "/abs", "a/b", "a", "a/", ".", "",
                                        "x\\y", "m_ctx.onnx/z"]), st.text(max_size=8))


@st.composite
def manifests(draw: st.DrawFn) -> object:
    if draw(st.booleans()):
        return draw(json_value)
    files = draw(st.lists(st.fixed_dictionaries({
        "name": file_name, "digest": st.sampled_from([digest("a"), digest("b"), "sha256:xyz", 5]),
        "size": st.one_of(st.integers(-3, 40), st.text(max_size=3), st.booleans())}), max_size=4))
    doc = {"model": draw(st.sampled_from([digest("model"), "nope", None])), "backend": "qnn",
           "target": draw(st.sampled_from([{"name": "SM8650"}, {}, "SM8650"])),
           "toolchain": draw(st.sampled_from([{"version": "2.51.0"}, {"version": 2}])),
           "ctxModel": draw(file_name), "files": files}
    for key in draw(st.lists(st.sampled_from(sorted(doc)), max_size=2)):
        doc.pop(key, None)
    return doc


@FUZZ
@given(doc=manifests())
def test_crafted_manifests_never_escape_or_crash(doc: object) -> None:
    store = InMemoryBlobStore()
    for payload in (b"a", b"b"):
        put_bytes(store, payload)
    data = json.dumps(doc).encode()
    info = put_bytes(store, data)
    art = Artifact(digest=info.digest, ctx_model="m_ctx.onnx", model_digest=digest("model"), backend="qnn",
                   target="SM8650", toolchain="2.51.0")
    files = doc.get("files") if isinstance(doc, dict) else None
    art.files = [ArtifactFile(name=f["name"], role="context", digest=f["digest"], size=0, media_type="x")
                 for f in (files if isinstance(files, list) else [])
                 if isinstance(f, dict) and isinstance(f.get("name"), str) and isinstance(f.get("digest"), str)]
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        (root / "sibling").mkdir()
        try:
            fetch_artifact(store, art, root / "sibling" / "out")
        except FarmError:
            pass
        written = {str(p.relative_to(root)) for p in root.rglob("*")}
        assert all(w == "sibling" or w.startswith("sibling/out") or w == "sibling/.out.ctxfarm-lock"
                   for w in written), written


@FUZZ
@given(text=st.text(max_size=300))
def test_names_are_checked_or_refused(text: str) -> None:
    try:
        name, tag = split_ref(text)
    except BadNameError:
        return
    assert check_name(name) == name and check_tag(tag) == tag
    for part in name.split("/"):
        safe_relative(part)
        assert part not in (".", "..")


SETTING_KEYS = ["FARM_HOME", "FARM_DATABASE_URL", "FARM_STORE_URL", "FARM_BROKER_URL", "FARM_COMPILE_TIMEOUT",
                "FARM_COMPILE_MEMORY_MB", "FARM_MAX_ATTEMPTS", "FARM_LEASE_SECONDS", "FARM_REQUIRE_SIGNATURE",
                "FARM_TRUSTED_KEYS", "FARM_VISIBILITY_TIMEOUT", "FARM_RETRY_BACKOFF_SECONDS"]


@FUZZ
@given(env=st.dictionaries(st.sampled_from(SETTING_KEYS),
                           st.one_of(st.text(max_size=30), st.sampled_from(["inf", "nan", "-0", "1e309", "s3://",
                                                                            "s3://b/p?endpoint=x", "redis://:x",
                                                                            "postgresql://h:99999999/x"])),
                           max_size=4))
def test_settings_are_valid_or_bad_config(env: dict[str, str]) -> None:
    env = {k: v for k, v in env.items() if "\x00" not in v or k == "FARM_HOME"}
    env.setdefault("FARM_HOME", "/nonexistent/ctxfarm-fuzz")
    try:
        Settings.from_env(env)
    except ConfigError as exc:
        assert exc.code == "bad-config"
