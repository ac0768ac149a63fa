"""The build pipeline: plan -> queue -> execute (claim -> compile -> publish -> self-probe).

``states`` holds the build state machine (every transition a guarded UPDATE), ``plan`` the
submission for both transports (embedded: executed here; cluster: sent to Celery after the
commit), ``execute`` the one executor, ``queues`` the Celery app and queue names,
``reconcile`` the re-sending of builds whose message or executor was lost.
"""
