"""The hostile corpus, through the real `farm` CLI: models, names, settings and commands chosen to
escape, poison or crash. Each case must (1) exit cleanly or fail with a documented code, (2)
never print a traceback, (3) leave the registry unchanged when it fails, and (4) write nothing
outside FARM_HOME and the directory it was asked to write."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import onnx
import pytest

from farm.core import errors
from farm.core.settings import Settings
from farm.pipeline.plan import build
from tests.common.cli import farm, farm_many
from tests.common.onnx_models import conv_relu_add, light, memory_bomb
from tests.common.registry_state import snapshot

DOCUMENTED = {cls.code for cls in vars(errors).values()
              if isinstance(cls, type) and issubclass(cls, errors.FarmError) and cls is not errors.FarmError}
CODE_RE = re.compile(r"error\[([a-z-]+)\]")


def files_under(root: Path, skip: tuple[Path, ...]) -> set[str]:
    out = set()
    for p in root.rglob("*"):
        if any(p == s or s in p.parents for s in skip):
            continue
        out.add(str(p.relative_to(root)))
    return out


def check_failure(proc: subprocess.CompletedProcess[str], code: str | None = None) -> str:
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    codes = CODE_RE.findall(proc.stderr)
    assert codes, f"no error code in: {proc.stderr!r}"
    assert set(codes) <= DOCUMENTED, codes
    if code:
        assert code in codes, proc.stderr
    return codes[0]


# ---- models -------------------------------------------------------------------------------------

def _external(d: Path, location: str, **extra: str) -> Path:
    """conv_relu_add with its weights in an external file, then the location (and offsets)
    rewritten to a hostile value."""
    path = conv_relu_add(d / "m.onnx", external=True)
    model = onnx.load(str(path), load_external_data=False)
    for t in model.graph.initializer:
        for e in t.external_data:
            if e.key == "location":
                e.value = location
            elif e.key in extra:
                e.value = extra[e.key]
        for k, v in extra.items():
            if k not in {e.key for e in t.external_data}:
                t.external_data.add(key=k, value=v)
    path.write_bytes(model.SerializeToString())
    return path


def bomb(d: Path) -> Path:
    return memory_bomb(d / "bomb.onnx")


def _symlinked_data_outside(d: Path) -> Path:
    path = conv_relu_add(d / "m.onnx", external=True)
    outside = d.parent / "outside.data"
    (d / "m.data").rename(outside)
    (d / "m.data").symlink_to(outside)
    return path


MODELS: dict[str, tuple[Callable[[Path], Path], str]] = {
    "not-onnx": (lambda d: _write(d / "x.onnx", b"hello, not a model\n"), "invalid-model"),
    "empty": (lambda d: _write(d / "x.onnx", b""), "invalid-model"),
    "truncated": (lambda d: _write(d / "x.onnx", light("resnet50").read_bytes()[:30_000]), "invalid-model"),
    "random-bytes": (lambda d: _write(d / "x.onnx", bytes(range(256)) * 40), "invalid-model"),
    "directory": (lambda d: (d / "dir.onnx").mkdir() or d / "dir.onnx", "invalid-model"),
    "missing": (lambda d: d / "nope.onnx", "invalid-model"),
    "location-parent": (lambda d: _external(d, "../m.data"), "invalid-model"),
    "location-absolute": (lambda d: _external(d, "/etc/passwd"), "invalid-model"),
    "location-backslash": (lambda d: _external(d, "sub\\m.data"), "invalid-model"),
    "location-dot": (lambda d: _external(d, "."), "invalid-model"),
    "location-empty": (lambda d: _external(d, ""), "invalid-model"),
    "location-nul": (lambda d: _external(d, "m.data\x00.txt"), "invalid-model"),
    "location-drive": (lambda d: _external(d, "C:/m.data"), "invalid-model"),
    "location-trailing-slash": (lambda d: _external(d, "sub/"), "invalid-model"),
    "location-is-a-directory": (lambda d: _mkdir_then(d / "sub", _external(d, "sub")), "invalid-model"),
    "location-onnx-name": (lambda d: _external(d, "model.onnx"), "invalid-model"),
    "offset-abc": (lambda d: _external(d, "m.data", offset="abc"), "invalid-model"),
    "offset-negative": (lambda d: _external(d, "m.data", offset="-5"), "invalid-model"),
    "length-negative": (lambda d: _external(d, "m.data", length="-1"), "invalid-model"),
    "length-past-end": (lambda d: _external(d, "m.data", length="99999999"), "invalid-model"),
    "offset-huge": (lambda d: _external(d, "m.data", offset=str(10**30)), "invalid-model"),
    "symlink-data-outside": (_symlinked_data_outside, "invalid-model"),
}


def _mkdir_then(directory: Path, model: Path) -> Path:
    directory.mkdir()
    return model


def _write(p: Path, data: bytes) -> Path:
    p.write_bytes(data)
    return p


@pytest.fixture(scope="module")
def populated_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One real build of the good model into a FARM_HOME, made once for the module: each test
    gets its own copy (``populated``), so none sees another's writes."""
    root = tmp_path_factory.mktemp("populated")
    (root / "good").mkdir()
    home = Settings.from_env({"FARM_HOME": str(root / "farm-home")})
    build(home, conv_relu_add(root / "good" / "good.onnx"), ["qnn:SM8650"], name="good")
    return root


@pytest.fixture
def populated(settings: Settings, tmp_path: Path, populated_template: Path) -> Path:
    """A registry that already holds an artifact, so 'unchanged' means something: a private copy
    of the module's built FARM_HOME at ``settings.home``, and the model beside it in good/."""
    import shutil

    assert settings.home == tmp_path / "farm-home"
    shutil.copytree(populated_template / "good", tmp_path / "good")
    shutil.copytree(populated_template / "farm-home", settings.home, dirs_exist_ok=True)
    assert snapshot(settings)["blobs"], "the copied registry holds the good build"
    return tmp_path


@pytest.mark.parametrize("case", sorted(MODELS))
def test_hostile_models(case: str, settings: Settings, farm_env: dict[str, str], populated: Path) -> None:
    make, code = MODELS[case]
    work = populated / "case"
    work.mkdir()
    model = make(work)
    before, files_before = snapshot(settings), files_under(populated, (settings.home,))
    proc = farm(farm_env, "build", str(model), "-t", "qnn:SM8650", "--name", "hostile", check=False)
    assert proc.returncode == 1
    check_failure(proc, code)
    assert snapshot(settings) == before
    assert files_under(populated, (settings.home,)) == files_before


def test_memory_bomb_is_a_cached_resource_limit(settings: Settings, farm_env: dict[str, str], tmp_path: Path) -> None:
    env = {**farm_env, "FARM_COMPILE_MEMORY_MB": "1536"}
    model = bomb(tmp_path)
    first = farm(env, "build", str(model), "-t", "qnn:SM8650", check=False, timeout=120)
    assert first.returncode == 1 and check_failure(first) == "resource-limit"
    again = farm(env, "build", str(model), "-t", "qnn:SM8650", check=False)
    assert again.returncode == 1 and "answered from the index" in again.stderr


def test_symlinked_model_compiles_exactly_the_bytes_that_were_hashed(settings: Settings, tmp_path: Path) -> None:
    """A link in A/ to a model in B/: the data beside the link is what is hashed and compiled; an
    honest build of B/ (other data) is a different digest, never served the first result."""
    a, b = tmp_path / "A", tmp_path / "B"
    a.mkdir()
    b.mkdir()
    conv_relu_add(b / "m.onnx", external=True, seed=1)
    conv_relu_add(tmp_path / "other.onnx", external=True, seed=2)
    (a / "m.data").write_bytes((tmp_path / "other.data").read_bytes())
    (a / "m.onnx").symlink_to(b / "m.onnx")
    (via_link,) = build(settings, a / "m.onnx", ["qnn:SM8650"]).outcomes
    (honest,) = build(settings, b / "m.onnx", ["qnn:SM8650"]).outcomes
    assert via_link.state == honest.state == "built"
    assert via_link.build_id != honest.build_id and via_link.artifact != honest.artifact


BAD_NAMES = ["/some/dir/x", "../../x", "UPPER", "a..b", "x/", "/x", "a b", "x" * 300, "-x", "a//b", "na\x00me",
             "../esc", "x:y:z"]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_names_never_become_paths(name: str, settings: Settings, farm_env: dict[str, str], populated: Path) -> None:
    before, files_before = snapshot(settings), files_under(populated, (settings.home,))
    model = populated / "good" / "good.onnx"
    try:
        proc = farm(farm_env, "build", str(model), "-t", "qnn:SM8650", "--name", name, check=False)
    except ValueError:  # a NUL can't even reach argv
        return
    assert proc.returncode == 2
    check_failure(proc)  # bad-name, or usage when argparse already refuses it (a leading '-')
    fetched = farm(farm_env, "fetch", "--model", name, "--soc", "SM8650", "--qnn", "2.51.0", "--out",
                   str(populated / "dev" / "inner"), check=False)
    assert fetched.returncode == 2 and check_failure(fetched) in ("bad-name", "usage")
    assert snapshot(settings) == before
    assert files_under(populated, (settings.home,)) == files_before


@pytest.mark.parametrize("tag", ["", "-x", "a" * 129, "a/b", "t:t"])
def test_bad_tags(tag: str, settings: Settings, farm_env: dict[str, str], populated: Path) -> None:
    proc = farm(farm_env, "build", str(populated / "good" / "good.onnx"), "-t", "qnn:SM8650", "--name", "ok",
                "--tag", tag, check=False)
    assert proc.returncode == 2 and check_failure(proc) in ("bad-name", "usage")


# ---- settings -------------------------------------------------------------------------------------

def _settings_cases(tmp: Path) -> dict[str, dict[str, str]]:
    (tmp / "not-a-db").write_bytes(b"this is not an sqlite database" * 100)
    (tmp / "home-file").write_text("x")
    (tmp / "binary.key").write_bytes(bytes(range(256)))
    return {
        "db-garbage": {"FARM_DATABASE_URL": "garbage"},
        "db-port": {"FARM_DATABASE_URL": "postgresql://u@127.0.0.1:notaport/db"},
        "db-unsupported": {"FARM_DATABASE_URL": "mysql://u@h/db"},
        "db-not-a-database": {"FARM_DATABASE_URL": f"sqlite:///{tmp / 'not-a-db'}"},
        "home-is-a-file": {"FARM_HOME": str(tmp / "home-file")},
        "s3-endpoint": {"FARM_STORE_URL": "s3://bucket/p?endpoint=not a url"},
        "s3-retries": {"FARM_STORE_URL": "s3://bucket/p?endpoint=http://127.0.0.1:1&retries=many"},
        "store-scheme": {"FARM_STORE_URL": "ftp://x/y"},
        "timeout-inf": {"FARM_COMPILE_TIMEOUT": "inf"},
        "timeout-nan": {"FARM_COMPILE_TIMEOUT": "nan"},
        "timeout-negative": {"FARM_COMPILE_TIMEOUT": "-1"},
        "memory-words": {"FARM_COMPILE_MEMORY_MB": "lots"},
        "attempts-fraction": {"FARM_MAX_ATTEMPTS": "2.5"},
        "trusted-binary": {"FARM_TRUSTED_KEYS": str(tmp / "binary.key")},
        "trusted-garbage": {"FARM_TRUSTED_KEYS": "not-base64!!"},
        "require-y": {"FARM_REQUIRE_SIGNATURE": "y"},
        "require-maybe": {"FARM_REQUIRE_SIGNATURE": "maybe"},
        "broker-scheme": {"FARM_BROKER_URL": "http://127.0.0.1:1"},
        "broker-port": {"FARM_BROKER_URL": "redis://127.0.0.1:x/0"},
    }


SETTINGS_CASES = ["db-garbage", "db-port", "db-unsupported", "db-not-a-database", "home-is-a-file", "s3-endpoint",
                  "s3-retries", "store-scheme", "timeout-inf", "timeout-nan", "timeout-negative", "memory-words",
                  "attempts-fraction", "trusted-binary", "trusted-garbage", "require-y", "require-maybe",
                  "broker-scheme", "broker-port"]


@pytest.mark.parametrize("case", SETTINGS_CASES)
def test_bad_settings_name_the_variable(case: str, farm_env: dict[str, str], tmp_path: Path) -> None:
    env = {**farm_env, **_settings_cases(tmp_path)[case]}
    proc = farm(env, "fetch", "--model", "good", "--soc", "SM8650", "--qnn", "2.51.0", "--out",
                str(tmp_path / "out"), check=False)
    assert proc.returncode != 0
    code = check_failure(proc)
    assert code in ("bad-config", "database-error"), proc.stderr
    if code == "bad-config":
        assert "FARM_" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_require_signature_true_words_are_honoured(settings: Settings, farm_env: dict[str, str],
                                                    populated: Path) -> None:
    for word in ("on", "TRUE ", "Yes", "1"):
        proc = farm({**farm_env, "FARM_REQUIRE_SIGNATURE": word}, "fetch", "--model", "good", "--soc", "SM8650",
                    "--qnn", "2.51.0", "--out", str(populated / "o"), check=False)
        assert proc.returncode == 1 and check_failure(proc) == "unsigned", word
        assert not (populated / "o").exists()


# ---- commands -------------------------------------------------------------------------------------

def test_hostile_command_arguments(settings: Settings, farm_env: dict[str, str], populated: Path) -> None:
    before = snapshot(settings)
    cases = [
        (["registry", "gc", "--grace", "999999999999d"], 2, "usage"),
        (["registry", "gc", "--grace", "1e400s"], 2, "usage"),
        (["status", "99999999999999999999"], 2, "usage"),
        (["status", "--build", "99999999999999999999"], 2, "usage"),
        (["status", "--build", "-3"], 2, "usage"),
        (["resolve", "--model", "good", "--soc", "SM8650", "--qnn", "banana"], 2, "usage"),
        (["resolve", "--model", "good", "--soc", "SM9999", "--qnn", "2.51.0"], 2, "unknown-target"),
        (["show", "zzzzzz"], 1, "not-found"),  # a model name (farm show takes NAME:TAG, NAME, a digest)
        (["show", "!bad name"], 2, "bad-name"),
        (["resolve", "--model", "sha256:" + "0" * 64, "--soc", "SM8650", "--qnn", "2.51.0"], 1, "not-found"),
    ]
    for (args, rc, code), proc in zip(cases, farm_many(farm_env, [args for args, _, _ in cases]), strict=True):
        assert proc.returncode == rc, (args, proc.stderr)
        assert check_failure(proc, code)
    assert snapshot(settings) == before


# Bad invocations: a missing flag, a bad version, SoC, digest, option or name, an unknown command
# or flag. Each is a usage-type error (exit 2) with a documented code, before anything is written.
BAD_INVOCATIONS: list[tuple[list[str], str, str | None]] = [
    # (argv, code, text the message must hold); {m} is the good model file, {d} a fresh directory
    (["build", "{m}"], "usage", "no target given"),
    (["build"], "usage", "required: model"),
    (["submit", "{m}"], "usage", "no target given"),
    (["resolve", "--soc", "SM8650", "--qnn", "2.51.0"], "usage", "which model?"),
    (["resolve", "--model", "good", "--soc", "SM8650"], "usage", "--soc and --qnn"),
    (["resolve", "--model", "good", "--qnn", "2.51.0"], "usage", "--soc and --qnn"),
    (["fetch", "--model", "good", "--soc", "SM8650", "--qnn", "2.51.0"], "usage", "--dest"),
    (["fetch", "--soc", "SM8650", "--qnn", "2.51.0", "-d", "{d}"], "usage", "which model?"),
    (["install", "--model", "good", "--dest", "{d}"], "usage", "--server"),
    (["load-check", "{m}"], "usage", "--target"),
    (["status"], "usage", "which release?"),
    (["token", "create"], "usage", "NAME"),
    # versions
    (["resolve", "--model", "good", "--soc", "SM8650", "--qnn", "banana"], "usage", "'banana' is not a toolchain version"),
    (["resolve", "--model", "good", "--soc", "SM8650", "--qnn", "2"], "usage", "not a toolchain version"),
    (["resolve", "--model", "good", "--soc", "SM8650", "--qnn", "2.51.0;rm -rf /"], "usage", "not a toolchain version"),
    (["resolve", "--model", "good", "--gpu", "sm_89", "--trt", "10"], "usage", "not a toolchain version"),
    (["submit", "{m}", "-t", "qnn:SM8650", "--sdk", "banana"], "usage", "not a toolchain version"),
    # SoCs and targets
    (["resolve", "--model", "good", "--soc", "SM9999", "--qnn", "2.51.0"], "unknown-target", "SM9999"),
    (["resolve", "--model", "good", "--soc", "../SM8650", "--qnn", "2.51.0"], "unknown-target", None),
    (["build", "{m}", "-t", "qnn:SM9999"], "unknown-target", "SM9999"),
    (["build", "{m}", "-t", "nonsense"], "unknown-target", None),
    (["load-check", "{m}", "-t", "qnn:SM9999"], "unknown-target", None),
    (["ls", "-t", "qnn:SM9999"], "unknown-target", None),
    # digests and ids
    (["resolve", "--model", "sha256:zz", "--soc", "SM8650", "--qnn", "2.51.0"], "usage", "not a model digest"),
    (["resolve", "--model", "sha256:abc", "--soc", "SM8650", "--qnn", "2.51.0"], "usage", "not a model digest"),
    (["resolve", "--model", "sha256:" + "0" * 65, "--soc", "SM8650", "--qnn", "2.51.0"], "usage", "not a model digest"),
    (["ls", "--model", "sha256:zz"], "usage", "not a model digest"),
    (["show", "sha256:zz"], "usage", "is not a model digest"),
    (["show", "!bad name"], "bad-name", "is not allowed"),
    (["show", "../../etc"], "bad-name", "is not allowed"),
    (["show", ""], "bad-name", "is not allowed"),
    (["fetch", "sha256:xyz", "-d", "{d}"], "usage", "not an artifact id"),
    (["status", "--build", "abc"], "usage", "invalid int value"),
    # options and names
    (["build", "{m}", "-t", "qnn:SM8650", "-o", "nokey"], "bad-options", "key=value"),
    (["build", "{m}", "-t", "qnn:SM8650", "-o", "no_such=1"], "bad-options", None),
    (["build", "{m}", "-t", "qnn:SM8650", "--name", "Bad Name"], "bad-name", None),
    # unknown commands, flags and choices: a suggestion
    (["biuld", "{m}"], "usage", "did you mean build?"),
    (["build", "{m}", "--taget", "qnn:SM8650"], "usage", "did you mean --target?"),
    (["resolve", "--model", "good", "--sco", "SM8650", "--qnn", "2.51.0"], "usage", "did you mean --soc?"),
    (["fetch", "--model", "good", "--soc", "SM8650", "--qnn", "2.51.0", "-o", "{d}"], "usage", "is now -d/--dest"),
    (["targets", "--backend", "qnnx"], "usage", "did you mean qnn?"),
    (["ls", "--limit", "0"], "usage", "choose from 1 to 100000"),
    # graph groups and multi-SoC targets (docs/groups.md): names never become paths
    (["build", "--graph", "../../etc={m}", "--graph", "decode={m}", "-t", "qnn:SM8650"], "bad-group", "not allowed"),
    (["build", "--graph", "prefill={m}", "--graph", "prefill={m}", "-t", "qnn:SM8650"], "bad-group", "twice"),
    (["build", "--group-file", "{d}/none.json", "-t", "qnn:SM8650"], "bad-group", "cannot read"),
    (["build", "--graph", "prefill={m}", "--graph", "decode={m}", "-t", "qnn:SM8450"], "sharing-unsupported",
     "v69"),
    (["submit", "--graph", "p={m}", "-t", "qnn:SM8650"], "bad-group", "at least two"),
    (["build", "{m}", "-t", "qnn:SM8650+"], "unknown-target", None),
    (["build", "{m}", "-t", "qnn:SM8650+SM9999"], "unknown-target", "SM9999"),
    (["build", "{m}", "-t", "trt:sm_90+sm_89"], "unknown-target", None),
]


def test_bad_invocations_are_usage_errors_with_documented_codes(settings: Settings, farm_env: dict[str, str],
                                                                 populated: Path) -> None:
    before = snapshot(settings)
    model = str(populated / "good" / "good.onnx")
    calls = [[a.format(m=model, d=populated / f"out{i}") for a in argv] for i, (argv, _, _) in enumerate(BAD_INVOCATIONS)]
    # The same error as a document on stdout, for the commands that answer --json.
    json_calls = {i: [*args, "--json"] for i, args in enumerate(calls)
                  if "--json" not in args and BAD_INVOCATIONS[i][0][0] in ("resolve", "ls", "show")}
    # None of these writes anything (asserted below), so they run two at a time.
    answers = farm_many(farm_env, calls + list(json_calls.values()))
    with_json = dict(zip(json_calls, answers[len(calls):], strict=True))
    for i, ((_, code, text), args, proc) in enumerate(zip(BAD_INVOCATIONS, calls, answers[:len(calls)], strict=True)):
        assert proc.returncode == 2, (args, proc.returncode, proc.stderr)
        assert check_failure(proc, code) == code, (args, proc.stderr)
        assert text is None or text in proc.stderr, (args, proc.stderr)
        assert "farm-error" not in proc.stderr
        assert not (populated / f"out{i}").exists()
        if i in with_json:
            assert json.loads(with_json[i].stdout)["error"]["code"] == code, (args, with_json[i].stdout)
    assert snapshot(settings) == before


def test_fetch_out_is_an_existing_file(settings: Settings, farm_env: dict[str, str], populated: Path) -> None:
    target = populated / "afile"
    target.write_text("mine")
    proc = farm(farm_env, "fetch", "--model", "good", "--soc", "SM8650", "--qnn", "2.51.0", "--out", str(target),
                check=False)
    assert proc.returncode == 1 and check_failure(proc) == "install-conflict"
    assert target.read_text() == "mine"


def test_stray_files_in_the_blob_store_are_reported_and_skipped(settings: Settings, farm_env: dict[str, str],
                                                                  populated: Path) -> None:
    blobs = settings.home / "blobs" / "blobs" / "sha256"
    (blobs / "zz").mkdir()
    (blobs / "zz" / "stray.txt").write_text("not a blob")
    (blobs / "README").write_text("not a blob either")
    gc = farm(farm_env, "registry", "gc", "--grace", "0s")
    assert "not a blob of ours" in gc.stderr and "Traceback" not in gc.stderr
    verify = farm(farm_env, "registry", "verify")
    assert "not a blob of ours" in verify.stderr
    assert (blobs / "zz" / "stray.txt").exists(), "foreign entries are never deleted"


def test_broken_pipe_is_quiet(settings: Settings, farm_env: dict[str, str], populated: Path) -> None:
    from sqlalchemy import select

    from registry.index import Registry
    from registry.models import Artifact

    reg = Registry.open(settings)
    with reg.db.session() as s:
        art = s.scalars(select(Artifact)).first()
        assert art is not None
        short = art.short_id
    reg.close()
    script = (f"{sys.executable} -m farm.cli show {short} --json | head -c 10 > /dev/null; "
              f"{sys.executable} -m farm.cli ls --json | head -n 1 >/dev/null")
    proc = subprocess.run(["bash", "-o", "pipefail", "-c", script], env=farm_env, capture_output=True, text=True,
                          timeout=60)
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr


def test_forged_index_row_cannot_serve_another_models_signed_artifact(settings: Settings, farm_env: dict[str, str],
                                                                      tmp_path: Path) -> None:
    """Re-point one index row at another model's (validly signed) manifest: fetch refuses it,
    even with --require-signature, before writing anything."""
    from sqlalchemy import update

    from registry.index import Registry
    from registry.models import Artifact

    key = tmp_path / "k.pem"
    farm(farm_env, "keys", "create", str(key))
    pub = farm(farm_env, "keys", "public", str(key)).stdout.strip()
    env = {**farm_env, "FARM_SIGNING_KEY": str(key), "FARM_TRUSTED_KEYS": pub}
    (a,) = build(Settings.from_env(env), conv_relu_add(tmp_path / "a.onnx", seed=21), ["qnn:SM8650"],
                 name="alpha").outcomes
    (b,) = build(Settings.from_env(env), conv_relu_add(tmp_path / "b.onnx", seed=22), ["qnn:SM8650"],
                 name="beta").outcomes
    reg = Registry.open(settings)
    try:
        with reg.db.session() as s:
            # alpha's row now claims beta's manifest (and signature subject).
            s.execute(update(Artifact).where(Artifact.digest == b.artifact).values(digest="sha256:" + "f" * 64))
            s.execute(update(Artifact).where(Artifact.digest == a.artifact).values(digest=b.artifact))
    finally:
        reg.close()
    proc = farm(env, "fetch", "--model", "alpha", "--soc", "SM8650", "--qnn", "2.51.0", "--out",
                str(tmp_path / "dev"), "--require-signature", check=False)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert check_failure(proc) in ("signature-invalid", "digest-mismatch")
    assert not (tmp_path / "dev").exists()


def test_unsigned_is_refused_when_trusted_keys_are_set(settings: Settings, farm_env: dict[str, str],
                                                        populated: Path, tmp_path: Path) -> None:
    key = tmp_path / "k.pem"
    farm(farm_env, "keys", "create", str(key))
    pub = farm(farm_env, "keys", "public", str(key)).stdout.strip()
    env = {**farm_env, "FARM_TRUSTED_KEYS": pub}
    args = ["fetch", "--model", "good", "--soc", "SM8650", "--qnn", "2.51.0", "--out", str(tmp_path / "dev")]
    refused = farm(env, *args, check=False)
    assert refused.returncode == 1 and check_failure(refused) == "unsigned"
    assert not (tmp_path / "dev").exists()
    assert farm(env, *args, "--allow-unsigned").returncode == 0
    assert os.listdir(tmp_path / "dev")
