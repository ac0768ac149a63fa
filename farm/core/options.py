"""Build options per backend: schema, parsing of ``k=v`` pairs, validation, normalization.

Normalized options have every default filled in, so "unset" and "explicit default" give the
same options digest, hence the same build key.

Each QNN option is here for a measured effect on what is built (tests/integration/
test_qnn_options.py compiles with and without each one and asserts that the context bytes
differ): graph_optimization, vtcm_mb and embed_mode. There is no QNN ``precision``: see
QNN_PRECISION.

``require_full_offload`` is not a build option: the same bytes are compiled with or without it
(measured), so it is not in the normalized options, the options digest or the build key. It is a
gate on the answer (``--require-full-offload``; ``-o require_full_offload=true`` is still accepted
and ``split_gate`` takes it out before ``normalize``): the build runs ungated and the requester's
answer fails with unsupported-ops when the artifact's recorded placement has CPU nodes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from farm.core.catalog import Target
from farm.core.errors import BadOptionsError

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


@dataclass(frozen=True)
class OptionSpec:
    name: str
    kind: str  # "bool" | "int" | "choice"
    default: Any
    help: str
    choices: tuple[Any, ...] = ()
    min: int | None = None
    max: int | None = None

    def coerce(self, raw: Any) -> Any:
        if self.kind == "bool":
            if isinstance(raw, bool):
                return raw
            s = str(raw).strip().lower()
            if s in _TRUE:
                return True
            if s in _FALSE:
                return False
            raise BadOptionsError(
                f"option {self.name}={raw!r} is not a boolean", hint="use true/false (or 1/0)"
            )
        if self.kind == "int":
            try:
                value = int(str(raw).strip())
            except ValueError:
                raise BadOptionsError(f"option {self.name}={raw!r} is not an integer",
                                      hint=f"allowed: {self.min}..{self.max}") from None
            if (self.min is not None and value < self.min) or (self.max is not None and value > self.max):
                raise BadOptionsError(
                    f"option {self.name}={value} is out of range", hint=f"allowed: {self.min}..{self.max}"
                )
            return value
        choice = str(raw).strip().lower()
        if choice not in self.choices:
            raise BadOptionsError(
                f"option {self.name}={raw!r} is not allowed",
                hint=f"choose one of: {', '.join(map(str, self.choices))}",
            )
        return choice


QNN_OPTIONS: dict[str, OptionSpec] = {
    s.name: s
    for s in (
        OptionSpec("graph_optimization", "int", 0,
                   "HTP graph finalization optimization mode (0 default, 3 = longest prepare, best graph)",
                   min=0, max=3),
        OptionSpec("embed_mode", "int", 0, "0: context in a .bin beside the model, 1: embedded in the model",
                   min=0, max=1),
        OptionSpec("vtcm_mb", "int", 0, "HTP VTCM size in MB to use (0 = SoC default)", min=0, max=64),
    )
}

# Why QNN has no precision option (measured on QNN 2.47.0, 2.49.40 and 2.51.0: the EP's
# enable_htp_fp16_precision set to 0, to 1 or left unset compiles byte-identical contexts).
QNN_PRECISION = ("HTP runs float models in fp16 and quantized (QDQ) models in their integer types, whatever "
                 "is asked: enable_htp_fp16_precision 0, 1 or unset compile byte-identical contexts (measured, "
                 "QNN 2.47.0 to 2.51.0)")

TRT_OPTIONS: dict[str, OptionSpec] = {
    s.name: s
    for s in (
        OptionSpec("precision", "choice", "fp32", "fp32, fp16 or int8 (int8 needs calibration_table)",
                   choices=("fp32", "fp16", "int8")),
        OptionSpec("embed_mode", "int", 0, "0: engine beside the model, 1: embedded", min=0, max=1),
        OptionSpec("builder_optimization_level", "int", 3, "TensorRT builder optimization level", min=0, max=5),
        OptionSpec("workspace_mb", "int", 0, "max workspace in MiB (0 = TensorRT default)", min=0, max=1 << 20),
        OptionSpec("hardware_compatibility_level", "choice", "none",
                   "ampere_plus builds an engine that runs on sm_80 and newer",
                   choices=("none", "ampere_plus")),
        OptionSpec("version_compatible", "bool", False, "engine loadable by newer TensorRT versions"),
    )
}

# String-valued TRT options that are free-form (validated by shape, not by choice).
TRT_FREEFORM = ("calibration_table", "profile_min_shapes", "profile_opt_shapes", "profile_max_shapes")

SCHEMAS: dict[str, dict[str, OptionSpec]] = {"qnn": QNN_OPTIONS, "trt": TRT_OPTIONS}


# A gate on the answer, not a compile input (see the module docstring): never normalized.
REQUIRE_FULL_OFFLOAD = OptionSpec("require_full_offload", "bool", False,
                                  "fail with unsupported-ops when the build leaves any node on the CPU")


def split_gate(raw: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
    """``raw`` without ``require_full_offload``, and that gate's value (False when absent).
    ``-o require_full_offload=true`` is the old spelling of ``--require-full-offload``."""
    rest = dict(raw)
    if REQUIRE_FULL_OFFLOAD.name not in rest:
        return rest, False
    return rest, bool(REQUIRE_FULL_OFFLOAD.coerce(rest.pop(REQUIRE_FULL_OFFLOAD.name)))


def parse_pairs(pairs: Iterable[str]) -> dict[str, str]:
    """``["k=v", ...]`` from the command line into a dict; a malformed pair is a bad-options error."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise BadOptionsError(f"option {pair!r} is not of the form key=value",
                                  hint="e.g. --option graph_optimization=3")
        if key in out and out[key] != value:
            raise BadOptionsError(f"option {key} given twice with different values", hint="give each option once")
        out[key] = value
    return out


def normalize(backend: str, raw: Mapping[str, Any], target: Target | None = None) -> dict[str, Any]:
    """Fill defaults, coerce types, check combinations. Raises BadOptionsError."""
    schema = SCHEMAS[backend]
    freeform = TRT_FREEFORM if backend == "trt" else ()
    if backend == "qnn" and "precision" in raw:
        raise BadOptionsError(f"precision={raw['precision']} is not a QNN build option: {QNN_PRECISION}",
                              hint="drop --option precision; to run in int8/int16 on HTP, quantize the model to QDQ "
                                   "before building (onnxruntime.quantization)")
    unknown = sorted(k for k in raw if k not in schema and k not in freeform)
    if unknown:
        known = ", ".join([*schema, *freeform])
        raise BadOptionsError(
            f"unknown {backend} option(s): {', '.join(unknown)}", hint=f"known {backend} options: {known}"
        )
    out: dict[str, Any] = {name: spec.coerce(raw[name]) if name in raw else spec.default
                           for name, spec in schema.items()}
    for name in freeform:
        value = str(raw.get(name, "")).strip()
        out[name] = value
    _check_combinations(backend, out, target)
    return out


def _check_combinations(backend: str, opts: dict[str, Any], target: Target | None) -> None:
    if backend == "qnn":
        return
    if opts["precision"] == "int8" and not opts["calibration_table"]:
        raise BadOptionsError(
            "precision=int8 needs calibration_table=<file>",
            hint="TensorRT int8 needs a calibration table for models without Q/DQ nodes",
        )
    if opts["calibration_table"] and opts["precision"] != "int8":
        raise BadOptionsError("calibration_table is only used with precision=int8",
                              hint="add precision=int8 or drop calibration_table")
    shapes = [opts[k] for k in ("profile_min_shapes", "profile_opt_shapes", "profile_max_shapes")]
    if any(shapes) and not all(shapes):
        raise BadOptionsError(
            "shape profiles need all three of profile_min_shapes, profile_opt_shapes, profile_max_shapes",
            hint="e.g. profile_min_shapes=x:1x3x224x224 profile_opt_shapes=x:4x3x224x224 profile_max_shapes=x:8x3x224x224",
        )
    for key in ("profile_min_shapes", "profile_opt_shapes", "profile_max_shapes"):
        if opts[key]:
            _parse_shapes(key, opts[key])
    if any(shapes):
        mins, opts_, maxs = (_parse_shapes(k, opts[k]) for k in
                              ("profile_min_shapes", "profile_opt_shapes", "profile_max_shapes"))
        if set(mins) != set(opts_) or set(mins) != set(maxs):
            raise BadOptionsError("shape profiles must name the same inputs in min, opt and max",
                                  hint="list every dynamic input in all three profiles")
        for name in mins:
            lo, mid, hi = mins[name], opts_[name], maxs[name]
            if not (len(lo) == len(mid) == len(hi)) or any(a > b or b > c for a, b, c in zip(lo, mid, hi, strict=False)):
                raise BadOptionsError(f"shape profile for {name!r} must satisfy min <= opt <= max per dimension",
                                      hint="check the order of the three profiles")
    if opts["version_compatible"]:
        # TensorRT has a version-compatible builder flag, but onnxruntime's TensorRT EP exposes no
        # option to set it (checked against the EP's option list): refuse rather than pretend.
        raise BadOptionsError(
            "version_compatible=true cannot be honored: the onnxruntime TensorRT EP has no option for it",
            hint="build per TensorRT version (the farm keys builds by TRT version), or use hardware_compatibility_level",
        )
    if opts["hardware_compatibility_level"] == "ampere_plus" and target is not None:
        cc = float(target.compute_capability or 0)
        # onnxruntime's TensorRT EP silently drops trt_engine_hw_compatible below sm_80 and on
        # sm_87 (Jetson Orin): refuse rather than ship a same-arch engine labelled Ampere+.
        if cc < 8.0 or target.name == "sm_87":
            raise BadOptionsError(
                f"hardware_compatibility_level=ampere_plus can't be built for {target.name}",
                hint="the TensorRT EP builds hardware-compatible engines on sm_80+ GPUs other than sm_87 (Jetson Orin)",
            )


def _parse_shapes(key: str, text: str) -> dict[str, tuple[int, ...]]:
    """'input:1x3x224x224,mask:1x128' -> {'input': (1,3,224,224), 'mask': (1,128)}."""
    out: dict[str, tuple[int, ...]] = {}
    for item in text.split(","):
        name, sep, dims = item.rpartition(":")
        try:
            if not sep or not name:
                raise ValueError
            out[name] = tuple(int(d) for d in dims.split("x"))
        except ValueError:
            raise BadOptionsError(
                f"{key}: {item!r} is not name:DxDxD", hint="e.g. profile_min_shapes=input:1x3x224x224"
            ) from None
    return out


# A protobuf message, hence an ONNX model serialized whole, can't exceed 2 GiB. With
# ``embed_mode=1`` the context is written inside the ctx model: a model whose weights are declared
# above the limit would reach it (measured: a 2.25 GiB model with embed_mode=1 ran 50 s and died
# with std::bad_alloc). Checked on the declared sizes of the model's files, before compiling.
PROTOBUF_LIMIT = 2**31


def check_embed_size(opts: Mapping[str, Any], model_bytes: int, limit: int | None = None) -> None:
    """Refuse ``embed_mode=1`` for a model whose files declare more than the protobuf limit."""
    limit = PROTOBUF_LIMIT if limit is None else limit
    if int(opts.get("embed_mode") or 0) == 1 and model_bytes > limit:
        raise BadOptionsError(
            f"embed_mode=1 would put the context of a {model_bytes / 2**30:.2f} GiB model inside one protobuf "
            f"message, whose limit is {limit / 2**30:.2f} GiB",
            hint="use embed_mode=0 (the default: the context in a .bin beside the ctx model)")
