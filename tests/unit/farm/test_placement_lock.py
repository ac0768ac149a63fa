"""The install lock removes its file when released (no `.NAME.ctxfarm-lock` left beside an
install directory), and still never has two holders: a process that opened the file before it
was removed notices, once it holds its lock, that the path names another file, and retries."""

from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path

from farm.core.placement import _lock, staged


def _hammer(out: str, rounds: int) -> int:
    clashes = 0
    for _ in range(rounds):
        with _lock(Path(out)):
            try:
                fd = os.open(out + ".held", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                clashes += 1  # another process is inside the lock with us
                continue
            time.sleep(0.0005)
            os.close(fd)
            os.unlink(out + ".held")
    return clashes


def test_the_lock_excludes_and_leaves_no_file(tmp_path: Path) -> None:
    out = tmp_path / "sq"
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(4) as pool:
        clashes = pool.starmap(_hammer, [(str(out), 150)] * 4)
    assert clashes == [0, 0, 0, 0]
    assert os.listdir(tmp_path) == []


def test_an_install_leaves_only_its_directory(tmp_path: Path) -> None:
    out = tmp_path / "sq"
    with staged(out) as staging:
        (staging / "model_ctx.onnx").write_bytes(b"ctx")
    assert sorted(os.listdir(tmp_path)) == ["sq"] and (out / "model_ctx.onnx").read_bytes() == b"ctx"
