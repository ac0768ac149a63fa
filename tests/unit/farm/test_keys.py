from __future__ import annotations

import io

import pytest

from farm.core.keys import (
    build_key,
    bundle_digest,
    canonical_json,
    is_digest,
    options_digest,
    parse_version,
    sha256_bytes,
    sha256_file,
    sha256_stream,
)

D1 = sha256_bytes(b"one")
D2 = sha256_bytes(b"two")
D3 = sha256_bytes(b"three")


def test_canonical_json_ignores_key_order_and_whitespace():
    a = canonical_json({"b": 1, "a": {"y": [1, 2], "x": "é"}})
    b = canonical_json({"a": {"x": "é", "y": [1, 2]}, "b": 1})
    assert a == b
    assert a == '{"a":{"x":"é","y":[1,2]},"b":1}'.encode()


def test_canonical_json_keeps_list_order():
    assert canonical_json([1, 2]) != canonical_json([2, 1])


def test_sha256_helpers_agree(tmp_path):
    data = b"x" * 3_000_000  # spans several read chunks
    (tmp_path / "f").write_bytes(data)
    expected = sha256_bytes(data)
    assert sha256_stream(io.BytesIO(data)) == (expected, len(data))
    assert sha256_file(tmp_path / "f") == (expected, len(data))
    assert is_digest(expected)


@pytest.mark.parametrize("value", ["", "sha256:", "sha256:" + "A" * 64, "sha256:" + "0" * 63, "md5:" + "0" * 64,
                                   "0" * 64, " sha256:" + "0" * 64])
def test_is_digest_rejects_malformed(value):
    assert not is_digest(value)


def test_is_digest_rejects_trailing_newline():
    assert not is_digest("sha256:" + "0" * 64 + "\n")


def test_bundle_digest_independent_of_listing_order():
    assert bundle_digest(D1, [("a.data", D2), ("b.data", D3)]) == bundle_digest(D1, [("b.data", D3), ("a.data", D2)])


def test_bundle_digest_sensitive_to_content_and_paths():
    base = bundle_digest(D1, [("a.data", D2)])
    assert bundle_digest(D2, [("a.data", D2)]) != base  # .onnx content
    assert bundle_digest(D1, [("a.data", D3)]) != base  # data content
    assert bundle_digest(D1, [("b.data", D2)]) != base  # data path
    assert bundle_digest(D1, []) != base  # data file dropped
    assert bundle_digest(D1, [("a.data", D2), ("b.data", D2)]) != base  # data file added
    assert is_digest(base)


def test_bundle_digest_without_external_data_differs_from_plain_onnx_digest():
    # The bundle digest is namespaced, so it never collides with the .onnx file's own digest.
    assert bundle_digest(D1, []) != D1


def test_options_digest_is_order_independent():
    assert options_digest({"a": 1, "b": True}) == options_digest({"b": True, "a": 1})
    assert options_digest({"a": 1, "b": True}) != options_digest({"a": 1, "b": False})


BASE = dict(model_digest=D1, backend="qnn", target="SM8650", toolchain="2.51.0", opts_digest=D2)


def test_build_key_is_64_hex_and_deterministic():
    key = build_key(**BASE)
    assert key == build_key(**BASE)
    assert len(key) == 64 and all(c in "0123456789abcdef" for c in key)


@pytest.mark.parametrize("field,value", [
    ("model_digest", D3),
    ("backend", "trt"),
    ("target", "SM8750"),
    ("toolchain", "2.49.40"),
    ("opts_digest", D3),
])
def test_build_key_changes_with_each_component(field, value):
    assert build_key(**{**BASE, field: value}) != build_key(**BASE)


@pytest.mark.parametrize("lower,higher", [
    ("2.49.40", "2.51.0"),
    ("2.47.0", "2.49.40"),
    ("2.9.0", "2.10.0"),  # numeric, not lexicographic
    ("10.12.0", "10.13.2"),
])
def test_parse_version_orders_numerically(lower, higher):
    assert parse_version(lower) < parse_version(higher)


def test_parse_version_values():
    assert parse_version("2.49.40") == (2, 49, 40)
    assert parse_version("10.13.0.35") == (10, 13, 0, 35)
    assert parse_version("2.51.0rc1") == parse_version("2.51.0") == (2, 51)
    assert parse_version("2.x.1") == (2, 0, 1)


def test_parse_version_trailing_zeros_are_equal():
    assert parse_version("2.51") == parse_version("2.51.0")
