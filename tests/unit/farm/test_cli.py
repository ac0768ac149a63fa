from __future__ import annotations

import json
import subprocess
import sys
import types

import pytest

import farm.cli
from farm.cli import COMMANDS, build_parser, human_size, main, table
from farm.core.errors import NoMatchError

HEAVY = ("sqlalchemy", "onnx", "boto3", "botocore", "alembic", "numpy", "onnxruntime")


def run_python(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=60, check=False)


def imported_by_importtime(stderr: str) -> set[str]:
    """Top-level package names from ``python -X importtime`` output."""
    names = set()
    for line in stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            name = line.rsplit("|", 1)[1].strip()
            if name and name != "imported package":
                names.add(name.split(".")[0])
    return names


def test_farm_help_imports_nothing_heavy():
    proc = run_python("-X", "importtime", "-m", "farm.cli", "--help")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: farm")
    for name in COMMANDS:
        assert name in proc.stdout
    imported = imported_by_importtime(proc.stderr)
    assert "farm" in imported  # the parser really is in the output
    assert not imported & set(HEAVY), sorted(imported & set(HEAVY))


def test_build_parser_imports_nothing_heavy():
    script = (
        "import sys, farm.cli\n"
        "farm.cli.build_parser()\n"
        f"print([m for m in {HEAVY!r} if m in sys.modules])\n"
    )
    proc = run_python("-c", script)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_targets_command_imports_no_database_or_store():
    script = (
        "import sys, farm.cli\n"
        "rc = farm.cli.main(['targets', '--json'])\n"
        "assert rc == 0\n"
        "print([m for m in ('sqlalchemy', 'boto3', 'onnx') if m in sys.modules], file=sys.stderr)\n"
    )
    proc = run_python("-c", script)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip() == "[]"
    assert any(row["target"] == "qnn:SM8650" for row in json.loads(proc.stdout))


def test_no_command_prints_help(capsys):
    assert main([]) == 2
    assert "usage: farm" in capsys.readouterr().out


def test_version(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"ctxfarm {farm.__version__}"


def test_targets_filtered_by_backend(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("FARM_HOME", str(tmp_path))
    assert main(["targets", "--backend", "trt", "--json"]) == 0
    refs = [row["target"] for row in json.loads(capsys.readouterr().out)]
    assert refs and all(r.startswith("trt:") for r in refs)


@pytest.fixture
def fake_command(monkeypatch, tmp_path):
    """A `fake` command whose run() raises what the test puts in ``behaviour``."""
    behaviour: dict[str, BaseException | None] = {"raise": None}
    mod = types.ModuleType("farm.cli.fake_cmd")

    def add_arguments(name, p):
        p.add_argument("--json", action="store_true")

    def run(name, args, settings):
        if behaviour["raise"] is not None:
            raise behaviour["raise"]
        return 0

    mod.add_arguments, mod.run = add_arguments, run
    monkeypatch.setitem(sys.modules, "farm.cli.fake_cmd", mod)
    monkeypatch.setitem(COMMANDS, "fake", ("fake_cmd", "a test command"))
    monkeypatch.setenv("FARM_HOME", str(tmp_path))
    return behaviour


def test_user_error_maps_to_exit_code_without_traceback(fake_command, capsys):
    fake_command["raise"] = NoMatchError("nothing loads", hint="build one")
    assert main(["fake"]) == 3
    err = capsys.readouterr().err
    assert err == "error[no-match]: nothing loads\n  hint: build one\n"


def test_user_error_as_json(fake_command, capsys):
    fake_command["raise"] = NoMatchError("nothing loads", hint="build one")
    assert main(["fake", "--json"]) == 3
    out = capsys.readouterr().out
    assert json.loads(out) == {"error": {"code": "no-match", "message": "nothing loads", "hint": "build one"}}


def test_bad_config_is_a_user_error(fake_command, capsys, monkeypatch):
    monkeypatch.setenv("FARM_COMPILE_TIMEOUT", "soon")
    assert main(["fake"]) == 1
    assert "error[bad-config]" in capsys.readouterr().err


def test_a_bug_is_internal_error_with_the_traceback_only_in_debug(fake_command, capsys, monkeypatch):
    fake_command["raise"] = ZeroDivisionError("bug")
    monkeypatch.delenv("FARM_DEBUG", raising=False)
    assert main(["fake"]) == 70
    err = capsys.readouterr().err
    assert "error[internal-error]: ZeroDivisionError: bug" in err and "Traceback" not in err
    monkeypatch.setenv("FARM_DEBUG", "1")
    assert main(["fake"]) == 70
    assert "Traceback" in capsys.readouterr().err


def test_interrupt(fake_command, capsys):
    fake_command["raise"] = KeyboardInterrupt()
    assert main(["fake"]) == 130


def test_only_the_selected_command_module_is_imported(monkeypatch):
    monkeypatch.delitem(sys.modules, "farm.cli.registry_cmd", raising=False)
    build_parser("targets")
    assert "farm.cli.registry_cmd" not in sys.modules


def test_table(capsys):
    import io

    out = io.StringIO()
    table([{"a": "x", "bb": None}, {"a": "longer", "bb": 2}], ["a", "bb"], out=out)
    assert out.getvalue().splitlines() == ["A       BB", "x", "longer  2"]


@pytest.mark.parametrize("n,text", [(None, ""), (0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"),
                                    (5 * 1024 * 1024, "5.0 MiB"), (3 * 1024**4, "3072.0 GiB")])
def test_human_size(n, text):
    assert human_size(n) == text
