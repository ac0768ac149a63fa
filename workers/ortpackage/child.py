"""Child process that writes and checks an ORT model package with onnxruntime's own API.

    python -m workers.ortpackage.child author REQUEST.json RESULT.json

The request is ``farm.core.packages.Layout.to_request()`` plus ``root`` (the package folder to
create), ``blobs`` (a folder of the needed files, each named by its sha256 hex) and ``sample``
(an ``.npz`` of sample inputs for a single model, or null: seeded inputs then, as the accuracy
check makes them). Writes ``{"ok": true, "evidence": {...}}``, with ``failed`` naming the check
that failed, if one did.

The package is written by ``onnxruntime.ModelPackage`` (no hand-written manifest): a first
commit to the empty ``root`` creates it (ORT resolves variant directories against the package
root, which a new package has only after that), then the variant folders and shared assets are
put in place, the variants set, and committed in place. Then it is checked as a device would
meet it: ``ModelPackageContext(root)`` parses it; every variant's files exist and hash right;
with CPU-only session options ORT selects each component's CPU variant, which runs.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from typing import Any

from workers.childproc import run_commands


def _place(blobs: str, digest: str, dest: str) -> None:
    """The blob of ``digest`` at ``dest``: a hard link where the file system allows (no copy of
    multi-GB weights), else a copy."""
    src = os.path.join(blobs, digest.removeprefix("sha256:"))
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    try:
        os.link(src, dest)
    except OSError:
        shutil.copyfile(src, dest)


def _inside(root: str, rel: str) -> str:
    """``root/rel``, refused when it would leave ``root`` (the parent checked every name; a
    second look costs nothing)."""
    path = os.path.realpath(os.path.join(root, rel))
    base = os.path.realpath(root)
    if path != base and not path.startswith(base + os.sep):
        raise ValueError(f"{rel!r} leaves the package root")
    return path


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


def author(req: dict[str, Any]) -> dict[str, Any]:
    import onnxruntime as ort

    root, blobs = req["root"], req["blobs"]
    work = os.path.dirname(os.path.abspath(root))
    t0 = time.perf_counter()
    pkg = ort.ModelPackage()
    pkg.set_metadata(req["package_name"], req["package_version"], "made by ctxfarm from the registry's published builds")
    for comp in req["components"]:
        pkg.set_component_inline(comp["name"], json.dumps({"variants": {}}))
    pkg.commit(root)  # creates root/manifest.json: from now on the package has a root
    for i, a in enumerate(req["assets"]):
        src = os.path.join(work, "asset-sources", str(i))
        for f in a["files"]:
            _place(blobs, f["digest"], _inside(src, f["path"]))
        # ORT checks the address the layout computed from the digests (a reproducible build):
        # a file whose bytes are not its digest's fails here.
        try:
            uri = pkg.add_shared_asset(src, a["uri"], True)
        except Exception as exc:  # noqa: BLE001 - the message is ORT's
            return {"evidence": {"onnxruntime": ort.__version__},
                    "failed": {"check": "shared-asset", "message": f"{a['directory']}: {exc}"}}
        if uri != a["uri"]:
            return {"evidence": {"onnxruntime": ort.__version__},
                    "failed": {"check": "shared-asset", "message": f"ORT addressed {a['directory']} as {uri}"}}
    for comp in req["components"]:
        for v in comp["variants"]:
            vdir = _inside(root, v["directory"])
            os.makedirs(vdir, exist_ok=True)
            for f in v["files"]:
                _place(blobs, f["digest"], _inside(vdir, f["path"]))
            pkg.set_variant(comp["name"], v["name"], json.dumps(v["body"]))
            pkg.set_variant_executor_info_inline(comp["name"], v["name"], "ort", json.dumps(v["ort"]))
    pkg.set_additional_metadata_json("manifest", None, None, json.dumps(req.get("metadata") or {}))
    pkg.commit()
    pkg.close()
    shutil.rmtree(os.path.join(work, "asset-sources"), ignore_errors=True)
    authored = time.perf_counter() - t0
    evidence: dict[str, Any] = {"onnxruntime": ort.__version__, "author_seconds": round(authored, 6)}
    try:
        check(req, evidence)
    except CheckFailed as exc:
        return {"evidence": evidence, "failed": {"check": exc.check, "message": exc.message}}
    return {"evidence": evidence}


class CheckFailed(Exception):
    def __init__(self, check: str, message: str):
        super().__init__(message)
        self.check, self.message = check, message


def check(req: dict[str, Any], evidence: dict[str, Any]) -> None:
    """The checks a package passes before publication; what could not be checked here is said
    per variant (``unchecked``)."""
    import numpy as np
    import onnxruntime as ort

    from workers.qnn.accuracy import seeded_inputs

    root = req["root"]
    # 1. ORT's own parser: the manifest, every component and variant, the EP each names.
    try:
        ctx = ort.ModelPackageContext(root)
        strict = ort.ModelPackage.open(root)
    except Exception as exc:  # noqa: BLE001 - the message is ORT's
        raise CheckFailed("manifest", f"ModelPackageContext could not open the package: {exc}") from None
    want = {c["name"]: {v["name"]: v for v in c["variants"]} for c in req["components"]}
    if sorted(ctx.get_component_names()) != sorted(want):
        raise CheckFailed("manifest", f"components {ctx.get_component_names()} != {sorted(want)}")
    for name, variants in want.items():
        if sorted(ctx.get_variant_names(name)) != sorted(variants):
            raise CheckFailed("manifest", f"component {name!r}: variants {ctx.get_variant_names(name)} != "
                                          f"{sorted(variants)}")
        for vname, v in variants.items():
            if ctx.get_variant_ep_name(name, vname) != v["body"]["ep"]:
                raise CheckFailed("manifest", f"{name}/{vname}: EP {ctx.get_variant_ep_name(name, vname)!r}")
    evidence["checked"] = ["manifest parsed by onnxruntime.ModelPackageContext"]
    # 2. Every file of every variant (its folder's and its shared asset's): present, right sha256;
    # and nothing else in the package but ORT's manifest.
    expected: dict[str, str] = {}
    for a in req["assets"]:
        for f in a["files"]:
            expected[f"{a['directory']}/{f['path']}"] = f["digest"]
    for c in req["components"]:
        for v in c["variants"]:
            for f in v["files"]:
                expected[f"{v['directory']}/{f['path']}"] = f["digest"]
    found: dict[str, str] = {}
    for dirpath, _dirs, files in os.walk(root):
        for fn in files:
            path = os.path.join(dirpath, fn)
            rel = os.path.relpath(path, root).replace(os.sep, "/")
            if rel != "manifest.json":
                found[rel] = _sha256(path)
    if found != expected:
        missing = sorted(set(expected) - set(found))
        extra = sorted(set(found) - set(expected))
        wrong = sorted(p for p in set(found) & set(expected) if found[p] != expected[p])
        raise CheckFailed("files", f"missing {missing[:5]}, unexpected {extra[:5]}, wrong sha256 {wrong[:5]}")
    variants_ev = []
    for c in req["components"]:
        for v in c["variants"]:
            vdir = os.path.join(root, v["directory"])
            try:
                model = strict.resolve_string_ref(v["ort"]["model_file"], vdir, True)
            except Exception as exc:  # noqa: BLE001
                raise CheckFailed("files", f"{c['name']}/{v['name']}: model_file {v['ort']['model_file']!r} does "
                                           f"not resolve: {exc}") from None
            for key, value in (v["ort"].get("session_options") or {}).items():
                if str(value).startswith("sha256:"):
                    try:
                        strict.resolve_string_ref(value, vdir, True)
                    except Exception as exc:  # noqa: BLE001
                        raise CheckFailed("files", f"{c['name']}/{v['name']}: {key} {value!r}: {exc}") from None
            entry = {"component": c["name"], "variant": v["name"], "ep": v["body"]["ep"],
                     "files": "present, sha256 checked", "model_file": os.path.relpath(model, root)}
            if v["backend"] != "cpu":
                from farm.core.packages import UNCHECKED

                entry["unchecked"] = UNCHECKED.get(v["backend"], "selection not exercised here")
            variants_ev.append(entry)
    strict.close()
    evidence["checked"].append("every variant's files present with the right sha256 (and no other file)")
    # 3. CPU-only session options: ORT must select each component's CPU variant, which must run.
    components_ev = []
    for c in req["components"]:
        so = ort.SessionOptions()
        so.log_severity_level = 3
        try:
            chosen = ctx.select_component(c["name"], ort.ModelPackageOptions(so))
        except Exception as exc:  # noqa: BLE001
            raise CheckFailed("cpu-selection", f"{c['name']}: no variant selected with CPU-only options: {exc}") from None
        name = chosen.get_selected_variant_name()
        cpu = next(v["name"] for v in c["variants"] if v["body"]["ep"] == "CPUExecutionProvider")
        if name != cpu:
            raise CheckFailed("cpu-selection", f"{c['name']}: CPU-only options selected {name!r}, not {cpu!r}")
        try:
            sess = chosen.create_session()
            specs = [(i.name, i.type, list(i.shape)) for i in sess.get_inputs()]
            if req.get("sample") and len(req["components"]) == 1:
                with np.load(req["sample"], allow_pickle=False) as z:
                    feeds = {n: z[n] for n, _, _ in specs}
                inputs = str(req.get("sample_digest") or "sample")
            else:
                feeds = seeded_inputs(specs, 0, {})
                inputs = "seeded:0"
            t = time.perf_counter()
            outs = sess.run(None, feeds)
            run_seconds = time.perf_counter() - t
        except Exception as exc:  # noqa: BLE001
            raise CheckFailed("cpu-run", f"{c['name']}: the CPU variant did not run: {exc}") from None
        components_ev.append({"component": c["name"], "selected": name, "providers": sess.get_providers(),
                              "inputs": inputs, "outputs": [{"name": o.name, "shape": list(np.shape(r)),
                                                             "finite": bool(np.isfinite(r).all())
                                                             if np.issubdtype(np.asarray(r).dtype, np.floating)
                                                             else True}
                                                            for o, r in zip(sess.get_outputs(), outs, strict=True)],
                              "run_seconds": round(run_seconds, 6)})
    evidence["checked"].append("CPU-only session options select each component's CPU variant, which runs")
    evidence["components"] = components_ev
    evidence["variants"] = variants_ev


def main(argv: list[str]) -> int:
    if not (len(argv) == 4 and argv[1] == "author"):
        print("usage: python -m workers.ortpackage.child author REQUEST.json RESULT.json", file=sys.stderr)
        return 2
    return run_commands(argv, {"author": author})


if __name__ == "__main__":
    sys.exit(main(sys.argv))
