"""The embedded service's background accuracy checks (farm.pipeline.accuracy.BackgroundChecks):
held back while this process builds, stopped by a build that starts, started over when quiet."""

from __future__ import annotations


def test_background_checks_wait_while_this_process_compiles() -> None:
    """farm.pipeline.accuracy.compiling: a check held back while builds are in flight, released
    when the last ends (or after its hold limit)."""
    import threading
    import time

    from farm.pipeline import accuracy

    q = accuracy._Quiet()
    q.add(2)
    done = threading.Event()
    t = threading.Thread(target=lambda: (q.wait(30), done.set()))
    t.start()
    q.add(-1)
    time.sleep(0.05)
    assert not done.is_set()  # one build still compiles
    q.add(-1)
    assert done.wait(5)
    t.join()
    q.add(1)
    started = time.monotonic()
    q.wait(0.05)  # held no longer than asked
    assert time.monotonic() - started < 5


def test_quiet_waits_for_builds_to_settle() -> None:
    """A background check starts only once no build has been in flight for the settle time: a
    build that starts inside it (a release script's next submission) holds it again."""
    import threading
    import time

    from farm.pipeline import accuracy

    q = accuracy._Quiet()
    q.add(1)
    assert q.is_set()  # a build in flight: the cancel flag of a running check
    got: list[bool] = []
    t = threading.Thread(target=lambda: got.append(q.wait(30, settle=0.4)))
    t.start()
    q.add(-1)
    assert not q.is_set()
    time.sleep(0.1)
    q.add(1)  # the next build, inside the settle time
    time.sleep(0.5)
    assert not got  # held: that build is still in flight
    ended = time.monotonic()
    q.add(-1)
    t.join(10)
    assert got == [True] and time.monotonic() - ended >= 0.4
    q.add(1)
    assert q.wait(0.05, settle=0.0) is False  # held no longer than asked, and says so


def test_background_check_stopped_by_a_build_starts_over(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """BackgroundChecks: a build that starts while a check runs stops it (LeaseLostError from the
    killed child, nothing recorded); the check runs again once builds are quiet, and a check held
    back HOLD_MAX_S in all runs with no cancel flag (to its end)."""
    import threading
    import time

    from farm.core.errors import LeaseLostError
    from farm.pipeline import accuracy

    q = accuracy._Quiet()
    monkeypatch.setattr(accuracy, "_quiet", q)
    monkeypatch.setattr(accuracy, "QUIET_SETTLE_S", 0.05)
    runs: list[object] = []
    started = threading.Event()

    def fake_run_task(settings, reg, artifact_id, *, idle=None, cancel=None):  # type: ignore[no-untyped-def]
        runs.append(cancel)
        assert idle is True
        started.set()
        if len(runs) == 1:  # the first run lasts until a build starts, then is killed
            while not cancel.is_set():
                time.sleep(0.01)
            raise LeaseLostError("accuracy stopped")
        return "ok"

    monkeypatch.setattr(accuracy, "run_task", fake_run_task)
    bg = accuracy.BackgroundChecks()
    bg.put((None, None, 7))  # type: ignore[arg-type]
    assert started.wait(10)
    q.add(1)  # a build starts: the running check is stopped
    time.sleep(0.2)
    assert len(runs) == 1 and not bg.idle()  # and waits while the build runs
    q.add(-1)
    deadline = time.monotonic() + 10
    while not bg.idle() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert bg.idle() and len(runs) == 2 and bg.preempted == 1
    assert runs[1] is q  # preemptible again

    # Never quiet: after the hold limit it runs unpreemptible.
    monkeypatch.setattr(accuracy, "HOLD_MAX_S", 0.1)
    q.add(1)
    runs.clear()
    runs.append("first run done")  # the fake's next run returns at once
    bg.put((None, None, 8))  # type: ignore[arg-type]
    deadline = time.monotonic() + 10
    while not bg.idle() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert runs[-1] is None and bg.preempted == 1
    q.add(-1)
