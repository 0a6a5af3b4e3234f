"""The live progress line of a learner run (PPO and SAC), made to fit the terminal.

On a terminal the line is redrawn in place (``rich.live``) and always fits the width the
terminal has at that moment: its fields come in order of importance (env, steps of
total, steps/s, mean return, ETA, then the learner's own figures: lag, time split,
servers, elapsed time) and the least important ones are left out, whole, when they do
not fit; a bar fills what room is left. Without a terminal it prints every field as a
plain line every ``print_every`` seconds, for logs.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any

__all__ = ["ProgressLine", "fit_fields", "format_duration"]

_KEY_FIELDS = 5
"""env, steps, steps/s, return, ETA: joined more tightly before any of them is left out."""


def format_duration(seconds: float) -> str:
    """``1:02:03`` (hours, minutes, seconds) or ``2:03`` under an hour."""
    total = max(0, round(seconds))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def fit_fields(fields: Sequence[str], width: int, *, key: int = _KEY_FIELDS) -> str:
    """``fields`` joined by two spaces, the last ones left out until the line fits in
    ``width`` columns; the first ``key`` are joined by one space before one of them is
    left out. A field is shown whole or not at all; the first one (the env) is cut
    with ``…`` only when it alone is wider than ``width``."""
    for count in range(len(fields), 0, -1):
        for sep in ("  ", " ") if count <= key else ("  ",):
            line = sep.join(fields[:count])
            if len(line) <= width:
                return line
    first = fields[0] if fields else ""
    return first if len(first) <= width else first[: max(0, width - 1)] + "…"


class _Line:
    """The renderable ``rich.live`` redraws: the fields fitted to the console's width at
    each redraw, then a bar in the room left."""

    def __init__(self) -> None:
        self.fields: list[str] = []
        self.fraction: float | None = None

    def text(self, width: int) -> str:
        """The line as shown in ``width`` columns."""
        line = fit_fields(self.fields, width)
        room = width - len(line) - 2
        if self.fraction is not None and room >= 10:
            cells = min(room, 40)
            done = round(cells * min(max(self.fraction, 0.0), 1.0))
            line += "  " + "━" * done + "─" * (cells - done)
        return line

    def __rich_console__(self, console: Any, options: Any) -> Iterator[Any]:
        from rich.text import Text

        yield Text(self.text(options.max_width), no_wrap=True, overflow="crop")


class ProgressLine:
    """A live line on a terminal, fitted to its width; plain lines every ``print_every``
    seconds without one; nothing without ``progress``. ``env_id`` is the line's first
    field; ``total`` the env steps the run stops at (None or 0: until stopped: no ETA, no
    bar), ``done`` those already done (a resumed run); ``console`` a ``rich`` console to
    draw on (default: stdout's, where it is a terminal).
    """

    def __init__(
        self,
        *,
        progress: bool,
        print_every: float,
        env_id: str,
        total: int | None,
        done: int,
        console: Any = None,
    ) -> None:
        self.env_id = env_id
        self.total = total or None
        self.print_every = print_every
        self.plain = progress and console is None and not sys.stdout.isatty()
        self.last_print = time.perf_counter()
        self._start = time.perf_counter()
        self._line = _Line()
        self._live: Any = None
        if progress and not self.plain:
            from rich.live import Live

            self._line.fields = [self.env_id, self._steps(done), "starting"]
            self._live = Live(self._line, console=console, refresh_per_second=4)
            self._live.start()

    def _steps(self, steps: int) -> str:
        return f"{steps:,}/{self.total:,} steps" if self.total else f"{steps:,} steps"

    def due(self) -> bool:
        """Whether :meth:`show` would show anything now."""
        return self._live is not None or (
            self.plain and time.perf_counter() - self.last_print >= self.print_every
        )

    def show(
        self, steps: int, steps_per_s: float, mean_return: float, extra: Sequence[str] = ()
    ) -> None:
        """Updates the line (call when :meth:`due`): the run's env steps, its recent
        steps/s (the ETA's rate) and mean return, then ``extra`` fields, most important
        first (the first left out where the terminal is narrow)."""
        fields = [
            self.env_id,
            self._steps(steps),
            f"{steps_per_s:,.0f} steps/s",
            f"return {mean_return:.1f}",
        ]
        if self.total and steps_per_s > 0:
            fields.append(f"ETA {format_duration((self.total - steps) / steps_per_s)}")
        fields += [*extra, f"elapsed {format_duration(time.perf_counter() - self._start)}"]
        if self._live is not None:
            self._line.fields = fields
            self._line.fraction = steps / self.total if self.total else None
            self._live.refresh()
        else:
            self.last_print = time.perf_counter()
            print("  ".join(fields), flush=True)

    def text(self, width: int) -> str:
        """The live line as it shows in ``width`` columns."""
        return self._line.text(width)

    def stop(self) -> None:
        """Stops redrawing; the last line stays on the terminal."""
        if self._live is not None:
            self._live.stop()
            self._live = None
