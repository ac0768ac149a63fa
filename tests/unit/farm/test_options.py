from __future__ import annotations

import pytest

from farm.core.catalog import Target, parse_target
from farm.core.errors import BadOptionsError
from farm.core.keys import options_digest
from farm.core.options import QNN_OPTIONS, TRT_OPTIONS, normalize, parse_pairs, split_gate

SM8650 = parse_target("qnn:SM8650")
SM_75 = parse_target("trt:sm_75")
SM_90 = parse_target("trt:sm_90")
SHAPES = {"profile_min_shapes": "x:1x3", "profile_opt_shapes": "x:4x3", "profile_max_shapes": "x:8x3"}


def test_qnn_defaults_filled():
    assert normalize("qnn", {}, SM8650) == {"graph_optimization": 0, "embed_mode": 0, "vtcm_mb": 0}


def test_trt_defaults_filled():
    opts = normalize("trt", {}, SM_90)
    assert set(opts) == set(TRT_OPTIONS) | set(SHAPES) | {"calibration_table"}
    assert opts["builder_optimization_level"] == 3
    assert opts["calibration_table"] == ""


@pytest.mark.parametrize("backend,target", [("qnn", SM8650), ("trt", SM_90)])
def test_unset_equals_explicit_default(backend, target):
    schema = QNN_OPTIONS if backend == "qnn" else TRT_OPTIONS
    explicit = {name: str(spec.default) for name, spec in schema.items()}
    assert options_digest(normalize(backend, explicit, target)) == options_digest(normalize(backend, {}, target))


def test_non_default_changes_digest():
    assert (options_digest(normalize("qnn", {"graph_optimization": "3"}, SM8650))
            != options_digest(normalize("qnn", {}, SM8650)))


@pytest.mark.parametrize("raw,expected", [("true", True), ("YES", True), (" on ", True), ("1", True), (True, True),
                                          ("false", False), ("No", False), ("off", False), ("0", False),
                                          (False, False)])
def test_bool_coercion(raw, expected):
    assert split_gate({"require_full_offload": raw, "vtcm_mb": "4"}) == ({"vtcm_mb": "4"}, expected)


@pytest.mark.parametrize("backend,target", [("qnn", SM8650), ("trt", SM_90)])
def test_require_full_offload_is_a_gate_not_a_build_option(backend, target):
    """The same bytes are compiled with or without it (measured): not in the options, their
    digest or the build key; the -o spelling is taken out before normalize, which refuses it."""
    assert "require_full_offload" not in (QNN_OPTIONS if backend == "qnn" else TRT_OPTIONS)
    raw, gated = split_gate(parse_pairs(["require_full_offload=true"]))
    assert gated is True and raw == {}
    assert options_digest(normalize(backend, raw, target)) == options_digest(normalize(backend, {}, target))
    assert split_gate({}) == ({}, False)
    with pytest.raises(BadOptionsError, match="unknown"):
        normalize(backend, {"require_full_offload": "true"}, target)
    with pytest.raises(BadOptionsError, match="not a boolean") as info:
        split_gate({"require_full_offload": "maybe"})
    assert info.value.code == "bad-options"


def test_int_and_choice_coercion():
    opts = normalize("qnn", {"graph_optimization": " 3 ", "vtcm_mb": 8}, SM8650)
    assert opts["graph_optimization"] == 3 and opts["vtcm_mb"] == 8
    assert normalize("trt", {"precision": "FP16"}, SM_90)["precision"] == "fp16"


def test_unknown_option_lists_known():
    with pytest.raises(BadOptionsError) as info:
        normalize("qnn", {"htp_turbo": "1"}, SM8650)
    assert info.value.code == "bad-options"
    assert "htp_turbo" in info.value.message
    for name in QNN_OPTIONS:
        assert name in info.value.hint


def test_trt_only_option_is_unknown_for_qnn():
    with pytest.raises(BadOptionsError, match="calibration_table"):
        normalize("qnn", {"calibration_table": "c.cache"}, SM8650)


@pytest.mark.parametrize("raw,match", [
    ({"graph_optimization": "4"}, "out of range"),
    ({"graph_optimization": "-1"}, "out of range"),
    ({"vtcm_mb": "65"}, "out of range"),
    ({"embed_mode": "2"}, "out of range"),
    ({"graph_optimization": "high"}, "not an integer"),
    ({"graph_optimization": "1.5"}, "not an integer"),
])
def test_bad_values(raw, match):
    with pytest.raises(BadOptionsError, match=match) as info:
        normalize("qnn", raw, SM8650)
    assert info.value.code == "bad-options"


def test_out_of_range_hint_gives_range():
    with pytest.raises(BadOptionsError) as info:
        normalize("qnn", {"graph_optimization": "9"}, SM8650)
    assert info.value.hint == "allowed: 0..3"


def test_bad_choice_hint_lists_choices():
    with pytest.raises(BadOptionsError) as info:
        normalize("trt", {"precision": "bf16"}, SM_90)
    assert "fp32" in info.value.hint and "fp16" in info.value.hint and "int8" in info.value.hint


def test_parse_pairs():
    assert parse_pairs(["precision=fp16", "graph-optimization=3", "a=b=c", "x="]) == {
        "precision": "fp16", "graph_optimization": "3", "a": "b=c", "x": ""}
    assert parse_pairs(["k=v", "k=v"]) == {"k": "v"}  # the same pair twice is harmless


@pytest.mark.parametrize("pairs", [["precision"], ["=fp16"], [" =1"], ["k=1", "k=2"]])
def test_parse_pairs_malformed(pairs):
    with pytest.raises(BadOptionsError) as info:
        parse_pairs(pairs)
    assert info.value.code == "bad-options"


@pytest.mark.parametrize("value", ["fp16", "fp32", "int8"])
def test_qnn_precision_is_refused_with_what_htp_runs(value):
    """enable_htp_fp16_precision 0, 1 or unset compile byte-identical contexts (measured): a QNN
    precision option would only make duplicate artifacts, so it is refused with what HTP does."""
    no_soc = Target(backend="qnn", name="GENERIC", soc_model=None, htp_arch="v73")
    for target in (SM8650, no_soc, None):
        with pytest.raises(BadOptionsError) as info:
            normalize("qnn", {"precision": value}, target)
        assert info.value.code == "bad-options"
        assert "float models in fp16" in info.value.message and "QDQ" in info.value.message
        assert "quantize" in (info.value.hint or "")
    assert "precision" not in QNN_OPTIONS


def test_trt_int8_needs_calibration_table():
    with pytest.raises(BadOptionsError, match="calibration_table"):
        normalize("trt", {"precision": "int8"}, SM_90)
    opts = normalize("trt", {"precision": "int8", "calibration_table": " calib.cache "}, SM_90)
    assert opts["calibration_table"] == "calib.cache"


def test_trt_calibration_table_without_int8_refused():
    with pytest.raises(BadOptionsError, match="int8"):
        normalize("trt", {"calibration_table": "calib.cache"}, SM_90)


def test_trt_full_shape_profile_accepted():
    opts = normalize("trt", {"profile_min_shapes": "x:1x3,m:1x1", "profile_opt_shapes": "x:4x3,m:1x8",
                             "profile_max_shapes": "x:8x3,m:1x8"}, SM_90)
    assert opts["profile_opt_shapes"] == "x:4x3,m:1x8"


@pytest.mark.parametrize("missing", sorted(SHAPES))
def test_trt_partial_shape_profile(missing):
    raw = {k: v for k, v in SHAPES.items() if k != missing}
    with pytest.raises(BadOptionsError, match="all three"):
        normalize("trt", raw, SM_90)


@pytest.mark.parametrize("override,match", [
    ({"profile_opt_shapes": "x:9x3"}, "min <= opt <= max"),  # opt > max
    ({"profile_min_shapes": "x:5x3"}, "min <= opt <= max"),  # min > opt
    ({"profile_max_shapes": "x:8x2"}, "min <= opt <= max"),  # second dim max < opt
    ({"profile_max_shapes": "x:8x3x1"}, "min <= opt <= max"),  # rank differs
    ({"profile_max_shapes": "y:8x3"}, "same inputs"),
    ({"profile_max_shapes": "x:8xthree"}, "name:DxDxD"),
    ({"profile_max_shapes": "8x3"}, "name:DxDxD"),
])
def test_trt_shape_profile_violations(override, match):
    with pytest.raises(BadOptionsError, match=match):
        normalize("trt", {**SHAPES, **override}, SM_90)


def test_trt_ampere_plus_needs_sm_80():
    with pytest.raises(BadOptionsError, match="sm_75"):
        normalize("trt", {"hardware_compatibility_level": "ampere_plus"}, SM_75)
    for ref in ("trt:sm_80", "trt:sm_90", "trt:sm_120"):
        opts = normalize("trt", {"hardware_compatibility_level": "ampere_plus"}, parse_target(ref))
        assert opts["hardware_compatibility_level"] == "ampere_plus"
