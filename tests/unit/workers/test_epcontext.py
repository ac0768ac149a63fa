"""workers.epcontext: the context files an EPContext model points at. A model the EP split in
several partitions has one main node naming the binary and others (main_context 0) naming none."""

from __future__ import annotations

from pathlib import Path

import pytest

from farm.core.errors import ToolchainError
from workers.epcontext import referenced_files


def test_a_second_partition_names_no_binary_of_its_own(tmp_path: Path) -> None:
    (tmp_path / "m_ctx_qnn.bin").write_bytes(b"x")
    nodes = [{"main_context": 1, "ep_cache_context": "m_ctx_qnn.bin", "embed_mode": 0},
             {"main_context": 0, "embed_mode": 0}]
    assert referenced_files(nodes, tmp_path) == ["m_ctx_qnn.bin"]


@pytest.mark.parametrize("node", [{"main_context": 1, "embed_mode": 0},
                                  {"main_context": 0, "ep_cache_context": "../x.bin", "embed_mode": 0},
                                  {"ep_cache_context": "", "embed_mode": 0}])
def test_a_main_node_without_a_binary_or_one_outside_is_refused(tmp_path: Path, node: dict) -> None:  # type: ignore[type-arg]
    with pytest.raises(ToolchainError, match="outside its directory"):
        referenced_files([node], tmp_path)
