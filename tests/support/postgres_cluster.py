"""A throwaway PostgreSQL cluster of a test's own, started the way ``.ci/run`` starts CI's: Debian's
``/usr/lib/postgresql/*/bin`` (initdb, pg_ctl), a temp data dir, scram-sha-256, a free port on
127.0.0.1, the unix socket in the temp dir, fsync off, and ``runuser -u postgres --`` when run as
root (the dir is then chowned to postgres). It can be stopped (``pg_ctl -m fast`` or ``immediate``)
and started again on the same port and data, as a restart or a failover does to a results DB.

    with throwaway_postgres() as pg:            # pytest.skip first if pg_bin() is None
        pg.create_database("results")
        url = pg.url("results")                 # no password in it: pg.env() has PGPASSWORD
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from testsupport import free_ports

USER = "flurka"


def pg_bin() -> Path | None:
    """The newest installed PostgreSQL's bin dir (the one with initdb), or None."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parts[-3])
                   if p.parts[-3].isdigit() else 0)
    return found[-1].parent if found else None


def missing_reason() -> str | None:
    """Why no throwaway cluster can start here (for pytest.skip), or None."""
    if pg_bin() is None:
        return "no PostgreSQL binaries in /usr/lib/postgresql/*/bin (.ci/run installs them)"
    if os.geteuid() == 0:
        try:
            import pwd

            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and there is no postgres user to run the server as"
    return None


class PostgresCluster:
    """One cluster: :meth:`start`, :meth:`stop` (``mode``: fast, immediate), started again as often as
    a test likes on the same port; :meth:`url` without the password, :meth:`env` with PGPASSWORD."""

    def __init__(self, root: Path, bin_dir: Path):
        self.root, self.bin = root, bin_dir
        self.data = root / "data"
        self.log = root / "server.log"
        self.port = free_ports(1)[0]
        self.password = secrets.token_hex(12)
        self._as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

    def _run(self, *args: str, timeout: float = 60) -> None:
        out = subprocess.run([*self._as_postgres, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, timeout=timeout)
        if out.returncode != 0:
            log = self.log.read_text()[-2000:] if self.log.exists() else ""
            raise RuntimeError(f"{' '.join(args[:2])} exited {out.returncode}:\n{out.stdout[-2000:]}\n{log}")

    def init(self) -> None:
        pwfile = self.root / "pwfile"
        pwfile.write_text(self.password + "\n")
        if self._as_postgres:
            shutil.chown(self.root, "postgres", "postgres")
            shutil.chown(pwfile, "postgres", "postgres")
        self._run(str(self.bin / "initdb"), "-D", str(self.data), "-U", USER, f"--pwfile={pwfile}",
                  "--auth=scram-sha-256", "-E", "UTF8", "--locale=C.UTF-8", "--no-sync")
        pwfile.unlink()

    def start(self) -> None:
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-w", "-t", "30",
                  "-o", f"-c listen_addresses=127.0.0.1 -p {self.port} -c unix_socket_directories={self.root} "
                        "-c fsync=off -c full_page_writes=off", "start")

    def stop(self, mode: str = "fast") -> None:
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "-t", "30", "stop")

    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists()

    def url(self, database: str = "postgres", *, password: bool = False) -> str:
        auth = f"{USER}:{self.password}" if password else USER
        return f"postgresql://{auth}@127.0.0.1:{self.port}/{database}"

    def env(self) -> dict[str, str]:
        """os.environ with PGPASSWORD set: how libpq (and `flurka` commands) get the password."""
        return {**os.environ, "PGPASSWORD": self.password}

    def create_database(self, name: str) -> str:
        """CREATE DATABASE ``name``; returns its URL (with the password, for the test's own engines)."""
        import sqlalchemy as sa

        admin = sa.create_engine(self.url(password=True), isolation_level="AUTOCOMMIT")
        try:
            with admin.connect() as conn:
                conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
        finally:
            admin.dispose()
        return self.url(name, password=True)


@contextlib.contextmanager
def throwaway_postgres() -> Iterator[PostgresCluster]:
    """A started :class:`PostgresCluster` in a temp dir of its own under /tmp (pytest's tmp_path is
    0700 root's: the postgres user could not enter it), stopped and removed on exit."""
    bin_dir = pg_bin()
    if bin_dir is None:
        raise RuntimeError(missing_reason())
    root = Path(tempfile.mkdtemp(prefix="flurka-pg-"))
    cluster = PostgresCluster(root, bin_dir)
    try:
        cluster.init()
        cluster.start()
        yield cluster
    finally:
        if cluster.running():
            with contextlib.suppress(Exception):
                cluster.stop("immediate")
        shutil.rmtree(root, ignore_errors=True)
