"""A PostgreSQL cluster and a Redis server of a test's own, to stop, restart and kill.

The fault tests take the database and the broker away in the middle of work. They do it to
servers started here, in a temporary folder on free ports, so the machine's own PostgreSQL
and Redis (which other tests are using at the same time) are never touched.

PostgreSQL refuses to run as root, so when the tests run as root the cluster's files belong
to the ``postgres`` user and its commands run through ``runuser``; a machine without the
server binaries or that user skips the tests that need them (:func:`postgres_binaries`).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from tests.support.waiting import wait_until


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def postgres_binaries() -> Path | None:
    """The folder of ``initdb`` and ``pg_ctl`` (Debian keeps them off ``PATH``), or None."""
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"), key=lambda p: int(p.parts[-3]))
    if versions:
        return versions[-1].parent
    found = shutil.which("pg_ctl")
    return Path(found).resolve().parent if found else None


def _as_postgres_user() -> list[str]:
    """The prefix that runs a PostgreSQL command as a user allowed to (not root)."""
    if os.geteuid() != 0:
        return []
    return ["runuser", "-u", "postgres", "--"]


def postgres_unavailable_reason() -> str | None:
    """Why a private cluster cannot be started here, or None when it can."""
    if postgres_binaries() is None:
        return "the PostgreSQL server binaries (initdb, pg_ctl) are not installed"
    if os.geteuid() == 0:
        try:
            import pwd

            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and there is no postgres user to run a cluster as"
        if shutil.which("runuser") is None:
            return "running as root and runuser is missing"
    return None


class PrivatePostgres:
    """A throwaway PostgreSQL cluster: ``start()``, ``stop()``, ``crash()``, ``restart()``.

    ``fsync`` is off (the tests are about connections going away, not about the disk), and
    trust authentication for the ``postgres`` user over TCP on 127.0.0.1. Commits are
    asynchronous unless ``keep_commits``: a ``crash()`` may then lose the last commits it
    acknowledged, which a test that crashes the server and counts what it wrote must not
    allow (a process crash keeps what reached the operating system, fsync or not).
    """

    def __init__(self, port: int | None = None, *, keep_commits: bool = False) -> None:
        bins = postgres_binaries()
        if bins is None:
            raise RuntimeError(postgres_unavailable_reason())
        self.bin = bins
        # A folder of its own directly in the temporary directory: a pytest tmp_path sits
        # below folders only root may enter, where the postgres user could not reach it.
        self.root = Path(tempfile.mkdtemp(prefix="weft-postgres-"))
        self.data = self.root / "data"
        self.log_path = self.root / "postgres.log"
        self.port = port or free_port()
        self.host = "127.0.0.1"
        self.user = "postgres"
        self.keep_commits = keep_commits

    def _run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*_as_postgres_user(), *argv], check=check, capture_output=True, text=True, timeout=120
        )

    def init(self) -> None:
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
        self._run(
            str(self.bin / "initdb"), "-D", str(self.data), "-A", "trust", "-U", self.user,
            "--no-sync", "-E", "UTF8", "--locale", "C",
        )  # fmt: skip

    def start(self) -> None:
        if not self.data.exists():
            self.init()
        commits = "on" if self.keep_commits else "off"
        options = (
            f"-p {self.port} -c listen_addresses={self.host} -k {self.root} "
            f"-c fsync=off -c synchronous_commit={commits} -c full_page_writes=off -c max_connections=200"
        )
        self._run(
            str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.log_path), "-o", options,
            "-w", "-t", "60", "start",
        )  # fmt: skip
        wait_until(self.accepting, "the private PostgreSQL accepts connections", timeout=60)

    def stop(self, mode: str = "fast") -> None:
        """``fast`` ends sessions cleanly; ``immediate`` is a crash (recovery on next start)."""
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop", check=False)

    def crash(self) -> None:
        self.stop("immediate")

    def restart(self, mode: str = "fast") -> None:
        self.stop(mode)
        self.start()

    def accepting(self) -> bool:
        try:
            with socket.create_connection((self.host, self.port), timeout=1):
                pass
        except OSError:
            return False
        result = subprocess.run(
            [str(self.bin / "pg_isready"), "-q", "-h", self.host, "-p", str(self.port)],
            check=False,
        )
        return result.returncode == 0

    def create_database(self, name: str) -> None:
        self._run(
            str(self.bin / "psql"), "-h", self.host, "-p", str(self.port), "-U", self.user, "-d", "postgres",
            "-v", "ON_ERROR_STOP=1", "-c", f'CREATE DATABASE "{name}"',
        )  # fmt: skip

    def database_settings(self, name: str) -> dict[str, object]:
        """A Django ``DATABASES`` entry for database ``name`` on this cluster."""
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": name,
            "USER": self.user,
            "HOST": self.host,
            "PORT": str(self.port),
        }

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def destroy(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


class PrivateRedis:
    """A throwaway Redis server, in memory only: ``stop()`` loses what it held, as a broker
    restart without persistence does."""

    def __init__(self, root: Path, port: int | None = None) -> None:
        if shutil.which("redis-server") is None:
            raise RuntimeError("redis-server is not installed")
        self.root = root
        self.port = port or free_port()
        self.log_path = root / "redis.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        argv = ["redis-server", "--bind", "127.0.0.1", "--port", str(self.port), "--save", "",
                "--appendonly", "no", "--dir", str(self.root)]  # fmt: skip
        self.process = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        log.close()
        wait_until(self.accepting, "the private Redis accepts connections", timeout=30)

    def accepting(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)
        self.process = None

    def restart(self, down_for: float = 0.0) -> None:
        self.stop()
        time.sleep(down_for)
        self.start()
