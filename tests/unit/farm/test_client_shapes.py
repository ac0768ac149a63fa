"""The device client's shape checker (farm.client.shapes), without a server: each kind of shape
accepts its type and refuses every other (a bool is never a number), names the field it
refused by its path, and ``conform`` raises the error kind it is given."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from farm.client import shapes
from farm.client.shapes import DIGEST, Flag, ListOf, Obj, OneOf, ShapeError, Text, Whole, check, conform
from farm.core.errors import ManifestError, ServerError

GOOD_DIGEST = "sha256:" + "ab" * 32


@pytest.mark.parametrize(("shape", "good", "bad"), [
    (Text(), ["", "x"], [5, 1.5, True, None, ["x"], {"x": "y"}]),
    (Text(max_len=3, min_len=1), ["a", "abc"], ["", "abcd"]),
    (DIGEST, [GOOD_DIGEST], ["sha256:" + "AB" * 32, "md5:" + "ab" * 16, "sha256:../x", GOOD_DIGEST + "\n", 7]),
    (Whole(0, 10), [0, 10], [-1, 11, True, False, 1.0, "1", None, [1]]),
    (Flag(), [True, False], [0, 1, "true", None]),
    (OneOf(("qnn", "trt")), ["qnn", "trt"], ["cuda", "", 1, ["qnn"]]),
    (ListOf(Whole(), 2), [[], [1, 2]], [[1, 2, 3], [True], "12", {"0": 1}, None]),
    (ListOf(Text(), 3, min_items=1), [["a"]], [[]]),
    (Obj({"a": Whole()}, {"b": Text()}), [{"a": 1}, {"a": 1, "b": "x"}, {"a": 1, "other": [None]}],
     [{}, {"a": "1"}, {"a": 1, "b": None}, {"a": 1, "b": 2}, [("a", 1)], "a", None]),
])
def test_each_shape_takes_its_type_and_refuses_the_others(shape: Any, good: list[Any], bad: list[Any]) -> None:
    for value in good:
        assert check(value, shape) is value
    for value in bad:
        with pytest.raises(ShapeError):
            check(value, shape)


def test_a_refusal_names_the_field_by_its_path() -> None:
    doc = {"kind": "k", "files": [{"path": "a", "digest": GOOD_DIGEST, "size": 1},
                                  {"path": 5, "digest": GOOD_DIGEST, "size": 1}], "directories": []}
    with pytest.raises(ShapeError) as exc:
        check(doc, shapes.PACKAGE_RECORD)
    assert exc.value.where == "files[1].path" and str(exc.value) == "files[1].path is a number, not text"
    with pytest.raises(ShapeError) as exc:
        check([doc], shapes.PACKAGE_RECORD)
    assert str(exc.value) == "it is a list, not an object"
    with pytest.raises(ShapeError) as exc:
        check({"files": [], "directories": []}, shapes.PACKAGE_RECORD)
    assert str(exc.value) == "kind is missing"


def test_conform_raises_the_error_of_the_answer_kind() -> None:
    with pytest.raises(ServerError) as served:
        conform({"digest": GOOD_DIGEST, "record_size": "10"}, shapes.PACKAGE_ANSWER, "the package answer",
                ServerError, "tell them")
    assert served.value.code == "server-error" and served.value.hint == "tell them"
    assert served.value.message == "the package answer is malformed: record_size is text, not a whole number"
    with pytest.raises(ManifestError) as manifest:
        conform({"model": None}, shapes.MANIFEST, "manifest abc", ManifestError, "h")
    assert manifest.value.code == "bad-manifest"


def test_fields_a_shape_does_not_name_are_left_alone_and_the_answers_of_a_real_service_pass() -> None:
    resolve = {"artifact": GOOD_DIGEST, "model": GOOD_DIGEST, "backend": "qnn", "target": "SM8650",
               "toolchain": "2.51.0", "manifest_size": 900, "signatures": [], "verdict": "loads", "probed_at": None,
               "files": [{"name": "model_ctx.onnx", "digest": GOOD_DIGEST, "size": 5, "url": "http://x"}]}
    assert check(copy.deepcopy(resolve), shapes.RESOLVE_ANSWER) == resolve
    manifest = {"schemaVersion": 1, "model": GOOD_DIGEST, "backend": "trt", "ctxModel": "a.onnx",
                "target": {"name": "sm_89", "backend": "trt"}, "toolchain": {"version": "10.14.1.48+linux-x86-64"},
                "options": {"hardware_compatibility_level": "ampere_plus", "fp16": True},
                "files": [{"name": "a.onnx", "digest": GOOD_DIGEST, "size": 3, "role": "ctx-model"}], "log": None,
                "genai": {"config": "genai_config.json", "stages": [{"file": "a.onnx", "role": "embeddings"}]}}
    assert check(manifest, shapes.MANIFEST) is manifest
    assert check({"release": 3, "done": False, "builds": [{"build": 1, "state": "queued"}]}, shapes.RELEASE)
