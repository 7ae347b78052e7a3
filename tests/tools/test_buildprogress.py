"""tools/buildprogress.py: a long build shows its percentage, time and log path."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[2] / "tools" / "buildprogress.py"

# What CMake's Makefiles and ninja print while compiling (llama.cpp's build log format).
MAKE_LINES = "".join(f"  [{p:3d}%] Building CXX object src/CMakeFiles/llama.dir/f{p}.cpp.o\n"
                     for p in range(0, 101, 10))
NINJA_LINES = "".join(f"[{n}/40] Building CXX object f{n}.o\n" for n in range(1, 41))


def run(tmp_path: Path, script: str) -> subprocess.CompletedProcess[str]:
    log = tmp_path / "build.log"
    return subprocess.run(
        [sys.executable, str(TOOL), str(log), "llama-server", "--",
         sys.executable, "-c", script],
        capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("lines", [MAKE_LINES, NINJA_LINES], ids=["make", "ninja"])
def test_progress_lines_name_the_percentage_and_the_log(tmp_path: Path, lines: str) -> None:
    # The build prints half, pauses until the tool has shown a percentage, prints the rest.
    half, go = len(lines) // 2, tmp_path / "go"
    script = (f"import os, sys, time; sys.stdout.write({lines[:half]!r}); sys.stdout.flush()\n"
              f"deadline = time.monotonic() + 60\n"
              f"while not os.path.exists({str(go)!r}) and time.monotonic() < deadline:\n"
              f"    time.sleep(0.01)\n"
              f"sys.stdout.write({lines[half:]!r})")
    log = tmp_path / "build.log"
    with subprocess.Popen([sys.executable, str(TOOL), str(log), "llama-server", "--",
                           sys.executable, "-c", script], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True) as tool:
        assert tool.stdout is not None
        seen = []
        for line in tool.stdout:
            seen.append(line)
            if "% compiled" in line:
                go.touch()
                break
        rest, errors = tool.communicate(timeout=120)
    assert tool.returncode == 0, errors
    out = "".join([*seen, rest]).splitlines()
    assert out[0] == f"llama-server: started (log: {log})"
    progress = [line for line in out if "% compiled" in line]
    assert progress and all(line.endswith(f"elapsed (log: {log})") for line in progress)
    assert any(" 100% compiled" in line for line in progress) or "done in" in out[-1]
    assert out[-1].startswith("llama-server: done in ") and out[-1].endswith(f"(log: {log})")
    assert log.read_text() == lines  # the compiler's output goes to the log, not the screen


def test_a_failed_build_shows_the_log_tail_and_its_status(tmp_path: Path) -> None:
    script = "import sys; print('  [ 41%] Building x.o'); print('error: boom'); sys.exit(3)"
    result = run(tmp_path, script)
    assert result.returncode == 3
    assert "error: boom" in result.stderr
    assert "llama-server: failed after " in result.stderr and "(exit 3)" in result.stderr


def test_percentages_from_both_formats() -> None:
    sys.path.insert(0, str(TOOL.parent))
    import buildprogress

    assert buildprogress.percent(b"  [ 41%] Building CXX object x.o\n") == 41
    assert buildprogress.percent(b"[12/48] Building CXX object x.o\n") == 25
    assert buildprogress.percent(b"-- Configuring done\n") is None
    assert buildprogress.percent(b"[  5%] a\n[ 17%] b\n") == 17  # the latest wins
