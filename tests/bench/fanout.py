"""Inventory of N simulated nodes: llmgw versus ``ansible -m setup``, same sshd nodes, one run.

Each node is a real OpenSSH ``sshd`` on 127.0.0.1 with its own host key and
port, and an ``llmgw agent serve`` with fixture hardware behind it
(``tests/support/nodes.py``). Both tools log in with the same client key, pin
the same ``known_hosts`` (StrictHostKeyChecking) and contact every node at once
(llmgw ``max_parallel`` = ansible ``forks`` = N). Rows, repeated ``--repeat``
times, interleaved:

* llmgw, cold   — a new :class:`~llmgw.transport.pools.Pool`: SSH handshakes,
  forwarded agent socket, gRPC channel, then one report per node;
* llmgw, warm   — the same Pool again: the pooled sessions are reused;
* llmgw CLI     — ``llmgw inventory --json`` as a new process (interpreter
  start and imports included), the like of a new ansible process;
* ansible, cold — ``ansible -m setup`` as a new process with an empty
  ControlPath directory: one new SSH master per node;
* ansible, warm — the same command again right after: ansible's default
  ``ControlMaster=auto ControlPersist=60s`` reuses those masters (the
  "logins" column, counted from the sshd logs, shows whether it did).

They do not collect the same thing, and the table says so: llmgw's agent
returns a NodeReport (GPUs from nvidia-smi, RDMA adapters and fabrics, disks,
weights, units); ansible's setup module gathers its default facts on the
machine itself (all nodes are this machine). Ansible runs with pipelining
(no file copied; the sim's sshd has no sftp subsystem) and the system
python3 as the remote interpreter, so no interpreter discovery.

ansible-core is not an llmgw dependency: it is installed on first run into
``.cache/bench-venv`` and reused; without a network the ansible rows are
skipped with the reason and llmgw's are still printed. Times are printed,
never asserted. Loopback only; every process started is stopped.

    .venv/bin/python tests/bench/fanout.py [--nodes 20] [--repeat 5]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from support import nodes  # noqa: E402

from llmgw.fleet.types import Fleet  # noqa: E402
from llmgw.spec import loading  # noqa: E402
from llmgw.spec.models import Cluster  # noqa: E402
from llmgw.transport import pools  # noqa: E402

BENCH_VENV = ROOT / ".cache" / "bench-venv"
ANSIBLE_REQUIREMENT = "ansible-core"
INSTALL_TIMEOUT = 300.0
RUN_TIMEOUT = 120.0
# The fixture hardware the nodes get in turn, as in tests/support/plugin.py.
HARDWARE = ("h100-ib", "l40s-nofabric", "cpu-only")
# The sshd nodes are this machine: the system interpreter, not a pyenv shim
# (a shell script that would add its own start-up to every module run).
REMOTE_PYTHON = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else "python3"

ANSIBLE_CFG = """\
[defaults]
forks = {forks}
host_key_checking = True
interpreter_python = {python}
local_tmp = {home}/local-tmp
remote_tmp = {home}/remote-tmp
retry_files_enabled = False
nocolor = True

[ssh_connection]
# ansible's default ssh_args, spelt out: the warm row relies on ControlPersist.
ssh_args = -C -o ControlMaster=auto -o ControlPersist=60s
pipelining = True
"""

_ONELINE = re.compile(r"^(\S+) \| (SUCCESS|CHANGED|FAILED!|UNREACHABLE!)(?: => |: )(.*)$")


@dataclass
class Row:
    """One way of taking the inventory: wall times, new SSH logins, what came back."""

    key: str
    label: str
    times: list[float] = field(default_factory=list)
    logins: list[int] = field(default_factory=list)
    collected: str = ""
    failures: list[str] = field(default_factory=list)


# -- ansible-core, in its own venv --------------------------------------------


def ensure_ansible() -> tuple[Path | None, str]:
    """``(ansible binary, its version)``, installing ansible-core once; ``(None, why)`` if not."""
    ansible = BENCH_VENV / "bin" / "ansible"
    if not ansible.exists():
        print(f"installing {ANSIBLE_REQUIREMENT} into {BENCH_VENV.relative_to(ROOT)} "
              "(first run only)", flush=True)
        try:
            if not (BENCH_VENV / "bin" / "python").exists():
                subprocess.run([sys.executable, "-m", "venv", str(BENCH_VENV)], check=True,
                               capture_output=True, text=True, timeout=INSTALL_TIMEOUT)
            subprocess.run([str(BENCH_VENV / "bin" / "pip"), "install", "-q",
                            ANSIBLE_REQUIREMENT], check=True, capture_output=True, text=True,
                           timeout=INSTALL_TIMEOUT)
        except subprocess.CalledProcessError as exc:
            lines = (exc.stderr or exc.stdout or "").strip().splitlines()
            return None, f"pip install {ANSIBLE_REQUIREMENT} failed: " + (
                lines[-1] if lines else f"exit {exc.returncode}")
        except subprocess.TimeoutExpired:
            return None, f"pip install {ANSIBLE_REQUIREMENT} took over {INSTALL_TIMEOUT:g}s"
        if not ansible.exists():
            return None, f"{ANSIBLE_REQUIREMENT} installed but {ansible} is missing"
    out = subprocess.run([str(ansible), "--version"], capture_output=True, text=True,
                         timeout=RUN_TIMEOUT)
    first = (out.stdout.splitlines() or ["?"])[0]
    return ansible, first.replace("[", "").replace("]", "").strip()


@dataclass
class AnsibleSetup:
    """Inventory, config and environment for ansible against the simulated nodes."""

    ansible: Path
    home: Path
    env: dict[str, str]

    @classmethod
    def write(cls, ansible: Path, sim: nodes.SimCluster, user: str) -> AnsibleSetup:
        home = sim.root / "ansible"
        home.mkdir()
        ssh_args = (f"-F /dev/null -o StrictHostKeyChecking=yes "
                    f"-o UserKnownHostsFile={sim.known_hosts} -o IdentitiesOnly=yes "
                    f"-o BatchMode=yes")
        lines = ["[sim]"]
        lines += [f"{name} ansible_host=127.0.0.1 ansible_port={node.port}"
                  for name, node in sim.nodes.items()]
        lines += ["", "[sim:vars]", f"ansible_user={user}",
                  f"ansible_ssh_private_key_file={sim.client_key}",
                  f"ansible_python_interpreter={REMOTE_PYTHON}",
                  f"ansible_ssh_common_args='{ssh_args}'",
                  # No sftp Subsystem on the simulated sshd; pipelining copies no
                  # file anyway, and should anything be copied, it goes over exec.
                  "ansible_ssh_transfer_method=piped"]
        (home / "inventory.ini").write_text("\n".join(lines) + "\n")
        config = home / "ansible.cfg"
        config.write_text(ANSIBLE_CFG.format(forks=len(sim.nodes), python=REMOTE_PYTHON,
                                             home=home))
        env = {**os.environ, "ANSIBLE_CONFIG": str(config), "ANSIBLE_HOME": str(home),
               "ANSIBLE_NOCOLOR": "1"}
        env.pop("SSH_AUTH_SOCK", None)  # only the cluster's key, as llmgw
        return cls(ansible, home, env)

    def setup(self, control_dir: Path, forks: int) -> tuple[float, str]:
        """One ``ansible sim -m setup -o``: ``(wall seconds, stdout)``; raises on a hang."""
        control_dir.mkdir(exist_ok=True)
        env = {**self.env, "ANSIBLE_SSH_CONTROL_PATH_DIR": str(control_dir)}
        argv = [str(self.ansible), "sim", "-i", str(self.home / "inventory.ini"),
                "-m", "setup", "-f", str(forks), "-o"]
        return timed_process(argv, env)

    def close_masters(self, control_dir: Path) -> None:
        """End the ControlPersist masters in ``control_dir`` (they outlive ansible by design)."""
        for socket_path in control_dir.glob("*"):
            subprocess.run(["ssh", "-F", "/dev/null", "-o", f"ControlPath={socket_path}",
                            "-O", "exit", "sim"], capture_output=True, timeout=10)


def parse_setup(stdout: str) -> tuple[dict[str, dict[str, object]], list[str]]:
    """Facts by host, and ``"host: why"`` for each host that failed, from ``-o`` output."""
    facts: dict[str, dict[str, object]] = {}
    failed: list[str] = []
    for line in stdout.splitlines():
        match = _ONELINE.match(line)
        if match is None:
            continue
        host, status, rest = match.groups()
        if status in ("SUCCESS", "CHANGED"):
            facts[host] = json.loads(rest).get("ansible_facts", {})
        else:
            failed.append(f"{host}: {status} {rest[:300]}")
    return facts, failed


# -- llmgw ---------------------------------------------------------------------


def timed_process(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, str]:
    """Run ``argv`` to the end: ``(wall seconds, stdout)``; its whole group dies on a hang."""
    start = time.perf_counter()
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=env, start_new_session=True, cwd=ROOT)
    try:
        stdout, stderr = process.communicate(timeout=RUN_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise RuntimeError(f"{argv[0]} ran over {RUN_TIMEOUT:g}s") from None
    elapsed = time.perf_counter() - start
    if process.returncode not in (0, 2, 4):  # ansible: 2 failed hosts, 4 unreachable
        raise RuntimeError(f"{' '.join(argv[:3])} exited {process.returncode}: {stderr[-500:]}")
    return elapsed, stdout


async def pool_round(sim: nodes.SimCluster, cluster: Cluster, cluster_dir: Path,
                     cold: Row, warm: Row) -> Fleet:
    """A new Pool (the cold row), then the same Pool again (the warm row); the warm fleet."""
    before = logins(sim)
    start = time.perf_counter()
    pool = pools.Pool(cluster, cluster_dir)
    try:
        await pool.fleet()
        cold.times.append(time.perf_counter() - start)
        cold.logins.append(logins(sim) - before)
        before = logins(sim)
        start = time.perf_counter()
        fleet = await pool.fleet()
        warm.times.append(time.perf_counter() - start)
        warm.logins.append(logins(sim) - before)
    finally:
        await pool.aclose()
    return fleet


def describe_fleet(fleet: Fleet) -> tuple[str, list[str]]:
    reports = list(fleet.nodes.values())
    down = [f"{r.node}: {r.error}" for r in reports if not r.reachable]
    up = [r for r in reports if r.reachable]
    size = sum(len(r.model_dump_json()) for r in up) / max(len(up), 1)
    text = (f"{len(up)}/{len(reports)} NodeReports: {sum(len(r.gpus) for r in up)} GPUs, "
            f"{sum(len(r.adapters) for r in up)} RDMA adapters, "
            f"{sum(len(r.fabrics) for r in up)} node fabrics, "
            f"{sum(len(r.disks) for r in up)} disks, {sum(len(r.units) for r in up)} units; "
            f"{size / 1024:.1f} KiB JSON/node")
    return text, down


def describe_facts(facts: dict[str, dict[str, object]], total: int) -> str:
    if not facts:
        return f"0/{total} hosts"
    keys = statistics.median(len(f) for f in facts.values())
    size = statistics.median(len(json.dumps(f)) for f in facts.values())
    return f"{len(facts)}/{total} hosts: {keys:.0f} setup facts, {size / 1024:.1f} KiB JSON/host"


# -- the run -------------------------------------------------------------------


def logins(sim: nodes.SimCluster) -> int:
    return sum(node.accepted_logins() for node in sim.nodes.values())


def measured(sim: nodes.SimCluster, row: Row, work: Callable[[], tuple[float, str]]) -> str:
    """Run ``work`` (which returns ``(seconds, stdout)``), note its time and new logins."""
    before = logins(sim)
    elapsed, stdout = work()
    row.times.append(elapsed)
    row.logins.append(logins(sim) - before)
    return stdout


def bench(sim: nodes.SimCluster, args: argparse.Namespace) -> tuple[list[Row], list[str]]:
    notes: list[str] = []
    user = sim.cluster_data()["cluster"]["ssh"]["user"]
    cluster_dir = sim.write_cluster(max_parallel=args.nodes)
    cluster = loading.load(cluster_dir)
    ansible, version = ensure_ansible()
    setup = None
    if ansible is None:
        notes.append(f"ansible rows skipped: {version}")
    else:
        setup = AnsibleSetup.write(ansible, sim, user)
        notes.append(f"ansible: {version}, forks={args.nodes}, pipelining, "
                     f"interpreter {REMOTE_PYTHON}, StrictHostKeyChecking=yes")

    cold = Row("pool-cold", "llmgw Pool, cold (new Pool)")
    warm = Row("pool-warm", "llmgw Pool, warm (same Pool)")
    cli = Row("cli", "llmgw inventory --json (new process)")
    a_cold = Row("ansible-cold", "ansible -m setup, cold (new process)")
    a_warm = Row("ansible-warm", "ansible -m setup, warm (ControlPersist)")
    llmgw = [str(ROOT / ".venv" / "bin" / "llmgw"), "inventory", "--cluster", str(cluster_dir),
             "--json"]
    for round_ in range(args.repeat):
        fleet = asyncio.run(pool_round(sim, cluster, cluster_dir, cold, warm))
        cold.collected, cold.failures = describe_fleet(fleet)

        snapshot = measured(sim, cli, functools.partial(timed_process, llmgw))
        cli.collected, cli.failures = describe_fleet(Fleet.model_validate_json(snapshot))

        if setup is None:
            continue
        control = setup.home / f"cp{round_}"
        try:
            for row in (a_cold, a_warm):  # the warm run finds the cold run's masters
                output = measured(sim, row, functools.partial(setup.setup, control, args.nodes))
                facts, row.failures = parse_setup(output)
                row.collected = describe_facts(facts, args.nodes)
        finally:
            setup.close_masters(control)
    rows = [cold, warm, cli]
    if setup is not None:
        rows += [a_cold, a_warm]
    return rows, notes


def table(rows: list[Row]) -> str:
    """A Markdown table: median and min wall time, new SSH logins per run, what came back."""
    cells = [["run", "median", "min", "logins/run", "collected"]]
    for row in rows:
        cells.append([row.label, f"{statistics.median(row.times):.3f} s",
                      f"{min(row.times):.3f} s",
                      f"{statistics.median(row.logins):.0f}" if row.logins else "-",
                      row.collected or "as the row above"])
    widths = [max(len(line[i]) for line in cells) for i in range(len(cells[0]))]
    right = (False, True, True, True, False)

    def line(values: list[str]) -> str:
        return "| " + " | ".join(v.rjust(w) if r else v.ljust(w)
                                 for v, w, r in zip(values, widths, right, strict=True)) + " |"

    rule = "|" + "|".join(("-" * (w + 1) + ":") if r else "-" * (w + 2)
                          for w, r in zip(widths, right, strict=True)) + "|"
    return "\n".join([line(cells[0]), rule, *(line(c) for c in cells[1:])])


RATIOS = (
    ("ansible cold / llmgw Pool cold", "ansible-cold", "pool-cold"),
    ("ansible warm / llmgw Pool warm", "ansible-warm", "pool-warm"),
    ("ansible cold / llmgw CLI (process vs process)", "ansible-cold", "cli"),
)


def ratios(rows: list[Row]) -> list[str]:
    """``ansible/llmgw`` of the medians, for each pair measured."""
    by = {row.key: statistics.median(row.times) for row in rows if row.times}
    return [f"{text}: {by[slow] / by[fast]:.1f}x (medians)"
            for text, slow, fast in RATIOS if slow in by and fast in by]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=20, help="simulated nodes (default 20)")
    parser.add_argument("--repeat", type=int, default=5, help="repetitions (default 5)")
    args = parser.parse_args()
    if args.nodes < 1 or args.repeat < 1:
        parser.error("--nodes and --repeat must be at least 1")
    if not shutil.which(nodes.SSHD) or not shutil.which("ssh-keygen"):
        print(f"fan-out bench skipped: {nodes.SSHD} or ssh-keygen missing (make sysdeps)")
        return 0
    nodes.sweep_abandoned()
    sim = nodes.SimCluster.create()
    try:
        start = time.perf_counter()
        for index in range(args.nodes):
            sim.add_node(f"node-{index + 1:02d}", HARDWARE[index % len(HARDWARE)])
        sim.start()
        sim.pin_host_keys()
        print(f"{args.nodes} simulated nodes up in {time.perf_counter() - start:.1f}s "
              f"(sshd + llmgw agent each, 127.0.0.1); {args.repeat} repetitions, "
              f"parallelism {args.nodes}; {os.cpu_count()} CPUs", flush=True)
        rows, notes = bench(sim, args)
    finally:
        sim.close()
    print()
    print(table(rows))
    print()
    for line in [*ratios(rows), *notes]:
        print(line)
    for row in rows:
        for failure in row.failures[:3]:
            print(f"{row.label}: {failure}")
    # A node llmgw could not reach makes its numbers meaningless: say so with the exit
    # status. Ansible's failures are printed above; it is not ours to keep working.
    return 1 if any(row.failures for row in rows if row.key in ("pool-cold", "cli")) else 0


if __name__ == "__main__":
    sys.exit(main())
