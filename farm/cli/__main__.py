import atexit
import os
import sys
import threading

from farm.cli import main

rc = main()
# A CLI run ends here. Finalizing every module after this (SQLAlchemy, onnx, protobuf: 0.25-0.4 s
# measured after `farm build`'s last line) changes nothing the run leaves behind: so the exit
# handlers run, the streams are flushed, and the process ends. Not while another thread still
# works (the interpreter would wait for it): then the usual exit.
if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
    sys.exit(rc)
atexit._run_exitfuncs()
try:
    sys.stdout.flush()
    sys.stderr.flush()
except (BrokenPipeError, ValueError):
    pass
os._exit(rc if isinstance(rc, int) else 1)
