"""llama.cpp command lines run through the real ``llama-server``, and its table checked.

The flag tables are read from the engines' source (``make engine-flags``).
Here the binary ``make engine`` built from that same source has the last
word: its ``--help`` lists exactly the options of its table, and the argv
llmgw renders for every llama.cpp profile of the example clusters parses
(``--version`` at the end makes llama-server exit 0 once every argument
before it has been accepted; an unknown option or a bad value fails first).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from llmgw.engines import launches, tables
from llmgw.engines.launches import Launch
from llmgw.spec import loading
from llmgw.spec.models import Profile

ROOT = Path(__file__).parents[2]
ENGINE = ROOT / ".cache" / "engine" / "bin" / "llama-server"
ENGINE_VERSION = re.search(r"^ENGINE_VERSION \?= (\S+)$", (ROOT / "Makefile").read_text(),
                           re.M).group(1)  # type: ignore[union-attr]

pytestmark = pytest.mark.skipif(
    not ENGINE.exists(), reason="the real engine is not built: run `make engine` (make test does)"
)


def help_options() -> set[str]:
    out = subprocess.run([str(ENGINE), "--help"], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    names: set[str] = set()
    for line in out.splitlines():
        if not line.startswith("-") or line.startswith("-----"):
            continue
        # Options sit in a 40-column first field; the help text follows.
        head = line[:40] if len(line) > 40 and line[39] == " " else line
        names.update(re.findall(r"(?:^|[\s,])(-{1,2}[A-Za-z0-9][\w.-]*)", head))
    return names


def test_the_table_lists_exactly_the_options_of_the_built_binary() -> None:
    table = tables.load("llama.cpp", ENGINE_VERSION)
    assert help_options() == set(table.options)


def profiles() -> list[object]:
    out = []
    for directory in (ROOT / "cluster.example", ROOT / "cluster.example" / "local"):
        cluster = loading.load(directory)
        for name, model in cluster.models.items():
            for index, profile in enumerate(model.profiles):
                if profile.engine == "llama.cpp":
                    out.append(pytest.param(profile, id=f"{directory.name}:{name}:{index}"))
    return out


def argv_of(profile: Profile) -> list[str]:
    launch = Launch(model="m", served_name="m", source=profile.source or "/models/m.gguf",
                    profile=profile, rank=0, bind_host="127.0.0.1", port=18000)
    argv = list(launches.command(launch).argv)
    assert argv[:2] == ["/usr/bin/env", "llama-server"]
    return argv[2:]


def parses(arguments: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(ENGINE), *arguments, "--version"], capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize("profile", profiles())
def test_every_llama_cpp_profile_parses_in_the_real_engine(profile: Profile) -> None:
    result = parses(argv_of(profile))
    assert result.returncode == 0, result.stderr
    assert "version:" in result.stdout + result.stderr


def test_the_check_is_not_blind() -> None:
    assert parses(["--no-such-option"]).returncode != 0
    # What llmgw used to render for `fa: "on"`: llama-server has no --fa.
    assert parses(["--fa", "on"]).returncode != 0
    assert parses(["-fa", "on"]).returncode == 0
