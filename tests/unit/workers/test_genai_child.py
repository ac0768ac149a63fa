"""The twin's comparison (workers.qnn.genai_child.compare_runs): tokens matched as the common
prefix, where the runs first differ and by how much the reference preferred its own token."""

from __future__ import annotations

from typing import Any

import numpy as np

from workers.qnn.genai_child import compare_runs


def _run(tokens: list[int], *, vocab: int = 8, bump: float = 0.0, at: int = -1) -> dict[str, Any]:
    """A run whose step-i logits peak at tokens[i] (+1 over the rest); ``bump`` shifts step
    ``at``'s logits of the token after it, so the two runs' logits differ there."""
    logits = []
    for i, t in enumerate(tokens):
        lg = np.zeros(vocab, np.float32)
        lg[t] = 1.0
        if i == at:
            lg[(t + 1) % vocab] += bump
        logits.append(lg)
    return {"tokens": tokens, "logits": logits}


def test_all_tokens_match() -> None:
    ref = _run([1, 2, 3, 4])
    twin = _run([1, 2, 3, 4], bump=0.01, at=2)
    out = compare_runs(ref, twin)
    assert (out["tokens_compared"], out["tokens_matched"], out["first_mismatch"]) == (4, 4, None)
    assert out["mismatch_logit_gap"] is None
    assert abs(out["max_logit_error"] - 0.01) < 1e-6
    assert out["first_step"]["psnr_db"] == 200.0  # identical first step: the cap


def test_a_flip_is_counted_from_the_first_difference_with_its_gap() -> None:
    ref = _run([1, 2, 3, 4, 5])
    ref["logits"][2][6] = 0.97  # the reference's runner-up at step 2, 0.03 behind
    twin = _run([1, 2, 6, 4, 5])  # later tokens equal again: not counted, the text differs
    out = compare_runs(ref, twin)
    assert (out["tokens_matched"], out["first_mismatch"]) == (2, 2)
    assert abs(out["mismatch_logit_gap"] - 0.03) < 1e-6
    # Logit errors only over the steps both ran on the same text (0..2).
    assert abs(out["max_logit_error"] - 1.0) < 1e-6


def test_a_twin_that_stopped_early_matches_what_it_generated() -> None:
    out = compare_runs(_run([1, 2, 3]), _run([1, 2]))
    assert (out["tokens_compared"], out["tokens_matched"], out["first_mismatch"]) == (3, 2, 2)
    assert out["mismatch_logit_gap"] is None


def test_the_simulator_runs_on_one_cpu_where_there_are_fewer_than_its_threads() -> None:
    """In a child process (the affinity is the process's): given 2 CPUs, the threads created
    after it (the simulator's) get one; given 4 or more, they keep them all."""
    import os
    import subprocess
    import sys

    import pytest

    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("one CPU: nothing to narrow")
    code = ("import os, sys, threading; from workers.qnn.genai_child import _simulator_cpus; "
            "os.sched_setaffinity(0, set(map(int, sys.argv[1].split(',')))); n = _simulator_cpus(); "
            "seen = []; t = threading.Thread(target=lambda: seen.append(len(os.sched_getaffinity(0)))); t.start(); "
            "t.join(); print(n, seen[0])")
    two = subprocess.run([sys.executable, "-c", code, ",".join(map(str, cpus[:2]))], capture_output=True, text=True,
                         check=True)
    assert two.stdout.split() == ["1", "1"], two.stderr
    if len(cpus) >= 4:
        four = subprocess.run([sys.executable, "-c", code, ",".join(map(str, cpus[:4]))], capture_output=True,
                              text=True, check=True)
        assert four.stdout.split() == ["4", "4"], four.stderr


def test_first_step_is_the_first_step_the_htp_computed() -> None:
    """With the prefill on the CPU EP (its figures are the part checks'), step 0's logits are the
    CPU's own: the first step compared is the first decode step."""
    ref = _run([1, 2, 3, 4])
    twin = _run([1, 2, 3, 4], bump=0.5, at=1)
    assert compare_runs(ref, twin)["first_step"]["psnr_db"] == 200.0
    assert compare_runs(ref, twin, first=1)["first_step"]["psnr_db"] < 200.0
    assert compare_runs(_run([1]), _run([1]), first=1)["first_step"] is None


def test_cpu_slots_split_the_cpus_among_children_at_once() -> None:
    from workers.qnn.genai import cpu_slots

    assert cpu_slots([0, 1], 3) == [[0], [1]]          # never more sets than CPUs
    assert cpu_slots([0, 1], 1) == [[0]]               # one CPU: the simulator is faster on one (2 cores)
    assert cpu_slots([0], 2) == [[0]]
    assert cpu_slots(list(range(16)), 3) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]  # at most 4 HVX threads
    assert cpu_slots(list(range(6)), 3) == [[0], [1], [2]]  # fewer than 4 each: one each


def test_memory_bounds_the_part_checks_at_once() -> None:
    from workers.qnn.genai import memory_bound

    gib = 1 << 30
    assert memory_bound([gib, 2 * gib], 13 * gib) == 2   # 3x the largest part each
    assert memory_bound([gib, 2 * gib], 1 * gib) == 1    # always one
    assert memory_bound([], gib) == 1


def test_worst_part_names_the_part_phase_and_output() -> None:
    from workers.qnn.genai import worst_part

    parts = [{"part": 0, "prefill": {"h": 70.1, "k": 90.0}, "decode": {"h": 71.0}},
             {"part": 1, "status": "runtime-crashed"},
             {"part": 2, "prefill": {"h": 80.0}, "decode": {"present.4.key": 12.5}}]
    assert worst_part(parts) == {"part": 2, "phase": "decode", "output": "present.4.key", "psnr_db": 12.5}
    assert worst_part([{"part": 0, "status": "unverified"}]) is None


MIB = 1 << 20


def test_twin_caps_grow_with_what_each_child_loads() -> None:
    from workers.qnn.genai import CAP_FACTOR, twin_cap_mb, twin_peak_mb

    part, everything = 1604 * MIB, 3214 * MIB  # the default export: 2 parts of 1.57 GiB
    # The measured peaks at that size (part check 3,210 MiB, generation 6,615 MiB RSS) are predicted.
    assert abs(twin_peak_mb(part) - 3210) < 0.05 * 3210
    assert abs(twin_peak_mb(everything, generate=True) - 6615) < 0.05 * 6615
    # The generation's cap covers its measured VmPeak (7,195 MiB), which the flat 6 GiB did not.
    gen_cap = twin_cap_mb(everything, 6144, generate=True)
    assert gen_cap == int(CAP_FACTOR * twin_peak_mb(everything, generate=True)) > 7195
    assert twin_cap_mb(part, 6144) > 4616  # a part check's measured VmPeak
    # Small children keep the floor; no floor means no cap at all.
    assert twin_cap_mb(162 * MIB, 6144) == 6144
    assert twin_cap_mb(everything, 0, generate=True) == 0
    # A floor below a child's address space: the cap still holds its predicted RSS plus the gap.
    assert twin_cap_mb(162 * MIB, 512) >= twin_peak_mb(162 * MIB) + 1024


def test_twin_plan_runs_only_what_fits_at_once() -> None:
    from workers.qnn.genai import plan_twin, twin_peak_mb

    parts, everything = [1604 * MIB, 1604 * MIB], 3214 * MIB
    part_need, gen_need = twin_peak_mb(parts[0]), twin_peak_mb(everything, generate=True)

    roomy = plan_twin(parts, everything, 6144, gen_need + 2 * part_need, concurrent=True)
    assert (roomy.concurrent, roomy.parts_at_once) == (True, 2)
    assert roomy.part_caps_mb == [max(6144, 2 * part_need)] * 2

    one_beside = plan_twin(parts, everything, 6144, gen_need + part_need, concurrent=True)
    assert (one_beside.concurrent, one_beside.parts_at_once) == (True, 1)

    # No room for the generation beside a part check: the part checks first, then it alone.
    after = plan_twin(parts, everything, 6144, gen_need + part_need - 1, concurrent=True)
    assert after.concurrent is False
    assert after.parts_at_once == min(2, (gen_need + part_need - 1) // part_need)  # as many as the host holds
    assert plan_twin(parts, MIB, 6144, 2 * part_need - 1, concurrent=False).parts_at_once == 1  # one at a time

    unknown = plan_twin(parts, everything, 0, None, concurrent=True)
    assert (unknown.concurrent, unknown.parts_at_once, unknown.generate_cap_mb) == (True, 2, 0)
    assert plan_twin(parts, everything, 6144, gen_need, concurrent=False).concurrent is False


def test_twin_that_would_not_fit_is_refused_before_it_starts() -> None:
    import pytest

    from farm.core.errors import ResourceLimitError
    from workers.qnn.genai import plan_twin, twin_peak_mb

    everything = 3214 * MIB
    with pytest.raises(ResourceLimitError) as err:
        plan_twin([1604 * MIB] * 2, everything, 6144, twin_peak_mb(everything, generate=True) - 1, concurrent=False)
    assert err.value.code == "resource-limit"
    assert "generation" in err.value.message and "not started" in err.value.message


def test_what_the_twin_children_load_is_counted_once_a_file() -> None:
    from pathlib import Path

    from farm.core.genai import read_export
    from workers.qnn.genai import _generate_bytes, _part_bytes

    root = Path(__file__).resolve().parents[2] / "data" / "genai" / "olive-qwen2-tiny"
    export = read_export(root)
    size = {f.name: f.stat().st_size for f in root.iterdir()}
    # A part: its prefill and decode graph and the weights they share, once.
    assert _part_bytes(export) == [size[f"context_{i}.onnx"] + size[f"iterator_{i}.onnx"]
                                   + size[f"context_{i}.onnx.data"] for i in (0, 1)]
    # The generation: every part and the CPU stages.
    assert _generate_bytes(export) == sum(_part_bytes(export)) + size["embeddings.onnx"] + size["lm_head.onnx"]


def test_run_twin_that_would_not_fit_starts_no_child(monkeypatch: Any, tmp_path: Any) -> None:
    from pathlib import Path

    import pytest

    from farm.core.catalog import parse_target
    from farm.core.errors import ResourceLimitError
    from workers.qnn import genai

    started: list[str] = []
    monkeypatch.setattr(genai, "_available_mb", lambda: 64)  # a host with 64 MiB to spare
    monkeypatch.setattr(genai, "run_child", lambda *a, **k: started.append(a[1]))
    monkeypatch.setattr(genai, "twin_compile_part", lambda *a, **k: started.append("compile_part"))
    export = Path(__file__).resolve().parents[2] / "data" / "genai" / "olive-qwen2-tiny"
    with pytest.raises(ResourceLimitError, match="not started"):
        genai.run_twin(export, parse_target("qnn:SM8650"), {}, tmp_path / "work", memory_mb=6144)
    assert started == []
