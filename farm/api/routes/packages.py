"""ORT model packages (issue 30): ``POST /v1/packages`` (submit) makes, or finds in the index, the
package of NAME:TAG's published builds; ``GET /v1/packages/{digest}`` and ``GET
/v1/packages?ref=NAME:TAG`` (read) answer one made earlier. The package's record and every file
are then fetched by digest from ``/v1/blobs`` (``farm package --server -d DIR`` and ``farm
install --package`` do, verifying each)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query
from pydantic import BaseModel, Field

from farm.api.deps import RegistryDep, SettingsDep, read, submit

router = APIRouter()


class PackageIn(BaseModel):
    ref: str = Field(max_length=400, description="the published model: NAME:TAG (NAME means NAME:latest)")


@router.post("/v1/packages", tags=["submit"], dependencies=[submit])
def create_package(body: PackageIn, reg: RegistryDep, settings: SettingsDep) -> dict[str, Any]:
    """The package of ``ref``'s published builds (schema: farm/cli/schemas/package.json):
    answered from the index (``cached: true``) unless a build was published since the last one,
    else made, verified with onnxruntime's own API and published. Errors: 404 ``not-found`` (no
    such NAME:TAG), 404 ``no-published-builds``, 409 ``package-files-missing``, 500
    ``package-verify-failed``, 501 ``missing-extra`` (no onnxruntime >= 1.32 on the service)."""
    from farm.pipeline.execute import signer_for
    from farm.pipeline.packages import make_package

    return make_package(settings, reg, body.ref, signer=signer_for(settings))


@router.get("/v1/packages", tags=["read"], dependencies=[read])
def newest_package(ref: Annotated[str, Query(max_length=400)], reg: RegistryDep) -> dict[str, Any]:
    """The newest package made of ``ref``'s current model (``farm install --package``): made
    earlier by ``POST /v1/packages``, never here (404 ``not-found`` names the command)."""
    from farm.pipeline.packages import current_package

    return current_package(reg, ref)


@router.get("/v1/packages/{digest}", tags=["read"], dependencies=[read])
def get_package(digest: Annotated[str, Path(pattern=r"^sha256:[0-9a-f]{64}$")], reg: RegistryDep) -> dict[str, Any]:
    """A package made earlier, by its digest (404 ``not-found`` otherwise)."""
    from farm.pipeline.packages import package_answer

    return package_answer(reg, digest, cached=True)
