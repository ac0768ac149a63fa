"""The build pipeline: plan -> queue -> execute (claim -> compile -> publish -> self-probe); ``states``
holds the build state machine (guarded transitions), ``queues`` the Celery app, ``reconcile`` the re-sends.
May import workers.backends and workers.runner (the runners), registry/ and farm.core; never a front door."""
