"""`farm show` of a genai package labels each file by what it is in the folder (the config,
each stage by its role, each part's binary, the tokenizer), not by the index's payload roles
(every file was `context`, the config `ctx-model`)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.common.cli import farm

OLIVE = Path(__file__).resolve().parents[1] / "data" / "genai" / "olive-qwen2-tiny"


def test_show_labels_a_packages_files_by_their_place_in_the_folder(farm_env: dict[str, str]) -> None:
    out = json.loads(farm(farm_env, "build", "--genai", str(OLIVE), "-t", "qnn:SM8650", "--name", "llm/qwen",
                          "--no-twin", "--json").stdout)
    shown = farm(farm_env, "show", out["builds"][0]["artifact"]).stdout
    listed = re.findall(r"^  (\S+)\s+(\S+)\s+[\d.]+ \S*B\s+sha256:", shown.split("\nfiles\n", 1)[1], re.M)
    labels = {name: label for label, name in listed}
    assert labels["genai_config.json"] == "config" and labels["tokenizer.json"] == "tokenizer", shown
    assert labels["context_0_ctx.onnx"] == "part0.prefill" and labels["iterator_1_ctx.onnx"] == "part1.decode"
    assert labels["context_1_ctx_qnn.bin"] == "part1.binary" and labels["embeddings.onnx"] == "embeddings"
    assert labels["manifest.json"] == "manifest"
    assert "context" not in labels.values() and "ctx-model" not in labels.values(), shown
