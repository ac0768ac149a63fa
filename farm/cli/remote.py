"""Which side answers a command: this machine's index, or the service (``--server``/``FARM_SERVER``).

Read commands (ls, show, workers, coverage, status, tag --history) take ``--server`` and default
to ``FARM_SERVER``: in a pipeline shell that points at a farm they ask the farm, never an empty
index of their own. A command that needs the index itself (db, registry, keys sign, token) refuses
with ``local-only`` where this shell has a service but no index, instead of creating an empty
SQLite index and answering from it.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from farm.core.settings import Settings


def add_server_arguments(p: argparse.ArgumentParser) -> None:
    """``--server`` and ``--token``, defaulting to FARM_SERVER and FARM_TOKEN."""
    p.add_argument("--server", default=os.environ.get("FARM_SERVER") or None,
                   help="ask this ctxfarm service, e.g. http://farm:8080 (default: FARM_SERVER)")
    p.add_argument("--token", default=os.environ.get("FARM_TOKEN") or None,
                   help="bearer token (default: FARM_TOKEN)")


def client(args: argparse.Namespace) -> Any:
    from farm.client import Client

    return Client(args.server, args.token)


def require_local_index(command: str, settings: Settings, env: Mapping[str, str] | None = None) -> None:
    """Refuse (``local-only``) when FARM_SERVER is set and this machine has no index: no
    FARM_DATABASE_URL and no embedded index file yet. Answering from a SQLite index created on
    the spot would look like an empty farm."""
    from farm.core.errors import LocalOnlyError

    env = os.environ if env is None else env
    server = env.get("FARM_SERVER")
    if not server or env.get("FARM_DATABASE_URL"):
        return
    url = settings.database_url
    if url.startswith("sqlite:///") and not os.path.exists(url.removeprefix("sqlite:///")):
        raise LocalOnlyError(f"farm {command} has no remote form: it needs the index itself, and this shell "
                             f"has only a service (FARM_SERVER) and no index")


@contextmanager
def answer_of(command: str) -> Iterator[None]:
    """Around reading a service's answer: one that is not the document `farm COMMAND --json`
    prints (a missing key, a wrong type) is ``server-error``, not a bug (``internal-error``)."""
    from farm.core.errors import ServerError

    try:
        yield
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        raise ServerError(f"the service's answer for farm {command} is not the document farm {command} --json "
                          f"prints ({type(exc).__name__})") from None
