"""farm cancel through the HTTP service: a release's queued builds and a running one
stop with code ``cancelled``; a build already final is left as it is; a read token may not
cancel; a worker that takes the message of a cancelled build drops it (its claim finds it final).
The real service in this process (tests.common.inproc), the real index."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from typing import Any

import pytest

from farm.cli import cancel_cmd
from farm.client import Client
from farm.core.errors import ForbiddenError, NotFoundError
from farm.core.settings import Settings
from farm.pipeline import states
from registry.index import Registry
from registry.models import Release, ReleaseBuild
from tests.common.index_rows import add_model, spec
from tests.common.inproc import running_service
from tests.common.service import token


@pytest.fixture
def service(settings: Settings) -> Iterator[dict[str, Any]]:
    with running_service(settings) as svc:
        yield svc


def release_of_three(settings: Settings, owner: str = "ci") -> tuple[int, list[int]]:
    """A release with a queued build, a running one and a finished (failed) one, submitted by the
    token named ``owner`` (the service's submit token: only it or an admin may cancel it)."""
    from sqlalchemy import select

    from registry.models import ApiToken

    reg = Registry.open(settings)
    try:
        with reg.db.session() as s:
            owner_id = s.scalar(select(ApiToken.id).where(ApiToken.name == owner))
        with reg.db.session() as s:
            model = add_model(s, "m-cancel", name="m").digest
        ids = []
        with reg.db.session() as s:
            for target in ("SM8650", "SM8750", "SM8550"):
                ids.append(states.enqueue(s, spec(model, target=target), "compile.qnn.2.51.0")[0])
            release = Release(model_digest=model, label="m", matrix={}, owner_token_id=owner_id)
            s.add(release)
            s.flush()
            for b in ids:
                s.add(ReleaseBuild(release_id=release.id, build_id=b))
            release_id = release.id
        with reg.db.session() as s:
            states.claim(s, ids[1], owner="worker-a", lease_seconds=600, max_attempts=3)
            lease = states.claim(s, ids[2], owner="worker-b", lease_seconds=600, max_attempts=3).lease
            assert lease is not None
            states.fail(s, lease, "invalid-model", "bad", None)
        return release_id, ids
    finally:
        reg.close()


def test_cancel_a_release_over_http(service: dict[str, Any], settings: Settings) -> None:
    release_id, (queued, running, failed) = release_of_three(settings)
    reader = Client(service["url"], token(settings, "device", "read"))
    with pytest.raises(ForbiddenError):
        reader.json("POST", f"/v1/releases/{release_id}/cancel")
    with pytest.raises(NotFoundError):  # another pipeline's submit token: not its release (a submit token owns only its own)
        Client(service["url"], token(settings, "other", "submit")).json("POST", f"/v1/releases/{release_id}/cancel")
    client = Client(service["url"], service["token"])
    answer = client.json("POST", f"/v1/releases/{release_id}/cancel")
    assert answer["builds"] == [{"build": queued, "was": "queued", "now": "cancelled"},
                                {"build": running, "was": "running", "now": "cancelled"},
                                {"build": failed, "was": "failed", "now": "failed"}]
    for b in (queued, running):
        info = client.json("GET", f"/v1/builds/{b}")
        assert (info["state"], info["error_code"]) == ("failed", "cancelled")
    assert client.json("GET", f"/v1/builds/{failed}")["error_code"] == "invalid-model"
    reg = Registry.open(settings)
    try:
        with reg.db.session() as s:  # the queued build's message, taken by a worker later: dropped
            assert states.claim(s, queued, owner="late", lease_seconds=60, max_attempts=3).action == "done"
    finally:
        reg.close()
    with pytest.raises(NotFoundError):
        client.json("POST", "/v1/releases/99999/cancel")


def test_farm_cancel_build_through_the_service(service: dict[str, Any], settings: Settings,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    _, (queued, _running, _failed) = release_of_three(settings)
    args = argparse.Namespace(release=None, build=queued, json=True, server=service["url"], token=service["token"])
    assert cancel_cmd.run("cancel", args, settings) == 0
    assert json.loads(capsys.readouterr().out)["builds"] == [{"build": queued, "was": "queued", "now": "cancelled"}]
