"""A genai package's release through the service says which build is which: `farm submit
--genai --wait` (its progress and its table), `farm status RELEASE` and their --json name each
build ``part0``, ``part1`` or ``package`` (they differed only by their ids); and the package's
partial offload (Olive's export leaves GroupQueryAttention on the CPU) is a warning there too."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from tests.common.genai import make_export
from tests.common.schemas import valid
from tests.integration.test_genai_api import cli, served  # noqa: F401 - the fixture

OLIVE = Path(__file__).resolve().parents[1] / "data" / "genai" / "olive-qwen2-tiny"


def test_the_release_tables_name_each_part_and_the_package(served: dict[str, Any], tmp_path: Path) -> None:  # noqa: F811
    export = OLIVE
    url, submit, env = served["url"], served["tokens"]["submit"], served["env"]
    human = cli(env, "submit", "--genai", str(export), "-t", "qnn:SM8650", "--name", "llm/tiny", "--tag", "v",
                "--wait", "--timeout", "240", "--server", url, "--token", submit)
    rows = {m.group(2): m.group(1) for m in re.finditer(r"^(\d+)\s+(part\d|package)\s+qnn:SM8650", human.stdout, re.M)}
    assert sorted(rows) == ["package", "part0", "part1"], human.stdout
    assert re.search(r"build \d+ part0 qnn:SM8650 2\.51\.0: ", human.stderr), human.stderr  # the --wait progress
    assert re.search(r"warning\[partial-offload\] qnn:SM8650: 4 node\(s\) stay on the CPU \(GroupQueryAttention\)",
                     human.stderr), human.stderr  # the package's (its parts' say 2 each)
    release = re.search(r"release (\d+)", human.stderr + human.stdout)
    assert release, human.stderr
    doc = valid("status", cli(env, "status", release.group(1), "--server", url, "--token", submit, "--json").stdout)
    assert {b["part"]: str(b["build"]) for b in doc["builds"]} == rows
    (package,) = [w for w in doc["warnings"] if str(w["nodes_cpu"]) == "4"]
    assert package["cpu_op_types"] == ["GroupQueryAttention"]
    shown = cli(env, "status", release.group(1), "--server", url, "--token", submit).stdout
    assert re.search(rf"^{rows['package']}\s+package\s+qnn:SM8650", shown, re.M), shown
    # A plain model's release has no such field (lm_head alone fails: the QNN EP takes none of it).
    lm_head = make_export(tmp_path / "export") / "lm_head.onnx"
    plain = json.loads(cli(env, "submit", str(lm_head), "-t", "qnn:SM8650", "--wait", "--server", url,
                           "--token", submit, "--json", check=False).stdout)
    assert all(b.get("part") is None for b in plain["builds"]), plain
