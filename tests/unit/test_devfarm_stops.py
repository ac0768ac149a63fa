"""The dev launcher's stop: Ctrl-C or SIGTERM raise at once, except while a restarted worker is
being recorded (a stop that landed between its start and the record left it running)."""

from __future__ import annotations

import os
import signal

import pytest

from infra.devfarm.launcher import Stops


def test_a_stop_waits_for_the_held_step_then_raises() -> None:
    stops = Stops()
    old = signal.signal(signal.SIGTERM, stops.on_signal)
    done = []
    try:
        with pytest.raises(KeyboardInterrupt):
            with stops.held():
                os.kill(os.getpid(), signal.SIGTERM)
                done.append("recorded")  # reached: the stop did not cut the step short
        assert done == ["recorded"]
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
            signal.sigtimedwait([], 0.1)  # give the handler a chance to run outside held()
    finally:
        signal.signal(signal.SIGTERM, old)


def test_nothing_pending_leaves_quietly() -> None:
    stops = Stops()
    with stops.held():
        pass
    assert not stops.pending
