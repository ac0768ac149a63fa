"""`farm load-check DIR` on an LLM folder: an exporter's folder that was never built is refused
(not-a-context, build it first) instead of "6 context model(s) loaded"; an installed folder that
lost files names every one it lacks, the tokenizer (which genai_config.json does not name) too."""

from __future__ import annotations

import json
from pathlib import Path

from tests.common.cli import farm

OLIVE = Path(__file__).resolve().parents[1] / "data" / "genai" / "olive-qwen2-tiny"


def test_an_export_never_built_is_refused_with_the_hint_to_build_it(farm_env: dict[str, str]) -> None:
    got = farm(farm_env, "load-check", str(OLIVE), "-t", "qnn:SM8650", check=False)
    assert got.returncode == 1, (got.stdout, got.stderr)
    assert "error[not-a-context]" in got.stderr and "holds no context model" in got.stderr, got.stderr
    assert "build it first" in got.stderr and "loaded" not in got.stdout
    doc = json.loads(farm(farm_env, "load-check", str(OLIVE), "-t", "qnn:SM8650", "--json", check=False).stdout)
    assert doc["error"]["code"] == "not-a-context"


def test_an_installed_folder_names_every_file_it_lacks(farm_env: dict[str, str], tmp_path: Path) -> None:
    farm(farm_env, "build", "--genai", str(OLIVE), "-t", "qnn:SM8650", "--name", "llm/qwen", "--tag", "o", "--no-twin")
    dest = tmp_path / "llm"
    farm(farm_env, "fetch", "--model", "llm/qwen:o", "--soc", "SM8650", "--qnn", "2.51.0", "--dest", str(dest))
    whole = farm(farm_env, "load-check", str(dest), "-t", "qnn:SM8650", check=False)
    assert whole.returncode == 4 and "error[load-unverified]" in whole.stderr, whole.stderr  # all there
    (dest / "tokenizer.json").unlink()
    (dest / "lm_head.onnx").unlink()
    got = farm(farm_env, "load-check", str(dest), "-t", "qnn:SM8650", "--json", check=False)
    assert got.returncode == 1, (got.stdout, got.stderr)
    err = json.loads(got.stdout)["error"]
    assert err["code"] == "not-found" and "lm_head.onnx, tokenizer.json" in err["message"], err
