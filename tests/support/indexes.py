"""A local package index for engine installs: a real wheel, a real PEP 503 index.

:func:`build_standin` writes a small pure-Python project named like an engine
(``vllm``: a ``vllm`` command whose ``--version`` prints its version) and
builds it into a wheel with ``pip wheel``, through an in-tree PEP 517 backend
(``standin_backend.py``, which needs nothing installed). :class:`Index`
serves ``simple/<name>/index.html`` pages linking the wheels with their
sha256, by ``python -m http.server`` in a subprocess, and keeps its access
log so a test can count downloads.
"""

from __future__ import annotations

import contextlib
import hashlib
import html
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from llmgw.onboarding.simnodes import free_port

BACKEND = Path(__file__).with_name("standin_backend.py")


def build_standin(workdir: Path, name: str = "vllm", version: str = "0.11.0") -> Path:
    """Build the stand-in ``name==version`` into a wheel under ``workdir``; its path."""
    project = workdir / f"{name}-{version}-src"
    package = project / name
    package.mkdir(parents=True)
    (project / "pyproject.toml").write_text(
        '[build-system]\nrequires = []\nbuild-backend = "standin_backend"\nbackend-path = ["."]\n'
        f'[project]\nname = "{name}"\nversion = "{version}"\n')
    (project / "standin_backend.py").write_text(BACKEND.read_text())
    (package / "__init__.py").write_text(f'__version__ = "{version}"\n')
    (package / "cli.py").write_text(
        "import sys\n\nfrom . import __version__\n\n\n"
        "def main() -> int:\n"
        "    if sys.argv[1:] == ['--version']:\n"
        "        print(__version__)\n"
        "        return 0\n"
        f"    print('{name} stand-in: only --version', file=sys.stderr)\n"
        "    return 2\n")
    out = workdir / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "--no-index", "-q", "-w", str(out), str(project)], check=True)
    wheel, = out.glob(f"{name}-{version}-*.whl")
    return wheel


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass
class Index:
    """A PEP 503 simple index served from ``root`` on 127.0.0.1."""

    root: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/simple"

    @property
    def log(self) -> Path:
        return self.root.parent / "index.log"

    def add(self, wheel: Path) -> None:
        """List ``wheel`` under its project's page (files live in ``/files``)."""
        project = wheel.name.split("-")[0].lower().replace("_", "-")
        files = self.root / "files"
        files.mkdir(parents=True, exist_ok=True)
        (files / wheel.name).write_bytes(wheel.read_bytes())
        page = self.root / "simple" / project
        page.mkdir(parents=True, exist_ok=True)
        links = "".join(
            f'<a href="../../files/{html.escape(w.name)}#sha256={sha256(w)}">'
            f"{html.escape(w.name)}</a>\n"
            for w in sorted(files.glob(f"{wheel.name.split('-')[0]}-*.whl")))
        (page / "index.html").write_text(f"<!DOCTYPE html>\n<html><body>\n{links}</body></html>\n")
        (self.root / "simple" / "index.html").write_text(
            "<!DOCTYPE html>\n<html><body>\n" + "".join(
                f'<a href="{p.name}/">{p.name}</a>\n'
                for p in sorted((self.root / "simple").iterdir()) if p.is_dir())
            + "</body></html>\n")

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "http.server", str(self.port), "--bind", "127.0.0.1",
                 "--directory", str(self.root)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"{self.url}/", timeout=2).raise_for_status()
                return
            except httpx.HTTPError:
                assert self.process.poll() is None, self.log.read_text()
                assert time.monotonic() < deadline, "the index did not start"
                time.sleep(0.1)

    def downloads(self, filename: str) -> int:
        """How many times ``filename`` was fetched (GET with 200), from the access log."""
        return sum(1 for line in self.log.read_text().splitlines()
                   if f"GET /files/{filename} " in line and '" 200 ' in line)

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=10)
            self.process = None


@contextlib.contextmanager
def serving(directory: Path, *wheels: Path) -> Iterator[Index]:
    """A started index in ``directory`` holding ``wheels``, stopped when the block ends."""
    served = Index(directory)
    for wheel in wheels:
        served.add(wheel)
    served.start()
    try:
        yield served
    finally:
        served.stop()
