"""Streams as a load, and what they cost: the streaming table of tests/bench/router.py.

:func:`wrk_chunks` drives wrk with :data:`CHUNKS_LUA`, which counts the SSE content
chunks of every answer and keeps only whole ones; :func:`cpu_seconds` reads a
process's CPU time from /proc, so each row can say what a chunk cost the process
that relayed it; :func:`profile_summary` turns py-spy's collapsed stacks into the
top functions.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Load:
    """What wrk sends and expects back: ``body`` (a JSON request asking for a stream),
    answered with ``chunks`` content chunks each; ``connections`` at once."""

    body: str
    chunks: int
    connections: int

# Counts the content chunks ("data: {") of every answer; an answer counts only when it is
# whole: status 200, all its chunks and its [DONE]. A stream still running when wrk stops
# is not counted at all (see docs/benchmarks.md for what that costs the figure).
CHUNKS_LUA = """\
local threads = {}
function setup(thread) table.insert(threads, thread) end
function init(args) chunks, whole, broken = 0, 0, 0 end
function response(status, headers, body)
  local n, at = 0, 1
  while true do
    local found = string.find(body, "data: {", at, true)
    if not found then break end
    n, at = n + 1, found + 7
  end
  if status == 200 and n == %(expected)d and string.find(body, "data: [DONE]", 1, true) then
    chunks, whole = chunks + n, whole + 1
  else
    broken = broken + 1
  end
end
function done(summary, latency, requests)
  local c, w, b = 0, 0, 0
  for _, t in ipairs(threads) do
    c, w, b = c + t:get("chunks"), w + t:get("whole"), b + t:get("broken")
  end
  io.write(string.format("chunks %%d whole %%d broken %%d seconds %%f\\n",
                         c, w, b, summary.duration / 1e6))
end
"""


def wrk_chunks(url: str, key: str, load: Load, duration: float,
               tmp: Path) -> tuple[int, float]:
    """SSE content chunks that reached the clients in whole answers, and wrk's seconds."""
    script = tmp / "chunks.lua"
    script.write_text(
        'wrk.method = "POST"\n'
        f"wrk.body = '{load.body}'\n"
        'wrk.headers["Content-Type"] = "application/json"\n'
        f'wrk.headers["Authorization"] = "Bearer {key}"\n'
        + CHUNKS_LUA % {"expected": load.chunks}
    )
    out = subprocess.run(
        ["wrk", "-t1", f"-c{load.connections}", f"-d{duration:g}s", "-s", str(script),
         url + "/v1/chat/completions"],
        capture_output=True, text=True, timeout=duration + 30, check=True,
    ).stdout
    found = re.search(r"^chunks (\d+) whole (\d+) broken (\d+) seconds ([\d.]+)$", out, re.M)
    if found is None or "Socket errors" in out or int(found.group(3)) or not int(found.group(2)):
        raise RuntimeError(f"errors while measuring streams through {url}:\n{out}")
    return int(found.group(1)), float(found.group(4))


def cpu_seconds(pid: int) -> tuple[float, float]:
    """CPU time (user, system) of ``pid`` and of its children, from /proc."""
    if not pid:
        return 0.0, 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return 0.0, 0.0
    tick = os.sysconf("SC_CLK_TCK")
    user, system = int(fields[11]) / tick, int(fields[12]) / tick
    for child in children:
        more = cpu_seconds(int(child))
        user, system = user + more[0], system + more[1]
    return user, system


@dataclass
class Streamed:
    rate: float  # chunks/s
    user_us: float  # CPU µs per chunk of the path's own process, user (0: the direct row)
    system_us: float  # and in the kernel on its behalf (its syscalls)
    upstream_us: float  # CPU µs per chunk of the upstream, user + system


def measure_streams(url: str, key: str, pid: int, upstream: int, load: Load,
                    duration: float, tmp: Path) -> Streamed:
    """One wrk run of long streams through ``url``, with the CPU that the process ``pid``
    (0: none) and the ``upstream`` process spent on it."""
    path, up = cpu_seconds(pid), cpu_seconds(upstream)
    chunks, seconds = wrk_chunks(url, key, load, duration, tmp)
    path_after, up_after = cpu_seconds(pid), cpu_seconds(upstream)
    return Streamed(chunks / seconds, 1e6 * (path_after[0] - path[0]) / chunks,
                    1e6 * (path_after[1] - path[1]) / chunks,
                    1e6 * (sum(up_after) - sum(up)) / chunks)


def profile_summary(collapsed: str, top: int) -> str:
    """The functions with most samples, from py-spy's collapsed stacks (``a;b;c 12``):
    self (the function was running) and total (it was on the stack), in % of all samples."""
    own: dict[str, int] = {}
    total: dict[str, int] = {}
    samples = 0
    for line in collapsed.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        samples += n
        # "name (path:line)" -> "name (path)": one entry per function, not per line
        frames = [re.sub(r":\d+\)$", ")", frame) for frame in stack.split(";")]
        own[frames[-1]] = own.get(frames[-1], 0) + n
        for frame in set(frames):
            total[frame] = total.get(frame, 0) + n
    lines = [f"py-spy, llmgw under the bench load: {samples} samples", "",
             "| self | total | function |", "|---:|---:|---|"]
    for frame, n in sorted(own.items(), key=lambda item: -item[1])[:top]:
        lines.append(f"| {100 * n / samples:.1f} % | {100 * total[frame] / samples:.1f} % | "
                     f"`{_short(frame)}` |")
    return "\n".join(lines)


def _short(frame: str) -> str:
    """A frame without the directories of its file: ``write (aiohttp/http_writer.py)``."""
    return re.sub(r"\((?:.*/)?((?:[^/]+/)?[^/]+\.py)\)", r"(\1)", frame)
