"""A genai package's release through the service says which build is which: `farm submit
--genai --wait` (its progress and its table), `farm status RELEASE` and their --json name each
build ``part0``, ``part1`` or ``package`` (they differed only by their ids)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from tests.common.genai import make_export
from tests.common.schemas import valid
from tests.integration.test_genai_api import cli, served  # noqa: F401 - the fixture


def test_the_release_tables_name_each_part_and_the_package(served: dict[str, Any], tmp_path: Path) -> None:  # noqa: F811
    export = make_export(tmp_path / "export")
    url, submit, env = served["url"], served["tokens"]["submit"], served["env"]
    human = cli(env, "submit", "--genai", str(export), "-t", "qnn:SM8650", "--name", "llm/tiny", "--tag", "v",
                "--wait", "--timeout", "240", "--server", url, "--token", submit)
    rows = {m.group(2): m.group(1) for m in re.finditer(r"^(\d+)\s+(part\d|package)\s+qnn:SM8650", human.stdout, re.M)}
    assert sorted(rows) == ["package", "part0", "part1"], human.stdout
    assert re.search(r"build \d+ part0 qnn:SM8650 2\.51\.0: ", human.stderr), human.stderr  # the --wait progress
    release = re.search(r"release (\d+)", human.stderr + human.stdout)
    assert release, human.stderr
    doc = valid("status", cli(env, "status", release.group(1), "--server", url, "--token", submit, "--json").stdout)
    assert {b["part"]: str(b["build"]) for b in doc["builds"]} == rows
    shown = cli(env, "status", release.group(1), "--server", url, "--token", submit).stdout
    assert re.search(rf"^{rows['package']}\s+package\s+qnn:SM8650", shown, re.M), shown
    # A plain model's release has no such field (lm_head alone fails: the QNN EP takes none of it).
    plain = json.loads(cli(env, "submit", str(export / "lm_head.onnx"), "-t", "qnn:SM8650", "--wait", "--server", url,
                           "--token", submit, "--json", check=False).stdout)
    assert all(b.get("part") is None for b in plain["builds"]), plain
