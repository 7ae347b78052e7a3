"""A real PostgreSQL server for tests: the Debian package, started by hand.

:class:`PgServer` runs ``initdb`` and ``pg_ctl`` from ``/usr/lib/postgresql/*/bin``
in a temporary directory as an unprivileged user (PostgreSQL refuses to run as
root; under root we drop to ``nobody`` with ``setpriv``), listening on a unix
socket and on a loopback port inside the test's network namespace. No system
service is involved. The role ``llmgw`` logs in with a password (SCRAM over
TCP), as in production; the superuser ``postgres`` uses the socket for
set-up only. Each test gets a database of its own (:meth:`PgServer.database`).
"""

from __future__ import annotations

import glob
import itertools
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

PASSWORD = "s3cret-for-tests"


def bindir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    return Path(found[-1]).parent if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Database:
    url: str  # no password in it, as in a cluster file
    password_file: Path
    name: str

    @property
    def settings(self) -> dict[str, str]:
        """The ``cluster.store`` section that points at this database."""
        return {"url": self.url, "password_file": str(self.password_file)}


class PgServer:
    def __init__(self, durable: bool = False) -> None:
        """``durable``: commits survive a crash (fsync, synchronous_commit): a test that
        kills the server counts on what it acknowledged."""
        binaries = bindir()
        if binaries is None:
            raise RuntimeError("PostgreSQL is not installed (make sysdeps)")
        self.bin = binaries
        self.root = Path(tempfile.mkdtemp(prefix="llmgw-pg-"))
        self.data = self.root / "data"
        self.sockets = self.root / "run"
        self.sockets.mkdir()
        self.port = _free_port()
        self.password_file = self.root / "password"
        self.password_file.write_text(PASSWORD + "\n")
        self.password_file.chmod(0o600)
        self._user = "nobody" if os.geteuid() == 0 else None
        superpw = self.root / "superpw"
        superpw.write_text(PASSWORD + "\n")
        if self._user:
            entry = pwd.getpwnam(self._user)
            for path in (self.root, self.sockets, superpw):
                os.chown(path, entry.pw_uid, entry.pw_gid)
        self._as_owner([str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres",
                        "--auth-local=trust", "--auth-host=scram-sha-256",
                        f"--pwfile={superpw}", "-E", "UTF8", "--no-instructions"])
        options = (f"-k {self.sockets} -p {self.port} -c listen_addresses=127.0.0.1 "
                   + ("" if durable else
                      "-c fsync=off -c synchronous_commit=off -c full_page_writes=off ")
                   + "-c max_connections=200")
        self._options = options
        self.start()
        self.psql(f"CREATE ROLE llmgw LOGIN PASSWORD '{PASSWORD}'")
        self._counter = itertools.count(1)

    def _as_owner(self, argv: list[str]) -> str:
        if self._user:
            argv = ["setpriv", f"--reuid={self._user}", "--regid=nogroup", "--clear-groups",
                    "--", *argv]
        done = subprocess.run(argv, capture_output=True, text=True, cwd=self.root)
        if done.returncode != 0:
            log = (self.root / "log").read_text() if (self.root / "log").exists() else ""
            raise RuntimeError(f"{argv[-1]} failed: {done.stderr}\n{log}")
        return done.stdout

    def psql(self, sql: str, database: str = "postgres") -> str:
        return self._as_owner([str(self.bin / "psql"), "-h", str(self.sockets), "-p",
                               str(self.port), "-U", "postgres", "-d", database, "-tAq",
                               "-v", "ON_ERROR_STOP=1", "-c", sql])

    def database(self) -> Database:
        """A new empty database owned by ``llmgw``."""
        name = f"llmgw_{next(self._counter)}"
        self.psql(f"CREATE DATABASE {name} OWNER llmgw")
        return Database(f"postgresql://llmgw@127.0.0.1:{self.port}/{name}",
                        self.password_file, name)

    def start(self) -> None:
        self._as_owner([str(self.bin / "pg_ctl"), "-D", str(self.data), "-o", self._options,
                        "-l", str(self.root / "log"), "-w", "-t", "60", "start"])

    def kill(self) -> None:
        """Stop at once, as a crash would (``-m immediate``), keeping the data: start()
        brings it back."""
        self._as_owner([str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate",
                        "-w", "stop"])

    def stop(self) -> None:
        try:
            self._as_owner([str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate",
                            "-w", "stop"])
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
