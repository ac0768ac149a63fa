"""``python -m farm.client``: the ``ctxfarm-install`` command."""

from __future__ import annotations

import sys

from farm.client.cli import main

if __name__ == "__main__":
    sys.exit(main())
