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

    try:
        rc = exit_status(main())
    except SystemExit as exc:  # argparse's --help and usage errors, a command's own sys.exit
        rc = exit_status(exc.code)
    if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        sys.exit(rc)
    atexit._run_exitfuncs()
    os._exit(flushed(rc))


def exit_status(code: object) -> int:
    """What ``sys.exit(code)`` would end with: None 0, an int itself, anything else printed to
    stderr and 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def flushed(rc: int) -> int:
    """Flush stdout and stderr; the status to end with. The interpreter's own exit would report
    output it could not write (a full disk): so do we, 120 as CPython does, unless ``rc`` already
    says failure. A reader that went away (`farm ls | head`) is 141, as main's broken pipe."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BrokenPipeError:
            try:  # the rest of the buffer goes nowhere instead of failing again
                os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())
            except (OSError, ValueError):
                pass
            rc = rc or 141
        except OSError as exc:
            if stream is sys.stdout:
                try:
                    print(f"farm: could not write the output: {exc.strerror or exc}", file=sys.stderr, flush=True)
                except (OSError, ValueError):
                    pass
            rc = rc or 120
        except (AttributeError, ValueError):  # replaced by None or closed: nothing to flush
            pass
    return rc
