"""Compiles of 30 minutes and more (docs/large-models.md): everything that bounds a build follows
FARM_COMPILE_TIMEOUT, so raising it is all a two-hour compile needs. The lease renewal itself
is exercised with a real slow child in test_cancel.py."""

from __future__ import annotations

from farm.core.settings import Settings
from farm.pipeline.execute import RENEW_MAX_S, LeaseKeeper
from farm.pipeline.queues import make_app
from farm.pipeline.states import Lease


def test_a_two_hour_compile_outlives_no_limit() -> None:
    s = Settings.from_env({"FARM_HOME": "/tmp/unused-home", "FARM_BROKER_URL": "redis://127.0.0.1:6379/0",
                           "FARM_COMPILE_TIMEOUT": "7200"})
    conf = make_app(s).conf
    # Redis redelivers an unacked task after visibility_timeout: above the compile, twice over.
    assert conf.broker_transport_options["visibility_timeout"] >= 2 * 7200
    # Celery's own limits are backstops behind the compile child's timeout, never before it.
    assert conf.task_soft_time_limit > 7200 and conf.task_time_limit > conf.task_soft_time_limit
    assert conf.task_acks_late and conf.task_reject_on_worker_lost and conf.worker_prefetch_multiplier == 1


def test_the_lease_is_renewed_often_whatever_its_length() -> None:
    # A long lease (a dead worker's build waits that long) still renews every few seconds, which
    # is also how soon a running build sees a cancel.
    lease = Lease(1, "owner#1", 1)
    assert LeaseKeeper(None, lease, 3600.0).interval == RENEW_MAX_S <= 5.0  # type: ignore[arg-type]
    assert LeaseKeeper(None, lease, 0.6).interval == 0.2  # type: ignore[arg-type]
