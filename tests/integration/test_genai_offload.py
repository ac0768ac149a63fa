"""An LLM whose parts leave an op on the CPU (Olive's export keeps GroupQueryAttention there) says
so on every path a user builds or looks at it: `farm build --genai` (its table and --json), the
package's resolve answer and `farm show`, and a part built alone as a graph group."""

from __future__ import annotations

import json
from pathlib import Path

from tests.common.cli import farm

OLIVE = Path(__file__).resolve().parents[1] / "data" / "genai" / "olive-qwen2-tiny"
WARNING = "warning[partial-offload]"


def test_partial_offload_of_an_llm_shows_on_every_build_path(farm_env: dict[str, str]) -> None:
    built = farm(farm_env, "build", "--genai", str(OLIVE), "-t", "qnn:SM8650", "--name", "llm/qwen", "--tag", "o")
    assert f"{WARNING} package qnn:SM8650: 4 node(s) stay on the CPU (GroupQueryAttention)" in built.stderr, built.stderr
    again = json.loads(farm(farm_env, "build", "--genai", str(OLIVE), "-t", "qnn:SM8650", "--name", "llm/qwen",
                            "--tag", "o", "--json").stdout)
    (warning,) = again["warnings"]
    assert warning["code"] == "partial-offload" and warning["cpu_op_types"] == ["GroupQueryAttention"]
    assert again["builds"][0]["state"] == "cached"

    res = json.loads(farm(farm_env, "resolve", "--model", "llm/qwen:o", "--soc", "SM8650", "--qnn", "2.51.0",
                          "--json").stdout)
    assert res["offload"] == {"full": False, "ep_nodes": 8, "cpu_nodes": 4, "cpu_op_types": ["GroupQueryAttention"]}
    shown = farm(farm_env, "show", res["artifact"]).stdout
    assert "offload   partial offload: 4 node(s) stay on the CPU (GroupQueryAttention)" in shown, shown

    group = farm(farm_env, "build", "--graph", f"prefill={OLIVE / 'context_0.onnx'}", "--graph",
                 f"decode={OLIVE / 'iterator_0.onnx'}", "-t", "qnn:SM8650")
    assert f"{WARNING} qnn:SM8650: 2 node(s) stay on the CPU (GroupQueryAttention)" in group.stderr, group.stderr
