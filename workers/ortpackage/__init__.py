"""ORT model packages, the worker half (docs/packages.md): write a package with onnxruntime's own
``ModelPackage`` API and check it with ``ModelPackageContext``, in a child process
(``python -m workers.ortpackage.child author REQUEST.json RESULT.json``) of the environment that
has onnxruntime >= 1.32 (the main env and the QNN 2.49.40 / 2.51.0 worker envs pin 1.32.0).

This module (the parent side) imports no onnxruntime: it reads the installed version from the
package metadata, and runs the child under a time and memory cap (``workers.runner.run_child``).
The layout itself is data, made by ``farm.core.packages``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from farm.core.errors import MissingExtraError, PackageVerifyError

CHILD = "workers.ortpackage.child"
MIN_ORT = (1, 32)


def runtime() -> str:
    """The onnxruntime version installed here, if it can write model packages (>= 1.32);
    MissingExtraError otherwise."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    from farm.core.keys import parse_version

    version = ""
    for dist in ("onnxruntime", "onnxruntime-gpu"):
        try:
            version = dist_version(dist)
            break
        except PackageNotFoundError:
            continue
    if not version or parse_version(version)[:2] < MIN_ORT:
        have = f"onnxruntime {version}" if version else "no onnxruntime"
        from farm.core.extras import install_hint

        raise MissingExtraError(
            f"ORT model packages need onnxruntime >= 1.32 (its ModelPackage API); this environment has {have}",
            hint=f"run farm package where onnxruntime 1.32 is: {install_hint('qnn')} (onnxruntime 1.32.0), or in "
                 "a QNN 2.49.40 / 2.51.0 worker environment with the cluster's FARM_DATABASE_URL and FARM_STORE_URL; "
                 "a cluster's service (FARM_BROKER_URL) has such a worker make it: farm package --server URL")
    return version


def author(request: dict[str, Any], work_dir: Path, *, timeout: float, memory_mb: int = 0) -> dict[str, Any]:
    """Write the package of ``request`` (``farm.core.packages.Layout.to_request`` plus ``root``,
    ``blobs``, ``sample``) and check it; returns the child's result with ``evidence``. A check
    that fails is ``package-verify-failed`` naming it."""
    from workers.runner import run_child

    runtime()
    result, _wall, log = run_child(CHILD, "author", request, work_dir, timeout=timeout, memory_mb=memory_mb)
    failed = result.get("failed")
    if failed:
        raise PackageVerifyError(f"the package failed its check ({failed.get('check')}): "
                                 f"{str(failed.get('message'))[:1500]}", details={"log": log[-8000:]})
    return result
