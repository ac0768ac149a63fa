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


# ---- conventional flags, "did you mean" ---------------------------------------------------------

def _command_parsers():
    for name in COMMANDS:
        yield name, build_parser(name).subparsers[name]


def test_each_short_flag_means_one_thing_on_every_command():
    meaning: dict[str, set[str]] = {}
    for _name, p in _command_parsers():
        for action in p._actions:
            shorts = [s for s in action.option_strings if len(s) == 2 and s[0] == "-" and s[1] != "-"]
            longs = sorted(s for s in action.option_strings if s.startswith("--"))
            for short in shorts:
                meaning.setdefault(short, set()).add(longs[0] if longs else "?")
    assert {s: m for s, m in meaning.items() if len(m) > 1} == {}
    # The documented ones (README "farm on your PATH"): pip / ssh / docker habits.
    assert meaning["-t"] == {"--target"} and meaning["-m"] == {"--model"} and meaning["-o"] == {"--option"}
    assert meaning["-d"] == {"--dest"} and meaning["-h"] == {"--help"}


def usage_error(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as info:
        main(list(argv))
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "error[usage]" in err and "Traceback" not in err
    return err


def test_a_typoed_command_gets_a_suggestion(capsys):
    err = usage_error(capsys, "biuld")
    assert "unknown command 'biuld'; did you mean build?" in err
    assert "choose from" not in err  # not the list of every command


def test_a_typoed_flag_gets_the_subcommands_usage_and_a_suggestion(capsys, tmp_path):
    err = usage_error(capsys, "build", str(tmp_path / "m.onnx"), "--taget", "qnn:SM8650")
    assert err.startswith("usage: farm build ")  # the subcommand's usage, not `farm [-h] COMMAND`
    assert "unrecognized arguments: --taget qnn:SM8650; did you mean --target?" in err
    # also when argparse stops at a missing required flag first
    err = usage_error(capsys, "fetch", "--modle", "sq", "--soc", "SM8650", "--qnn", "2.51.0")
    assert "did you mean --model?" in err


def test_a_retired_short_flag_says_what_it_is_now(capsys, tmp_path):
    err = usage_error(capsys, "fetch", "--model", "sq", "--soc", "SM8650", "--qnn", "2.51.0", "-o", str(tmp_path))
    assert "-o on fetch is now -d/--dest DIR" in err


def test_a_bad_choice_gets_a_suggestion(capsys):
    assert "did you mean qnn?" in usage_error(capsys, "targets", "--backend", "qnnx")


def test_usage_errors_with_json_also_print_the_error_document(capsys):
    with pytest.raises(SystemExit):
        main(["ls", "--json", "--bogus"])
    out = json.loads(capsys.readouterr().out)
    assert out["error"]["code"] == "usage" and "--bogus" in out["error"]["message"]


def test_help_errors_is_the_table_of_errors_py(capsys):
    from farm.core import errors

    assert main(["help", "errors", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == errors.table_rows()
    assert main(["help", "errors", "--markdown"]) == 0
    assert capsys.readouterr().out == errors.markdown_table()
    assert main(["help", "errors"]) == 0
    text = capsys.readouterr().out
    assert all(code in text for code in errors.codes())


def test_help_command_and_a_typoed_topic(capsys):
    with pytest.raises(SystemExit) as info:
        main(["help", "build"])
    assert info.value.code == 0 and "usage: farm build" in capsys.readouterr().out
    assert main(["help", "bild"]) == 2
    assert "did you mean build?" in capsys.readouterr().err


def test_an_undocumented_code_never_leaves_the_boundary(fake_command, capsys):
    from farm.core.errors import FarmError

    err = FarmError("made up")
    err.code = "made-up"
    fake_command["raise"] = err
    assert main(["fake"]) == 70
    assert "error[internal-error]: undocumented error code 'made-up'" in capsys.readouterr().err


# ---- typed JSON: a schema for every command that takes --json ------------------------------------

SCHEMAS = __import__("pathlib").Path(farm.cli.__file__).parent / "schemas"


def test_every_command_with_json_has_a_schema():
    """`<command>.json`, or `<command>-<action>.json` for each action of a command with actions
    (registry verify|gc, keys create|sign|public, token create|list|revoke)."""
    missing = []
    for name, p in _command_parsers():
        if "--json" not in p._option_string_actions:
            continue
        if (SCHEMAS / f"{name}.json").exists():
            continue
        actions = [a for a in p._actions if not a.option_strings and a.choices]
        wanted = [f"{name}-{c}.json" for a in actions for c in a.choices] or [f"{name}.json"]
        missing += [w for w in wanted if not (SCHEMAS / w).exists()]
    assert missing == []


def test_schemas_are_valid_draft_2020_12():
    from jsonschema import Draft202012Validator

    for path in SCHEMAS.glob("*.json"):
        schema = json.loads(path.read_text())
        assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema", path.name
        assert schema["$id"].endswith(f"/{path.name}"), path.name
        Draft202012Validator.check_schema(schema)


def test_targets_and_help_json_validate(capsys):
    from jsonschema import Draft202012Validator

    for argv, name in ((["targets", "--json"], "targets"), (["help", "errors", "--json"], "help")):
        assert main(argv) == 0
        doc = json.loads(capsys.readouterr().out)
        schema = json.loads((SCHEMAS / f"{name}.json").read_text())
        assert not [e.message for e in Draft202012Validator(schema).iter_errors(doc)]
        if name == "targets":
            assert isinstance(doc[0]["aliases"], list) and isinstance(doc[0]["soc_model"], int)


# ---- progress -------------------------------------------------------------------------------------

def test_build_progress_off_a_terminal_is_a_line_per_state_change():
    import io

    from farm.cli.progress import BuildProgress

    out = io.StringIO()
    with BuildProgress(out, live=False) as progress:
        progress("compiling", "qnn:SM8650", {"toolchain": "2.51.0", "attempt": 1})
        progress("compiling", "qnn:SM8650", {"toolchain": "2.51.0", "attempt": 1})  # no change: no line
        progress("retrying", "qnn:SM8650", {"in_seconds": 4})
        progress("compiling", "qnn:SM8650", {"toolchain": "2.51.0", "attempt": 2})
        progress("finished", "qnn:SM8650", {"state": "failed", "error_code": "worker-lost"})
        progress("finished", "qnn:SM8750", {"state": "cached", "wall_seconds": 0.004})
    lines = out.getvalue().splitlines()
    assert lines[0] == "  qnn:SM8650: compiling (with 2.51.0)"
    assert lines[1] == "  qnn:SM8650: retrying (in 4 s after an infrastructure failure)"
    assert lines[2] == "  qnn:SM8650: compiling (with 2.51.0, attempt 2)"
    assert lines[3].startswith("  qnn:SM8650: failed in ") and lines[3].endswith(" s (worker-lost)")
    assert lines[4] == "  qnn:SM8750: cached in 0.0 s"
    assert len(lines) == 5 and "\x1b" not in out.getvalue()


def test_build_progress_of_several_models_has_a_row_per_model_and_target():
    import io

    from farm.cli.progress import BuildProgress

    out = io.StringIO()
    with BuildProgress(out, live=False) as progress:
        a, b = progress.for_model("squeezenet"), progress.for_model("resnet50")
        a("compiling", "qnn:SM8650", {"toolchain": "2.51.0", "attempt": 1})
        b("compiling", "qnn:SM8650", {"toolchain": "2.51.0", "attempt": 1})  # another row, not a repeat
        a("finished", "qnn:SM8650", {"state": "built"})
    lines = out.getvalue().splitlines()
    assert lines[0] == "  squeezenet qnn:SM8650: compiling (with 2.51.0)"
    assert lines[1] == "  resnet50 qnn:SM8650: compiling (with 2.51.0)"
    assert lines[2].startswith("  squeezenet qnn:SM8650: built in ")
    assert progress.columns[:2] == ("model", "target") and len(progress.rows) == 2
    assert progress.rows["resnet50 qnn:SM8650"].cells == {"model": "resnet50", "target": "qnn:SM8650"}


@pytest.mark.parametrize("flag", [["--name", "sq"], ["--tag", "v1"], ["--force-tag"]])
def test_build_names_one_model_only(capsys, tmp_path, flag):
    """Names are per model: --name/--tag/--force-tag with several models is a usage error,
    before anything is read or written."""
    rc = main(["build", str(tmp_path / "a.onnx"), str(tmp_path / "b.onnx"), "-t", "qnn:SM8650", *flag])
    err = capsys.readouterr().err
    assert rc == 2 and "error[usage]" in err and "several models" in err and "Traceback" not in err


def test_release_progress_off_a_terminal_prints_changed_builds_only():
    import io

    from farm.cli.progress import ReleaseProgress

    def st(*states):
        return {"builds": [{"build": i + 1, "target": "qnn:SM8650", "toolchain": tc, "state": s, "attempts": a,
                            "note": None, "error_code": code}
                           for i, (tc, s, a, code) in enumerate(states)]}

    out = io.StringIO()
    with ReleaseProgress(out, live=False) as progress:
        progress(st(("2.47.0", "queued", 0, None), ("2.51.0", "queued", 0, None)))
        progress(st(("2.47.0", "running", 1, None), ("2.51.0", "queued", 0, None)))
        progress(st(("2.47.0", "running", 1, None), ("2.51.0", "queued", 0, None)))  # nothing changed
        progress(st(("2.47.0", "succeeded", 1, None), ("2.51.0", "failed", 1, "toolchain-error")))
    lines = out.getvalue().splitlines()
    assert lines[:3] == ["  build 1 qnn:SM8650 2.47.0: queued", "  build 2 qnn:SM8650 2.51.0: queued",
                         "  build 1 qnn:SM8650 2.47.0: running"]
    assert lines[3].startswith("  build 1 qnn:SM8650 2.47.0: succeeded after ")
    assert lines[4].startswith("  build 2 qnn:SM8650 2.51.0: failed after ") and lines[4].endswith("(toolchain-error)")
    assert len(lines) == 5 and "{" not in out.getvalue() and "\x1b" not in out.getvalue()


def test_no_live_display_off_a_terminal(monkeypatch):
    import io

    from farm.cli.progress import BuildProgress, interactive

    assert not interactive(io.StringIO())
    monkeypatch.setenv("TERM", "dumb")

    class Tty(io.StringIO):
        def isatty(self):
            return True

    assert not interactive(Tty())
    assert BuildProgress(io.StringIO()).live is False
