"""The agent keeps a job's lease while it runs and notices when it lost it; it posts a report again while the
service does not answer, never after a refusal."""

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


def test_a_report_is_posted_again_while_the_service_does_not_answer_and_never_after_a_refusal(monkeypatch) -> None:
    import io

    from farm.core.errors import ReportReplayedError
    from workers.agent import jobs

    monkeypatch.setattr(jobs.time, "sleep", lambda _s: None)  # the backoff's waits: nothing to wait for here
    calls: list[int] = []

    def flaky() -> None:
        calls.append(1)
        if len(calls) < 3:
            raise ServerError("connection refused")

    assert jobs._post_report(flaky, io.StringIO()) and len(calls) == 3
    refused: list[int] = []

    def refuse() -> None:
        refused.append(1)
        raise ReportReplayedError("this nonce was already reported on")

    log = io.StringIO()
    assert not jobs._post_report(refuse, log) and refused == [1] and "report-replayed" in log.getvalue()
