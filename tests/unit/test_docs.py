"""The documentation site builds with no warning (`mkdocs build --strict`: a broken link, a missing
page or a page left out of the nav fails), its generated pages hold what the code has (every
command, error code and route), it loads nothing from the internet, and the README stays a
README: at most 300 lines, the two quick-start commands first, links that lead somewhere."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    pytest.importorskip("mkdocs", reason="mkdocs is in the test extra: pip install -e '.[test]'")
    pytest.importorskip("material", reason="mkdocs-material is in the test extra: pip install -e '.[test]'")
    out = tmp_path_factory.mktemp("site")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")}
    env["NO_MKDOCS_2_WARNING"] = "1"  # Material's banner about MkDocs 2.0 is not a build warning
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                           str(ROOT / "mkdocs.yml"), "--site-dir", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-6000:]
    yield out, log


def test_the_site_builds_strict_without_a_warning(site: tuple[Path, str]) -> None:
    _out, log = site
    assert not [line for line in log.splitlines() if line.startswith(("WARNING", "ERROR"))], log[-4000:]


def test_the_nav_has_every_page_the_issue_asks_for() -> None:
    from tests.unit.test_doc_links import nav_pages

    listed = nav_pages()
    on_disk = {p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md")
               if "gen" not in p.relative_to(ROOT / "docs").parts}
    # A page missing from mkdocs.yml's nav still lands under "More" (docs/gen/hooks.py, tested below);
    # the nav names no page that is not there.
    assert listed - on_disk == set()
    assert {"index.md", "concepts.md", "cli.md", "errors.md", "api.md", "operations.md", "security.md",
            "tensorrt.md", "ci.md", "performance.md"} <= listed


def test_a_page_left_out_of_the_nav_is_still_reachable(tmp_path: Path) -> None:
    import sys

    sys.path.insert(0, str(ROOT / "docs" / "gen"))
    try:
        import hooks
    finally:
        sys.path.remove(str(ROOT / "docs" / "gen"))
    (tmp_path / "index.md").write_text("# x\n")
    (tmp_path / "new-feature.md").write_text("# y\n")
    config = {"nav": [{"Home": "index.md"}], "docs_dir": str(tmp_path)}
    assert hooks.on_config(config)["nav"] == [{"Home": "index.md"}, {"More": ["new-feature.md"]}]


def test_the_generated_pages_hold_what_the_code_has(site: tuple[Path, str]) -> None:
    from farm.cli import COMMANDS
    from farm.core.errors import codes

    out, _log = site
    cli = (out / "cli" / "index.html").read_text()
    assert [c for c in COMMANDS if f"farm {c}</code>" not in cli] == []
    assert "--require-full-offload" in cli and "--server" in cli
    errors = (out / "errors" / "index.html").read_text()
    assert [c for c in codes() if f"<code>{c}</code>" not in errors] == []
    api = (out / "api" / "index.html").read_text()
    sys.path.insert(0, str(ROOT / "docs" / "gen"))
    try:
        import render
    finally:
        sys.path.remove(str(ROOT / "docs" / "gen"))
    document = render.openapi()  # the service's own OpenAPI document
    assert [p for p in document["paths"] if f"<code>{p}</code>" not in api] == []
    assert [s for s in document["components"]["schemas"] if f'id="{s.lower()}"' not in api] == []
    concepts = (out / "concepts" / "index.html").read_text()
    assert "──claim──▶ running" in concepts  # the diagram of farm/pipeline/states.py
    assert "lint-imports" in concepts and "farm.core" in concepts


def test_every_recorded_bench_is_on_the_performance_page(site: tuple[Path, str]) -> None:
    out, _log = site
    page = (out / "performance" / "index.html").read_text()
    for recorded in sorted((ROOT / "bench" / "out").glob("*.json")):
        assert f"bench/out/{recorded.name}" in page


def test_the_site_loads_nothing_from_the_internet(site: tuple[Path, str]) -> None:
    out, _log = site
    remote = re.compile(r"<(?:script|link|img)\b[^>]*\b(?:src|href)=\"(?:https?:)?//", re.I)
    offenders = [p.relative_to(out).as_posix() for p in out.rglob("*.html") if remote.search(p.read_text())]
    assert offenders == []


def test_the_readme_is_short_and_starts_with_the_two_commands() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 300
    first_block = text.split("```sh\n", 1)[1].split("```", 1)[0]
    commands = [line.split("#", 1)[0].strip() for line in first_block.splitlines() if line.strip()]
    assert commands == ["./infra/quickstart.sh", "./infra/test.sh"]
    assert (ROOT / "infra" / "quickstart.sh").exists() and (ROOT / "infra" / "test.sh").exists()
    assert "## Performance" not in text  # the lab notebook lives in docs/performance.md


def test_the_readme_links_lead_somewhere() -> None:
    text = README.read_text()
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [link for link in links if "://" not in link]
    assert local, "the README links to the docs"
    assert [link for link in local if not (ROOT / link).exists()] == []
    assert {"docs/operations.md", "docs/ci.md", "docs/cli.md", "docs/api.md", "docs/errors.md"} <= set(local)


def test_every_setting_is_documented() -> None:
    """Each FARM_* variable farm/core/settings.py reads has a row on the Settings page."""
    names = set(re.findall(r"\"(FARM_[A-Z0-9_]+)\"", (ROOT / "farm" / "core" / "settings.py").read_text()))
    page = (ROOT / "docs" / "settings.md").read_text()
    assert names and sorted(n for n in names if f"`{n}`" not in page) == []


def test_every_readme_snippet_is_one_a_test_runs() -> None:
    """A command block of the README is the quick start (tests/integration/test_readme.py runs it),
    or marked `<!-- tested: NAME -->` (the same module runs it as written); its one Python block is
    the device's (tests/integration/test_cli_terminal.py runs it)."""
    text = README.read_text()
    fences = [m for m in re.finditer(r"^```(\w*)\n", text, re.M)]
    opening = fences[0::2]  # fences alternate: opening, closing
    shell = [m for m in opening if m.group(1) == "sh"]
    assert "./infra/quickstart.sh" in text[shell[0].end():]
    untested = []
    for m in shell[1:]:
        before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        if not before.startswith("<!-- tested: "):
            untested.append(text[m.end():m.end() + 60])
    assert untested == []
    python = [m for m in opening if m.group(1) == "python"]
    assert len(python) == 1 and text.rfind("### Load it on the device", 0, python[0].start()) != -1
