"""Run a long build with its output in a log, and show how far along it is.

    python tools/buildprogress.py LOG WHAT -- COMMAND...

The command's output goes to LOG only; this prints one status line for WHAT
as the build moves: the compile percentage (CMake's Makefiles print
``[ 41%]``, ninja prints ``[123/456]``), the time elapsed and the log's
path. On a terminal the line is redrawn in place; in a CI log a new line is
printed when the percentage has moved by 5 or a minute has passed. The
exit status is the command's; a failure prints the log's last 40 lines.

Used by ``make engine`` (a cold llama-server build takes minutes).
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

MAKE = re.compile(rb"\[\s*(\d{1,3})%\]")
NINJA = re.compile(rb"\[(\d+)/(\d+)\]")
POLL = 1.0
QUIET_STEP, QUIET_EVERY = 5, 60.0


def percent(chunk: bytes) -> int | None:
    """The last build percentage in ``chunk`` of log output, if it has one.

    >>> percent(b"  [ 41%] Building CXX object common/x.cpp.o\\n")
    41
    >>> percent(b"[12/48] Building CXX object x.o\\n")
    25
    """
    best: tuple[int, int] | None = None
    for match in MAKE.finditer(chunk):
        best = (match.end(), int(match.group(1)))
    for match in NINJA.finditer(chunk):
        done, total = int(match.group(1)), int(match.group(2))
        if total and (best is None or match.end() > best[0]):
            best = (match.end(), 100 * done // total)
    return None if best is None else min(best[1], 100)


def clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[2] != "--":
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    log, what, command = Path(argv[0]), argv[1], argv[3:]
    tty = sys.stdout.isatty()
    started = time.monotonic()
    print(f"{what}: started (log: {log})", flush=True)
    with log.open("wb") as output:
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL)
    shown, shown_at, latest, offset = -QUIET_STEP, started, None, 0
    while True:
        done = process.poll() is not None
        with log.open("rb") as handle:
            handle.seek(offset)
            chunk = handle.read()
        offset += len(chunk)
        found = percent(chunk)
        latest = found if found is not None else latest
        now = time.monotonic()
        where = "compiling" if latest is None else f"{latest}% compiled"
        line = f"{what}: {where}, {clock(now - started)} elapsed (log: {log})"
        if tty:
            print("\r" + line, end="", flush=True)
        elif latest is not None and latest >= shown + QUIET_STEP or now - shown_at >= QUIET_EVERY:
            print(line, flush=True)
            shown, shown_at = latest if latest is not None else shown, now
        if done:
            break
        time.sleep(POLL)
    if tty:
        print()
    elapsed = clock(time.monotonic() - started)
    if process.returncode != 0:
        tail = log.read_text(errors="replace").splitlines()[-40:]
        print("\n".join(tail), file=sys.stderr)
        print(f"{what}: failed after {elapsed} (exit {process.returncode}); "
              f"the whole output is in {log}", file=sys.stderr)
        return process.returncode
    print(f"{what}: done in {elapsed} (log: {log})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
