"""Progress a person can read, on stderr.

On a terminal: a live table (``rich``, imported only then) with one row per target or build, its
state, elapsed time and a note, redrawn a few times a second. Anywhere else (a pipe, a CI log,
``--json``): one plain line per state change, no escape sequences, nothing on a timer.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any, Self

FINAL_STATES = ("built", "cached", "failed", "succeeded")
ANSWERED = "answered from the index"  # the note of a failure no build of this run produced


def interactive(stream: IO[str]) -> bool:
    """A person is watching ``stream``: a terminal that can redraw (not TERM=dumb)."""
    try:
        return stream.isatty() and os.environ.get("TERM", "") != "dumb"
    except (AttributeError, ValueError):
        return False


@dataclass
class Row:
    key: str
    cells: dict[str, str] = field(default_factory=dict)
    state: str = ""  # nothing shown yet: the first update is a change
    note: str = ""
    since: float = field(default_factory=time.monotonic)
    ended: float | None = None

    def elapsed(self) -> float:
        return (self.ended or time.monotonic()) - self.since


class Live:
    """Rows by key, shown live on a terminal or as plain lines on state changes."""

    columns: tuple[str, ...] = ()

    def __init__(self, stream: IO[str] | None = None, *, live: bool | None = None):
        self.stream = stream or sys.stderr
        self.live = interactive(self.stream) if live is None else live
        self.rows: dict[str, Row] = {}
        self.lock = threading.RLock()  # rich renders from its own thread, and once from start()
        self._display: Any = None

    def __enter__(self) -> Self:
        return self

    def _start(self) -> bool:
        """The live table, from the first row that is not already final (an answer from the index
        prints its line and never imports rich)."""
        if self._display is None:
            try:
                from rich.console import Console
                from rich.live import Live as RichLive
            except ModuleNotFoundError:  # an environment without rich: plain lines
                self.live = False
                return False
            console = Console(file=self.stream, force_terminal=True)
            self._display = RichLive(self, console=console, refresh_per_second=4, transient=False,
                                     redirect_stdout=False, redirect_stderr=False)
            self._display.start()
        return True

    def __exit__(self, *exc: object) -> None:
        if self._display is not None:
            self._display.refresh()
            self._display.stop()
            self._display = None

    def update(self, key: str, state: str, note: str = "", *, cells: dict[str, str] | None = None,
               elapsed: float | None = None, restart: bool = False) -> None:
        """Set a row's state; a plain line only when state or note changed."""
        with self.lock:
            row = self.rows.get(key)
            if row is None:
                row = self.rows[key] = Row(key)
            changed = (row.state, row.note) != (state, note)
            if restart and row.state != state and state not in FINAL_STATES:
                row.since = time.monotonic()  # a final state shows how long the one before it took
            row.state, row.note = state, note
            row.cells.update(cells or {})
            if state in FINAL_STATES and row.ended is None:
                row.ended = time.monotonic()
                if elapsed is not None:
                    row.since = row.ended - elapsed
            if self.live and (self._display is not None or state not in FINAL_STATES) and self._start():
                return
            if changed:
                self.stream.write(self.line(row) + "\n")
                self.stream.flush()

    def line(self, row: Row) -> str:
        took = f" in {row.elapsed():.1f} s" if row.ended is not None and self.timed(row) else ""
        return f"  {row.key}: {row.state}{took}" + (f" ({row.note})" if row.note else "")

    def timed(self, row: Row) -> bool:
        """Whether the row shows its time (a release's answers from the index do not: nothing ran)."""
        return True

    def __rich__(self) -> Any:
        from rich.table import Table

        styles = {"built": "green", "cached": "green", "succeeded": "green", "failed": "bold red",
                  "running": "yellow", "compiling": "yellow"}
        table = Table(box=None, pad_edge=False, header_style="bold")
        for c in self.columns:
            table.add_column(c.upper(), no_wrap=c != "note")
        with self.lock:
            rows = list(self.rows.values())
        for r in rows:
            values = {**r.cells, "state": f"[{styles.get(r.state, '')}]{r.state}" if r.state in styles else r.state,
                      "elapsed": f"{r.elapsed():.1f} s" if self.timed(r) else "", "note": r.note}
            table.add_row(*[values.get(c, "") for c in self.columns])
        return table


class BuildProgress(Live):
    """``farm build``: the executor's events for each target (farm.pipeline.plan.Progress); with
    several models, a row per model and target (``for_model``)."""

    columns: tuple[str, ...] = ("target", "state", "elapsed", "note")

    def __call__(self, event: str, target: str, info: dict[str, Any], model: str | None = None) -> None:
        key = target if model is None else f"{model} {target}"
        cells = {"target": target} if model is None else {"model": model, "target": target}
        if event == "compiling":
            attempt = int(info.get("attempt") or 1)
            self.update(key, "compiling", f"with {info['toolchain']}" + (f", attempt {attempt}" if attempt > 1 else ""),
                        cells=cells, restart=True)
        elif event == "waiting":
            self.update(key, "waiting", f"build {info['build_id']} is held by another process", cells=cells)
        elif event == "retrying":
            self.update(key, "retrying", f"in {info['in_seconds']:.0f} s after an infrastructure failure",
                        cells=cells)
        elif event == "finished":
            note = info.get("error_code") or ""
            row = self.rows.get(key)
            elapsed = None if row is not None else info.get("wall_seconds")
            self.update(key, str(info["state"]), note, cells=cells, elapsed=elapsed)

    def for_model(self, model: str) -> Callable[[str, str, dict[str, Any]], None]:
        """The progress callback for one of several models: rows keyed and shown by model and target."""
        self.columns = ("model", *BuildProgress.columns)
        return lambda event, target, info: self(event, target, info, model=model)


class ReleaseProgress(Live):
    """``farm submit --wait``: each build of the release as the fan-in sees it change."""

    columns = ("build", "target", "toolchain", "state", "attempts", "elapsed", "note")

    def __init__(self, stream: IO[str] | None = None, *, live: bool | None = None):
        super().__init__(stream, live=live)
        self.answered: set[str] = set()  # builds final when the release was submitted

    def submitted(self, st: Any) -> None:
        """The release as the submit answered it, before any wait: each row's clock starts now,
        and a build already final was answered from the index (``cached``, as `farm build` says;
        a failure says so in its note) rather than built for this release."""
        for b in _builds(st):
            if str(getattr(b["state"], "value", b["state"])) in FINAL_STATES:
                self.answered.add(_key(b))
        self(st)

    def __call__(self, st: Any) -> None:
        for b in _builds(st):
            key = _key(b)
            state = str(getattr(b["state"], "value", b["state"]))
            note = " ".join(x for x in (b.get("error_code") or "", b.get("note") or "") if x)
            if key in self.answered and state == "succeeded":
                state = "cached"
            elif key in self.answered and state == "failed":
                note = ANSWERED if not note else f"{note}, {ANSWERED}"
            self.update(key, state, note,
                        cells={"build": str(b["build"]), "target": b["target"], "toolchain": b["toolchain"],
                               "attempts": str(b["attempts"])}, restart=True)

    def line(self, row: Row) -> str:
        attempt = row.cells.get("attempts", "")
        shown = f" (attempt {attempt})" if row.state == "running" and attempt not in ("", "0", "1") else ""
        took = f" after {row.elapsed():.1f} s" if row.ended is not None and self.timed(row) else ""
        return f"  {row.key}: {row.state}{shown}{took}" + (f" ({row.note})" if row.note else "")

    def timed(self, row: Row) -> bool:
        return row.state != "cached" and not row.note.endswith(ANSWERED)


def _builds(st: Any) -> list[dict[str, Any]]:
    return list(st.builds if hasattr(st, "builds") else st["builds"])


def part_of(b: dict[str, Any]) -> str | None:
    """``package`` or ``part<i>``: what a build is in a genai package's release (from the index
    or a service: checked); None for any other build."""
    import re

    part = b.get("part")
    return part if isinstance(part, str) and re.fullmatch(r"package|part\d{1,3}", part) else None


def _key(b: dict[str, Any]) -> str:
    """``build 7 qnn:SM8650 2.51.0``; in a genai package's release ``build 7 part0 qnn:...``."""
    part = part_of(b)
    return f"build {b['build']}{f' {part}' if part else ''} {b['target']} {b['toolchain']}"
