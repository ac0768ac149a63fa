"""What a new user met at the CLI: the documented `farm token create` forms, progress
with real elapsed times and `cached` answers, page faults as counts, and `local-only` where a
shell has a service but no index."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import pytest

from farm.cli import main
from farm.cli.cluster_cmd import phase_text
from farm.cli.progress import ReleaseProgress
from farm.cli.remote import require_local_index
from farm.core.errors import LocalOnlyError
from farm.core.settings import Settings


@pytest.mark.parametrize("argv", [
    ["token", "create", "--scope", "submit", "release-pipeline"],  # the README's form
    ["token", "create", "release-pipeline", "--scope", "submit"],
    ["token", "--scope", "submit", "create", "release-pipeline"],
])
def test_token_create_takes_the_name_before_or_after_the_scope(argv, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("FARM_HOME", str(tmp_path))
    monkeypatch.delenv("FARM_SERVER", raising=False)
    monkeypatch.delenv("FARM_DATABASE_URL", raising=False)
    assert main([*argv, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["name"], doc["scope"]) == ("release-pipeline", "submit") and doc["token"].startswith("cfk_")
    assert main(["token", "list", "--json"]) == 0
    assert [(t["name"], t["scope"]) for t in json.loads(capsys.readouterr().out)] == [("release-pipeline", "submit")]


def test_token_create_still_refuses_extra_words_and_a_missing_name(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("FARM_HOME", str(tmp_path))
    with pytest.raises(SystemExit) as info:
        main(["token", "create", "--scope", "read", "a", "b"])
    assert info.value.code == 2 and "unrecognized arguments: b" in capsys.readouterr().err
    assert main(["token", "create", "--scope", "read"]) == 2
    err = capsys.readouterr().err
    assert "error[usage]: token create needs a NAME" in err and "farm token create NAME --scope" in err


def test_the_unauthorized_hint_is_a_form_that_works(capsys, monkeypatch, tmp_path):
    from farm.core.errors import UnauthorizedError

    hint = UnauthorizedError("x").hint or ""
    form = hint[hint.index("farm token create"):].rstrip(")").split()
    monkeypatch.setenv("FARM_HOME", str(tmp_path))
    assert main([*form[1:-1], "fleet", "--json"]) == 0, form
    assert json.loads(capsys.readouterr().out)["name"] == "fleet"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _build(n: int, state: str, **kw: object) -> dict[str, object]:
    return {"build": n, "target": "qnn:SM8650", "toolchain": "2.51.0", "state": state, "attempts": 1, **kw}


def test_release_progress_shows_real_elapsed_time_and_cached_answers(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(time, "monotonic", clock)
    out = io.StringIO()
    with ReleaseProgress(out, live=False) as progress:
        progress.submitted({"builds": [_build(1, "queued"), _build(2, "succeeded"),
                                       _build(3, "failed", error_code="invalid-model")]})
        clock.now += 5.2
        progress({"builds": [_build(1, "succeeded"), _build(2, "succeeded"),
                             _build(3, "failed", error_code="invalid-model")]})
    lines = out.getvalue().splitlines()
    assert "  build 1 qnn:SM8650 2.51.0: queued" in lines
    assert "  build 1 qnn:SM8650 2.51.0: succeeded after 5.2 s" in lines  # not 0.0 s
    assert "  build 2 qnn:SM8650 2.51.0: cached" in lines  # as farm build says, no time: nothing ran
    assert "  build 3 qnn:SM8650 2.51.0: failed (invalid-model, answered from the index)" in lines
    assert len(lines) == 4, lines  # the answered builds are not shown again


def test_release_progress_restarts_the_clock_when_a_build_starts_running(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(time, "monotonic", clock)
    out = io.StringIO()
    with ReleaseProgress(out, live=False) as progress:
        progress.submitted({"builds": [_build(1, "queued")]})
        clock.now += 30.0
        progress({"builds": [_build(1, "running")]})
        clock.now += 5.2
        progress({"builds": [_build(1, "succeeded")]})
    assert out.getvalue().splitlines()[-1] == "  build 1 qnn:SM8650 2.51.0: succeeded after 5.2 s"


@pytest.mark.parametrize("name,value,text", [
    ("ep_compile", 5213.4, "ep_compile 5213.4 ms"),
    ("child.page_faults", 4559, "child.page_faults 4559"),
    ("page_faults", 12.0, "page_faults 12"),
    ("bundle_cache", "hit", "bundle_cache hit"),
    ("sha256:ab.bin", 3.5, "sha256:ab.bin 3.5 ms"),
    ("child.peak_rss_kib", 422400.0, "child.peak_rss_kib 412.5 MiB"),  # a size, not ms
    ("child.peak_rss_kib", 512, "child.peak_rss_kib 512.0 KiB"),
    ("heap_mb", 64, "heap_mb 64.0 MiB"),
    ("blob_bytes", 100, "blob_bytes 100 bytes"),
    ("child.host_wait", 0.25, "child.host_wait 0.25 ms"),
])
def test_phases_print_their_own_units(name, value, text):
    assert phase_text(name, value) == text


def test_a_shell_with_a_service_and_no_index_is_refused_local_commands(tmp_path: Path):
    settings = Settings.from_env({"FARM_HOME": str(tmp_path)})
    with pytest.raises(LocalOnlyError) as info:
        require_local_index("registry verify", settings, {"FARM_SERVER": "http://farm:8080"})
    assert info.value.code == "local-only" and info.value.exit_code == 2
    assert "farm registry verify has no remote form" in info.value.message
    assert not (tmp_path / "index.db").exists()
    require_local_index("registry verify", settings, {})  # no service: this machine's own index
    require_local_index("registry verify", settings, {"FARM_SERVER": "http://farm:8080",
                                                      "FARM_DATABASE_URL": "postgresql://db/farm"})
    (tmp_path / "index.db").write_bytes(b"")  # an embedded index that exists: it is this farm's
    require_local_index("registry verify", settings, {"FARM_SERVER": "http://farm:8080"})


class StubService:
    """A service that answers every GET with ``doc`` (a malformed one, here)."""

    def __init__(self, doc: object) -> None:
        self.doc = doc

    def json(self, method: str, path: str, **query: object) -> object:
        return self.doc


@pytest.mark.parametrize("argv,module,doc", [
    (["ls"], "farm.cli.registry_cmd", [{"id": "abc"}]),
    (["ls"], "farm.cli.registry_cmd", {"not": "a list"}),
    (["show", "abcdef"], "farm.cli.registry_cmd", {"artifact": "sha256:x"}),
    (["show", "abcdef"], "farm.cli.registry_cmd", ["a list"]),
    (["workers"], "farm.cli.remote", [{"worker": "w", "last_seen_seconds": "soon"}]),
    (["workers"], "farm.cli.remote", [1, 2]),
])
def test_a_malformed_answer_to_a_read_command_is_server_error(argv, module, doc, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("FARM_HOME", str(tmp_path))
    monkeypatch.setattr(f"{module}.client", lambda args: StubService(doc))
    assert main([*argv, "--server", "http://farm.invalid"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error[server-error]") and "Traceback" not in err, err
    assert not (tmp_path / "index.db").exists()


@pytest.mark.parametrize("argv,doc", [
    (["status", "7"], {"release": 7, "builds": [{"build": 1}]}),
    (["status", "7"], ["not", "a", "release"]),
    (["status", "--build", "7"], {"build": "x", "state": None}),
    (["status", "--build", "7"], ["nope"]),
])
def test_a_malformed_status_answer_is_server_error(argv, doc, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("FARM_HOME", str(tmp_path))
    monkeypatch.setattr("farm.client.Client", lambda server, token: StubService(doc))
    assert main([*argv, "--server", "http://farm.invalid"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error[server-error]") and "Traceback" not in err, err


@pytest.mark.parametrize("argv", [["status", "7"], ["status", "--build", "7"]])
def test_status_of_an_id_with_no_server_says_ids_live_on_a_server(argv, tmp_path, monkeypatch, capsys):
    """`farm status ID` with no server configured: not a hint about `farm ls`, and no
    empty index created on the spot; with an index that lacks the id, the same pointer."""
    monkeypatch.delenv("FARM_SERVER", raising=False)
    monkeypatch.delenv("FARM_DATABASE_URL", raising=False)
    monkeypatch.setenv("FARM_HOME", str(tmp_path / "home"))
    assert main([*argv, "--json"]) == 1
    err = json.loads(capsys.readouterr().out)["error"]
    assert err["code"] == "not-found" and "no server is configured" in err["message"], err
    assert "--server" in err["hint"] and "FARM_SERVER" in err["hint"]
    assert not (tmp_path / "home" / "index.db").exists()
    assert main(["ls", "--json"]) == 0  # now there is an index, without that id
    capsys.readouterr()
    assert main([*argv, "--json"]) == 1
    err = json.loads(capsys.readouterr().out)["error"]
    assert "in this machine's index" in err["message"] and "--server" in err["hint"], err
