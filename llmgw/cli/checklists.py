"""A long command's steps as a checklist: live at a terminal, one line per step elsewhere.

At a terminal every step is on screen from the start, each ``pending``,
``running`` (with what it is doing and for how long, redrawn every second),
``done`` or ``failed``, updated in place. A question (:meth:`Checklist.ask`)
is asked under the list; once answered, the list is redrawn over it and the
answer shows in the step's line. Elsewhere (a pipe, a log) only finished
steps print, one line each: ``<step>  <what it found>``.

>>> import io
>>> out = io.StringIO()
>>> steps = Checklist(out, ["preflight", "install"], live=False)
>>> steps.begin("preflight", "checking"); steps.done("preflight", "root, Python 3.11.7")
>>> steps.begin("install", "sending wheels"); steps.fail("no space left")
>>> print(out.getvalue(), end="")
preflight  root, Python 3.11.7
install    failed: no space left
"""

from __future__ import annotations

import math
import shutil
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, TextIO

State = Literal["pending", "running", "done", "failed"]
MARKS: dict[State, str] = {"pending": "·", "running": "»", "done": "✓", "failed": "✗"}
TICK = 1.0  # seconds between redraws of a running step's clock
WIDTH = 10  # the step column


@dataclass
class Row:
    step: str
    state: State = "pending"
    detail: str = ""
    started: float = 0.0


class Checklist:
    """The steps of one command; ``live`` draws them in place (an ANSI terminal)."""

    def __init__(self, out: TextIO, steps: Sequence[str], *, live: bool,
                 ask: Callable[[str], str] = input, clock: Callable[[], float] = time.monotonic):
        self.out = out
        self.live = live
        self.rows = {step: Row(step) for step in steps}
        self.current: str | None = None
        self._ask = ask
        self._clock = clock
        self._lock = threading.Lock()
        self._drawn = 0  # lines of ours on screen above the cursor
        self._paused = False
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        if live:
            self._draw()
            self._ticker = threading.Thread(target=self._tick, name="checklist", daemon=True)
            self._ticker.start()

    def begin(self, step: str, doing: str) -> None:
        """``step`` is running, doing ``doing`` (called again as it moves on)."""
        row = self.rows.setdefault(step, Row(step))
        if row.state != "running":
            row.started = self._clock()
        row.state, row.detail, self.current = "running", doing, step
        self._draw()

    def done(self, step: str, detail: str) -> None:
        row = self.rows.setdefault(step, Row(step))
        row.state, row.detail = "done", detail
        if self.current == step:
            self.current = None
        if self.live:
            self._draw()
        else:
            self._line(f"{step:<{WIDTH}} {detail}")

    def fail(self, detail: str) -> None:
        """The running step failed (nothing when none runs); ``detail`` says why, briefly."""
        if self.current is None:
            return
        row = self.rows[self.current]
        row.state, row.detail = "failed", detail.splitlines()[0] if detail else "failed"
        self.current = None
        if self.live:
            self._draw()
        else:
            self._line(f"{row.step:<{WIDTH}} failed: {row.detail}")

    def ask(self, question: str) -> str:
        """Ask under the list; the list is redrawn over the question once answered."""
        with self._lock:
            self._paused = True
        answer = ""
        try:
            answer = self._ask(question)
        except EOFError:
            pass
        finally:
            with self._lock:
                self._paused = False
                if self.live:  # the question and the answer typed after it, as wrapped
                    width = self._columns()
                    self._drawn += sum(max(1, math.ceil(len(line) / width))
                                       for line in (question + answer).split("\n"))
        self._draw()
        return answer

    def close(self) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
        self.out.flush()

    # -- drawing ---------------------------------------------------------------

    def _tick(self) -> None:
        while not self._stop.wait(TICK):
            if self.current is not None:
                self._draw()

    def _text(self, row: Row) -> str:
        detail = row.detail
        if row.state == "running":
            detail = f"{detail} ({self._clock() - row.started:.0f}s)"
        return f"  {MARKS[row.state]} {row.step:<{WIDTH}} {detail}".rstrip()

    def _draw(self) -> None:
        if not self.live:
            return
        with self._lock:
            if self._paused:
                return
            if self._drawn:
                self.out.write(f"\x1b[{self._drawn}F\x1b[J")  # up to our first line, clear below
            width = self._columns()
            for row in self.rows.values():
                text = self._text(row)  # one screen line each, or the redraw would drift
                self.out.write((text if len(text) < width else text[:width - 2] + "…") + "\n")
            self._drawn = len(self.rows)
            self.out.flush()

    @staticmethod
    def _columns() -> int:
        return max(20, shutil.get_terminal_size((100, 24)).columns)

    def _line(self, text: str) -> None:
        self.out.write(text + "\n")
        self.out.flush()
