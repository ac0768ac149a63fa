"""The CLI as a process: run ``main`` and end without finalizing every module.

A CLI run ends when ``main`` returns. Finalizing every loaded module after that (SQLAlchemy, onnx,
protobuf: 0.25-0.4 s measured after `farm build`'s last line on the development box) changes
nothing the run leaves behind; so the exit handlers run, the streams are flushed and the process
ends with ``os._exit``. Not while another thread still works (the interpreter would wait for it):
then the usual exit. ``python -m farm.cli`` ends this way; the ``farm`` console script too when
its entry point is ``farm.cli.console:console``.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import NoReturn


def console() -> NoReturn:
    from farm.cli import main

    rc = main()
    if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        sys.exit(rc)
    atexit._run_exitfuncs()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (BrokenPipeError, ValueError):
        pass
    os._exit(rc if isinstance(rc, int) else 1)
