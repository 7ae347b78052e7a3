"""Engine installs on a node enrolled by ``llmgw node add``, the daemon logging in as its account.

The account ``node add`` makes has no shell and no rights but its own: the
SFTP copy of ``llmgw engine install`` goes into ``<prefix>/engines/.incoming``
as that account, so ``node add`` makes the engines directory the account's,
and a second ``node add`` keeps what is installed there.
"""

from __future__ import annotations

import pwd
import subprocess
import sys
from pathlib import Path

import pytest
from support import engines as engines_support
from support.plugin import WHEELS, SimClusterFactory

from llmgw.onboarding import simenrolments

VERSION = "1.0.0"


def llmgw(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "llmgw", *args], capture_output=True,
                          text=True, timeout=900, stdin=subprocess.DEVNULL)


@pytest.mark.timeout(1800)
def test_engine_install_as_the_account_lands_in_its_directory_and_survives_node_add(
    enrolled_cluster: SimClusterFactory, tmp_path: Path,
) -> None:
    sim = enrolled_cluster(1)
    node = sim.nodes["node-01"]
    assert sim.account is not None
    prefix = simenrolments.prefix_of(node)
    engines = prefix / "engines"
    installed = engines / f"llama.cpp-{VERSION}"
    binary = engines_support.shippable(tmp_path / "bin") / "llama-server"
    where = ["--cluster", str(sim.cluster_dir)]

    # node add made the engines directory the account's, and told the agent to use it.
    account = pwd.getpwnam(sim.account)
    assert engines.stat().st_uid == account.pw_uid
    assert (engines / ".incoming").stat().st_uid == account.pw_uid
    listed = llmgw("engine", "list", *where)
    assert f"node-01  engines in {engines}" in listed.stdout, listed.stdout + listed.stderr

    done = llmgw("engine", "install", f"llama.cpp=={VERSION}", "--binary", str(binary), *where)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"node-01  installed llama.cpp {VERSION} in {installed}" in done.stdout, done.stdout
    assert list((engines / ".incoming").iterdir()) == [], "the shipped copy is consumed"
    assert (installed / "bin" / "llama-server").read_bytes() == binary.read_bytes()

    # node add again (as an upgrade would run it): the install and its owner stay.
    again = subprocess.run(simenrolments.node_add_argv(sim.cluster_dir, node, WHEELS),
                           capture_output=True, text=True, timeout=900,
                           stdin=subprocess.DEVNULL)
    assert again.returncode == 0, again.stdout + again.stderr
    assert engines.stat().st_uid == account.pw_uid
    listed = llmgw("engine", "list", *where)
    assert f"  llama.cpp {VERSION}  {installed}" in listed.stdout, listed.stdout
    same = llmgw("engine", "install", f"llama.cpp=={VERSION}", "--binary", str(binary), *where)
    assert f"llama.cpp {VERSION} already installed in {installed}" in same.stdout, same.stdout
