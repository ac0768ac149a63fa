"""Filesystem oddities are input errors: a symlink loop (direct or through another link), a
dangling symlink, a FIFO (whose read would block), a device, a folder where a file belongs,
permission denied, a name the OS refuses (too long, a NUL) on any file of a genai export, on
the export folder itself, on a plain model or its external data: ``bad-genai`` or
``invalid-model`` naming the file, with a hint; never internal-error, never a blocked read."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest

from farm.core import genai, names
from farm.core.bundle import inspect_model
from farm.core.digests import local_bundle
from farm.core.errors import BadGenaiError, InvalidModelError
from tests.common.genai import make_export
from tests.common.hostile_genai import ODDITIES, linked_copy, make_odd
from tests.common.onnx_models import matmul_add, save, save_external


@pytest.fixture(scope="module", params=["olive", "aihub"])
def export(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp(request.param) / "export"
    return make_export(out, *(("--layout", "aihub") if request.param == "aihub" else ()))


def _denied(monkeypatch: pytest.MonkeyPatch, target: Path) -> None:
    """Permission denied on opening ``target`` (the tests run as root, which the kernel lets
    read anything): the error the OS gives a user without read permission."""
    real = os.open

    def guarded(path: Any, flags: int, *a: Any, **k: Any) -> int:
        if Path(path) == target:
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real(path, flags, *a, **k)

    monkeypatch.setattr(names.os, "open", guarded)


def test_every_file_of_an_export_as_every_oddity(export: Path, tmp_path: Path) -> None:
    files = sorted(p.name for p in export.iterdir())
    assert len(files) >= 12
    wrong: list[str] = []
    for i, name in enumerate(files):
        for kind in ODDITIES:
            folder = linked_copy(export, tmp_path / f"{i}-{kind.replace(' ', '-')}")
            make_odd(folder / name, kind)
            try:
                genai.read_export(folder)
                wrong.append(f"{name} as a {kind}: accepted")
            except BadGenaiError as exc:
                if name not in exc.message or exc.exit_code != 2 or not exc.hint:
                    wrong.append(f"{name} as a {kind}: {exc.message}")
    assert not wrong, "\n".join(wrong)


def test_a_file_of_an_export_that_can_not_be_opened(export: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("genai_config.json", "tokenizer.json", "lm_head.onnx", "embeddings.onnx.data"):
        folder = linked_copy(export, tmp_path / name)
        with monkeypatch.context() as m:
            _denied(m, folder / name)
            with pytest.raises(BadGenaiError, match=f"{name}.*permission denied"):
                genai.read_export(folder)


@pytest.mark.parametrize("kind", ["symlink loop", "dangling symlink", "fifo", "device", "too long", "nul", "file"])
def test_the_export_folder_itself(tmp_path: Path, kind: str) -> None:
    folder = tmp_path / "export"
    if kind == "too long":
        folder = tmp_path / ("x" * 300)
    elif kind == "nul":
        folder = tmp_path / "ex\x00port"
    elif kind == "file":
        folder.write_text("{}")
    else:
        folder.write_text("")
        make_odd(folder, kind)
    with pytest.raises(BadGenaiError, match="not a folder to read") as info:
        genai.read_export(folder)
    assert info.value.code == "bad-genai" and info.value.hint


def test_a_built_folder_that_is_a_loop_is_genai_folder_invalid(tmp_path: Path) -> None:
    from farm.core.errors import GenaiFolderError

    os.symlink("pkg", tmp_path / "pkg")
    with pytest.raises(GenaiFolderError, match="a symlink loop"):
        genai.inspect_folder(tmp_path / "pkg")


# ---- plain models: the same resolution ------------------------------------------------------------

MODEL_ODDITIES = (*ODDITIES, "too long", "nul", "denied")


def _odd_model(tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = save(matmul_add(), tmp_path / "m.onnx")
    if kind == "too long":
        return tmp_path / ("m" * 300 + ".onnx")
    if kind == "nul":
        return tmp_path / "m\x00.onnx"
    if kind == "denied":
        _denied(monkeypatch, path)
        return path
    make_odd(path, kind)
    return path


@pytest.mark.parametrize("kind", MODEL_ODDITIES)
def test_a_model_path(tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _odd_model(tmp_path, kind, monkeypatch)
    for check in (inspect_model, lambda p: local_bundle(p, tmp_path / "memo.json")):
        with pytest.raises(InvalidModelError) as info:
            check(path)
        assert info.value.code == "invalid-model" and info.value.hint
        assert str(path)[:40] in info.value.message or repr(str(path))[:40] in info.value.message


# (A location too long or with a NUL is refused as a path first: farm.core.names.safe_relative.)
@pytest.mark.parametrize("kind", [*ODDITIES, "denied"])
def test_a_model_external_data(tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    path = save_external(matmul_add(size=16), tmp_path / "bundle" / "m.onnx")
    data = path.parent / "w.data"
    if kind == "denied":
        _denied(monkeypatch, data)
    else:
        make_odd(data, kind)
    with pytest.raises(InvalidModelError) as info:
        inspect_model(path)
    assert "w.data" in info.value.message and info.value.hint, info.value.message


def test_inside_translates_what_the_os_refuses(tmp_path: Path) -> None:
    os.symlink("a", tmp_path / "a")
    with pytest.raises(names.UnusablePathError, match="a symlink loop"):
        names.inside(tmp_path, "a")
    with pytest.raises(names.UnsafePathError):  # the base class every caller catches
        names.inside(tmp_path, "a")
    with pytest.raises(names.UnusablePathError, match="cannot be resolved"):
        names.inside(tmp_path / "a", "b")
