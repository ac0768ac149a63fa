"""The agent keeps a job's lease while it runs, and notices when it lost it."""

from __future__ import annotations

import threading

from farm.core.errors import LeaseLostError, ServerError
from workers.agent.jobs import Renewer


def test_renews_until_stopped_and_survives_a_failed_call() -> None:
    calls: list[int] = []
    third = threading.Event()

    def renew() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise ServerError("the service is restarting")
        if len(calls) == 3:
            third.set()

    with Renewer(renew, 0.01) as r:
        assert third.wait(10)
    assert r.lost is None and not r.thread.is_alive() and len(calls) >= 3  # stopped with the job


def test_a_lost_lease_stops_renewing_and_is_kept() -> None:
    calls: list[int] = []

    def renew() -> None:
        calls.append(1)
        raise LeaseLostError("job 1 is not leased to sim-a with this nonce any more")

    r = Renewer(renew, 0.01)
    with r:
        r.thread.join(10)
    assert isinstance(r.lost, LeaseLostError) and calls == [1]
