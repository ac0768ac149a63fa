"""``python -m infra.devfarm``: a local farm (what infra/farm-up.sh runs)."""

from __future__ import annotations

import sys

from infra.devfarm.launcher import main

sys.exit(main())
