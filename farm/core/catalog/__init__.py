"""Target catalog, loaded from ``targets.toml`` shipped in this package.

A target is ``<backend>:<name>``: ``qnn:SM8650`` (a Snapdragon SoC) or ``trt:sm_90`` (a GPU
compute capability). Names and aliases match case-insensitively.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from farm.core.errors import UnknownTargetError

BACKENDS = ("qnn", "trt")


@dataclass(frozen=True)
class Target:
    backend: str
    name: str
    marketing: str = ""
    aliases: tuple[str, ...] = field(default_factory=tuple)
    soc_model: int | None = None
    htp_arch: str | None = None
    compute_capability: str | None = None
    # A multi-SoC target (qnn:SM8650+SM8750: one context binary for several SoCs, QNN >= 2.48):
    # the SoCs it covers, in catalog order, and their soc_model ids. Empty for one SoC.
    socs: tuple[str, ...] = ()
    soc_models: tuple[int, ...] = ()

    @property
    def multi_soc(self) -> bool:
        return bool(self.socs)

    @property
    def covers(self) -> tuple[str, ...]:
        """The SoCs (or GPUs) an artifact built for this target serves."""
        return self.socs or (self.name,)

    @property
    def ref(self) -> str:
        return f"{self.backend}:{self.name}"

    @property
    def htp_arch_number(self) -> int | None:
        return int(self.htp_arch[1:]) if self.htp_arch else None


@dataclass(frozen=True)
class Catalog:
    targets: tuple[Target, ...]

    def of_backend(self, backend: str) -> list[Target]:
        return [t for t in self.targets if t.backend == backend]

    def get(self, ref: str, *, backend: str | None = None) -> Target:
        """Look a target up by ``backend:name``, or by bare name/alias when ``backend`` is given."""
        raw = ref.strip()
        if ":" in raw:
            backend_part, _, name = raw.partition(":")
            backend_part = backend_part.lower()
        elif backend:
            backend_part, name = backend.lower(), raw
        else:
            raise UnknownTargetError(
                f"target {ref!r} has no backend prefix",
                hint=f"write it as <backend>:<name>, e.g. qnn:SM8650 or trt:sm_90 (backends: {', '.join(BACKENDS)})",
            )
        if backend_part not in BACKENDS:
            raise UnknownTargetError(
                f"unknown backend {backend_part!r} in target {ref!r}",
                hint=f"known backends: {', '.join(BACKENDS)}",
            )
        if "+" in name and backend_part == "qnn":
            return self._multi_soc(name)
        wanted = name.strip().lower().replace("_", "-")
        for t in self.of_backend(backend_part):
            keys = {t.name.lower().replace("_", "-"), *(a.lower().replace("_", "-") for a in t.aliases)}
            if wanted in keys:
                return t
        known = ", ".join(t.name for t in self.of_backend(backend_part))
        raise UnknownTargetError(
            f"unknown {backend_part} target {name!r}",
            hint=f"known {backend_part} targets: {known} (see `farm targets`)",
            details={"known": [t.name for t in self.of_backend(backend_part)]},
        )

    def arch_reference(self, target: Target) -> Target:
        """The SoC that stands for ``target``'s HTP arch where one compile serves every SoC of it
        (a genai package's twin builds): the first SoC of that arch in catalog order, so one
        arch always names the same SoC while the catalog does. ``target`` itself when it has no
        one arch: a multi-SoC target, a GPU, a SoC whose arch the catalog lacks."""
        if target.backend != "qnn" or target.multi_soc or not target.htp_arch:
            return target
        return next((t for t in self.of_backend("qnn") if t.htp_arch == target.htp_arch), target)

    def _multi_soc(self, name: str) -> Target:
        """``SM8650+SM8750``: one target covering several SoCs, named canonically (catalog
        order, each SoC once), so every spelling of the same set is the same build key."""
        parts = [p for p in name.split("+")]
        if any(not p.strip() or "+" in p for p in parts):
            raise UnknownTargetError(f"multi-SoC target {name[:80]!r} has an empty SoC",
                                     hint="write the SoCs joined by '+', e.g. qnn:SM8650+SM8750")
        members = {self.get(p, backend="qnn").name for p in parts}
        ordered = [t for t in self.of_backend("qnn") if t.name in members]
        if len(ordered) < 2:
            return ordered[0]
        joined = "+".join(t.name for t in ordered)
        if len(joined) > 64 or any(t.soc_model is None for t in ordered):
            raise UnknownTargetError(f"multi-SoC target {name[:80]!r} names too many SoCs or one without a "
                                     "soc_model id", hint="at most 64 characters, e.g. qnn:SM8650+SM8750")
        return Target(backend="qnn", name=joined, marketing=" + ".join(t.marketing or t.name for t in ordered),
                      socs=tuple(t.name for t in ordered),
                      soc_models=tuple(int(t.soc_model) for t in ordered if t.soc_model is not None))


def _load(text: str) -> Catalog:
    data = tomllib.loads(text)
    targets: list[Target] = []
    for backend in BACKENDS:
        for row in data.get(backend, []):
            targets.append(
                Target(
                    backend=backend,
                    name=row["name"],
                    marketing=row.get("marketing", ""),
                    aliases=tuple(row.get("aliases", ())),
                    soc_model=row.get("soc_model"),
                    htp_arch=row.get("htp_arch"),
                    compute_capability=row.get("compute_capability"),
                )
            )
    return Catalog(tuple(targets))


@lru_cache(maxsize=1)
def load_catalog() -> Catalog:
    """The catalog shipped with the package (parsed once per process). Read beside this module,
    not through importlib.resources, whose import costs the CLI ~5 ms (the package is never zipped)."""
    text = (Path(__file__).parent / "targets.toml").read_text(encoding="utf-8")
    return _load(text)


def parse_target(ref: str) -> Target:
    return load_catalog().get(ref)
