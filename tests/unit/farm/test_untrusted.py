"""farm.core.untrusted: whatever JSON a server sends, the manifest check either refuses it with
bad-manifest or returns a manifest whose every file name stays under any root, digest is sha256
hex and size a bounded int (hypothesis); and the hand-picked names a server might try."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from farm.core.errors import ManifestError
from farm.core.names import inside
from farm.core.untrusted import MAX_FILE_BYTES, check_file_name, check_manifest, clean_text

DIGEST = "sha256:" + "ab" * 32
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)
names = st.text(alphabet=st.sampled_from(list("ab./\\:\x00-_+ C~\u2028")), min_size=0, max_size=12)


def manifest(files: list[Any], **over: Any) -> dict[str, Any]:
    return {"model": DIGEST, "backend": "qnn", "ctxModel": files[0]["name"] if files and isinstance(files[0], dict)
            else "x", "files": files, "target": {"name": "SM8650"}, "toolchain": {"version": "2.51.0"}, **over}


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_any_json_is_refused_or_checked(value: Any) -> None:
    try:
        check_manifest(value)
    except ManifestError:
        return
    raise AssertionError(f"accepted {value!r}")  # random JSON is never a whole manifest


@settings(max_examples=500, deadline=None)
@given(st.lists(st.fixed_dictionaries({"name": names, "digest": st.sampled_from([DIGEST, "sha256:../x", "x"]),
                                       "size": st.integers(-2, 2**41) | st.booleans() | st.floats()}),
                min_size=1, max_size=3))
def test_an_accepted_manifest_names_only_paths_under_the_root(files: list[dict[str, Any]]) -> None:
    try:
        got = check_manifest(manifest(files))
    except ManifestError:
        return
    root = Path("/nonexistent/root")
    for f in got["files"]:
        assert inside(root, f["name"]).is_relative_to(root)
        assert f["digest"] == DIGEST and type(f["size"]) is int and 0 <= f["size"] <= MAX_FILE_BYTES


@pytest.mark.parametrize("name", ["../x", "/etc/passwd", "a/../b", "a\\b", "C:x", "a\x00b", ".hidden", "a//b", "a/",
                                  "./a", "", "a" * 2000, "a b", "~root", "a\u2028b", "-rf"])
def test_names_a_server_might_try_are_refused(name: str) -> None:
    with pytest.raises(ManifestError):
        check_file_name(name)


@pytest.mark.parametrize("name", ["model_ctx.onnx", "model_ctx_QNN_123_1_1.bin", "sub/dir/w.bin", "a+b.bin"])
def test_plain_names_pass(name: str) -> None:
    assert check_file_name(name) == name


def test_text_from_a_server_is_cleaned_for_a_terminal() -> None:
    assert clean_text("ok \x1b[31mred\x1b]0;t\x07\n", 100) == "ok  [31mred ]0;t  "
    assert clean_text(None) == "" and clean_text("x" * 50, 10) == "x" * 10 + "..."
