"""Partial offload in plain sight: the resolve answer's ``offload``, how the CLI words
it, and the warnings of build/submit/status documents; answers from a service are hostile."""

from __future__ import annotations

import pytest

from farm.cli.offload import build_warning, offload_text, warnings_of
from registry.resolve import Verdict, describe, offload


def test_offload_of_an_artifact() -> None:
    assert offload(1, 1, ["Gemm"]) == {"full": False, "ep_nodes": 1, "cpu_nodes": 1, "cpu_op_types": ["Gemm"]}
    assert offload(2, 0, []) == {"full": True, "ep_nodes": 2, "cpu_nodes": 0, "cpu_op_types": []}
    # Published before the op types were recorded: the count says partial, the types are unknown.
    assert offload(1, 3, None)["cpu_op_types"] is None and offload(1, 3, None)["full"] is False
    assert offload(None, None, None)["full"] is None


class _Art:
    digest = "sha256:" + "a" * 64
    backend, target, toolchain = "qnn", "SM8650", "2.51.0"
    nodes_ep, nodes_cpu, cpu_op_types = 1, 1, ["Gemm"]
    compatibility = {"QNNExecutionProvider": "v2:6:2.51.0:5.51.0:0:57:0:0"}


def test_resolve_answer_names_the_cpu_ops_and_the_compatibility_string() -> None:
    doc = describe(_Art(), Verdict(True, "rule", "same SoC"))
    assert doc["offload"]["cpu_op_types"] == ["Gemm"] and doc["offload"]["full"] is False
    assert doc["compatibility"] == _Art.compatibility


def test_an_answer_without_the_columns_still_describes() -> None:
    class Old:  # an ORM row or candidate of an older index: no placement, no compatibility
        digest, backend, target, toolchain = _Art.digest, "qnn", "SM8650", "2.51.0"

    doc = describe(Old(), Verdict(True, "rule", "same SoC"))
    assert doc["offload"]["full"] is None and doc["compatibility"] == {}


def test_offload_text() -> None:
    assert offload_text(offload(1, 1, ["Gemm"])) == \
        "partial offload: 1 node(s) stay on the CPU (Gemm) beside 1 EP node(s)"
    assert offload_text(offload(1, 0, [])) is None and offload_text(None) is None
    assert "op types not recorded" in (offload_text(offload(1, 2, None)) or "")


@pytest.mark.parametrize("hostile", [
    {"full": False, "cpu_nodes": "\x1b[31m9", "ep_nodes": True, "cpu_op_types": ["\x1b]0;pwn\x07Gemm", 5, None]},
    {"full": False, "cpu_op_types": "Gemm" * 10_000},
    {"full": False, "cpu_op_types": ["X" * 10_000] * 10_000},
])
def test_offload_text_of_a_hostile_answer_is_clean_and_bounded(hostile: dict) -> None:  # type: ignore[type-arg]
    text = offload_text(hostile) or ""
    assert text.startswith("partial offload: ") and "\x1b" not in text and "\x07" not in text
    assert len(text) < 32 * 70 + 200


def test_build_warning_and_warnings_of() -> None:
    assert build_warning("qnn:SM8650", 0, []) is None and build_warning("qnn:SM8650", None, None) is None
    assert build_warning("qnn:SM8650", True, ["Gemm"]) is None  # a bool is no count
    text = build_warning("qnn:SM8650", 1, ["Gemm"]) or ""
    assert text.startswith("warning[partial-offload] qnn:SM8650: 1 node(s) stay on the CPU (Gemm)")
    builds = [{"target": "qnn:SM8650", "toolchain": "2.51.0", "state": "built", "artifact": "sha256:x",
               "nodes_cpu": 1, "cpu_op_types": ["Gemm"]},
              {"target": "qnn:SM8750", "toolchain": "2.51.0", "state": "built", "artifact": "sha256:y",
               "nodes_cpu": 0, "cpu_op_types": []},
              # gated: failed unsupported-ops; the error says it, no warning on top
              {"target": "qnn:SC8380XP", "toolchain": "2.51.0", "state": "failed", "artifact": "sha256:z",
               "nodes_cpu": 2, "cpu_op_types": ["Erf", "Mod"]}]
    (w,) = warnings_of(builds, ("built", "cached"))
    assert (w["code"], w["target"], w["artifact"], w["cpu_op_types"]) == (
        "partial-offload", "qnn:SM8650", "sha256:x", ["Gemm"])
    assert w["message"].startswith("qnn:SM8650: 1 node(s)")
