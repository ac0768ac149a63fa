"""onnxruntime-genai packages (docs/shipping-llm.md): an exported static decoder pipeline becomes one folder
a device opens with ``og.Model(dir)``, built part by part.

The shape of an export (which file is which part's prefill or decode, the CPU stages, the
tokenizer, the generated ``genai_config.json``) is ``farm.core.genai``'s; this module is what the
farm does with it:

- **the package as a model snapshot**: ``genai.json`` first (what the package is: each part's
  graph group by digest, each CPU stage by role, the tokenizer files), then the CPU stages and
  tokenizer files under fixed names. Each part's prefill and decode are a graph group of their
  own (``farm.core.groups``), recorded as a model like any group. The package digest covers the
  parts' group digests and every other file's digest.
- **fan out**: each part is one weight-shared group build (the group build path, unchanged);
  the parts build in parallel in one pool (embedded) and each is admitted like any build.
- **fan in**: the package's own build row (key: package digest x target x toolchain x options)
  is claimed once every part is final, then assembled (no compile): the parts' context models
  and their shared ``.bin`` under ``part<i>/``, the CPU stages and tokenizer as they are, the
  generated ``genai_config.json``; the folder checks run on the laid-out folder; then one
  publication (manifest with each stage's role under ``genai``). A part that failed fails the
  package with the part's code, the message naming the part.
- **the twin**: the same parts compiled without sharing, each part's twin a build of its own
  (``twin_builds``: keyed, cached, leased, admitted after the package's own compiles, never
  served), and generated from on the simulator against the CPU EP on those contexts
  (``workers.backends.genai_twin``), budgeted like the accuracy check. It is
  evidence that follows publication: the package is published with ``description["twin"]``
  ``pending`` and the twin's figures replace it when it is done (``verify_twin``: the embedded
  command runs it after it answered, a worker right after it published); the shared artifact
  stays unverified by load with the reason.

Every blob stays content-addressed: a part's context model and binary are the very blobs of the
part's group artifact, a tokenizer or CPU stage shared by packages for several SoCs or SDKs is
one blob.
"""


from __future__ import annotations

from farm.pipeline.genai.assembly import (
    UNVERIFIED,
    Layout,
    assemble,
    check_folder,
    rename_contexts,
)
from farm.pipeline.genai.bundle import (
    CONFIG_NAME,
    DECODE,
    MEDIA,
    PACKAGE_FILE,
    PACKAGE_KIND,
    PREFILL,
    SOURCE_CONFIG,
    PackageBundle,
    PackageReport,
    descriptor,
    inspect_package,
    package_from_snapshot,
    part_dir,
    read_package,
)
from farm.pipeline.genai.links import link_parts, packages_of, ready_packages
from farm.pipeline.genai.release import after_part, build_package, execute_package, submit_package
from farm.pipeline.genai.twin import run_twin, twin_refusal, verify_twin
from farm.pipeline.genai.twin_builds import execute_twin, package_twins, settle_twins, twin_spec
from farm.pipeline.genai.twin_record import record_twin, twin_of, twin_pending, twin_status

__all__ = [
    "CONFIG_NAME", "DECODE", "MEDIA", "PACKAGE_FILE", "PACKAGE_KIND", "PREFILL", "SOURCE_CONFIG", "UNVERIFIED",
    "Layout", "PackageBundle", "PackageReport", "after_part", "assemble", "build_package", "check_folder",
    "descriptor", "execute_package", "execute_twin", "inspect_package", "link_parts", "package_from_snapshot",
    "package_twins", "packages_of", "part_dir", "read_package", "ready_packages", "record_twin", "rename_contexts",
    "run_twin", "settle_twins", "submit_package", "twin_of", "twin_pending", "twin_refusal", "twin_spec",
    "twin_status", "verify_twin",
]
