"""Published is not verified: `farm build --genai` publishes the package (resolvable, its answer
printed) as soon as its folder check passes, then runs the twin and records it. For real: the
tiny export of tests/common/genai.py, its parts compiled by QNN 2.51.0, the twin on the HTP
simulator."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from farm.core.settings import Settings
from tests.common.cli import farm
from tests.common.genai import make_export

pytest.importorskip("onnxruntime_genai")
pytest.importorskip("onnxruntime_qnn")

RESOLVE = ("resolve", "--model", "llm/tw:t", "--soc", "SM8650", "--qnn", "2.51.0", "--json")


def _twin(env: dict[str, str]) -> tuple[str, dict[str, object]]:
    res = json.loads(farm(env, *RESOLVE).stdout)
    return res["artifact"], res["twin"]


def test_the_package_resolves_before_its_twin_is_recorded(settings: Settings, farm_env: dict[str, str],
                                                         tmp_path: Path) -> None:
    export = make_export(tmp_path / "export")
    build = ("build", "--genai", str(export), "-t", "qnn:SM8650", "--name", "llm/tw", "--tag", "t")
    proc = subprocess.Popen([sys.executable, "-m", "farm.cli", *build], env=farm_env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, start_new_session=True)
    seen: list[str] = []
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # the progress lines, as they come
            seen.append(line)
            if line.strip().startswith("twin qnn:SM8650: checking"):
                break
        # Held right after it said the twin starts (its answer printed before that): the twin
        # can't be recorded while the command is stopped, whatever its child does.
        os.kill(proc.pid, signal.SIGSTOP)
        published = [x for x in seen if x.strip().startswith("published qnn:SM8650")]
        assert published and "(twin pending)" in published[0], "".join(seen)

        artifact, twin = _twin(farm_env)  # published: resolvable, its twin pending
        assert twin["status"] == "pending", twin
        assert "twin      pending" in farm(farm_env, "show", artifact).stdout
        from farm.api.page import render_page
        from registry.index import Registry

        reg = Registry.open(settings)
        try:
            with reg.db.session() as s:
                assert "twin pending" in render_page(s, model=["llm/tw"])
        finally:
            reg.close()
        # Ctrl-C during the twin: the package stays published, its twin pending.
        os.kill(proc.pid, signal.SIGINT)
        os.kill(proc.pid, signal.SIGCONT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
            proc.wait()
    assert "genai package llm/tw:t" in out and " built " in out, (out, "".join(seen) + err)
    assert "recorded in" not in err, err
    assert _twin(farm_env) == (artifact, twin)

    # The same command again: answered from the index, and it runs the pending twin.
    again = farm(farm_env, *build)
    assert " cached " in again.stdout and "twin qnn:SM8650: checking" in again.stderr, again.stderr
    assert _twin(farm_env)[0] == artifact
    twin = _twin(farm_env)[1]
    assert twin["status"] == "ok" and twin["tokens_matched"] == twin["tokens_compared"], twin
    assert isinstance(twin["tokens_compared"], int) and twin["tokens_compared"] >= 4
    # A third time: nothing compiled, for the parts or for the twin.
    third = farm(farm_env, *build, "--require-twin")
    assert " cached " in third.stdout and "twin qnn:SM8650" not in third.stderr, third.stderr


def test_require_twin_answers_twin_mismatch_on_a_published_package(farm_env: dict[str, str], tmp_path: Path) -> None:
    """A twin that could not run (here: a part's twin build failed before, as one past its memory
    cap does) is recorded evidence on the published package; with --require-twin it is the
    command's answer."""
    from tests.integration.test_genai_twin_builds import fail_twin_build

    export = make_export(tmp_path / "export")
    build = ("build", "--genai", str(export), "-t", "qnn:SM8650", "--name", "llm/tw", "--tag", "t")
    first = farm(farm_env, *build, "--no-twin")
    assert "twin not run (--no-twin)" in first.stderr
    fail_twin_build(Settings.from_env(farm_env), part=0)
    got = farm(farm_env, *build, "--require-twin", "--json", check=False)
    assert got.returncode == 1, (got.stdout, got.stderr)
    (b,) = json.loads(got.stdout)["builds"]
    assert b["error_code"] == "twin-mismatch" and b["artifact"], b
    artifact, twin = _twin(farm_env)  # still published, the twin's failure recorded on it
    assert artifact == b["artifact"] and twin["status"] == "unverified" and "part 0's twin build" in twin["detail"], twin
