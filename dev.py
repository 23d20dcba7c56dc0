#!/usr/bin/env python3
"""Set up and run django-jobs' development tasks with any python3.

    python3 dev.py demo     # install, then watch the example project work (SQLite)
    python3 dev.py test     # install, then run the test suite (PostgreSQL, then MariaDB
                            # and Django 5.2 on PostgreSQL side by side, then SQLite,
                            # then through PgBouncer)
    python3 dev.py test-mariadb     # only the MariaDB run (127.0.0.1:3306, root), a subset:
                            # -m "not slow or mariadb": the tests not marked slow, and the
                            # slow ones marked mariadb (3 worker processes x 5,000 atomic
                            # jobs exactly once, SIGKILL rescue after the lease)
    python3 dev.py test-sqlite      # only the SQLite run
    python3 dev.py test-django52    # only the Django 5.2 run (.venv-django52): the MariaDB
                            # run's selection, without the chaos suite, the wheel build
                            # and the bench smoke run
    python3 dev.py test-pgbouncer   # only the PgBouncer (transaction pooling) run
    python3 dev.py bench    # install, then run the benchmarks (PostgreSQL)
    python3 dev.py docs     # build the documentation site into docs/_build/html (strict)
    python3 dev.py typecheck        # mypy with django-stubs over django_jobs (pyproject.toml)

It finds a Python >= 3.12 (Django 6 needs it) even when `python3` is older,
makes .venv with it, and installs the project there. Set PYTHON=/path/to/python
to choose the interpreter yourself.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET  # noqa: N817, S405 - our own pytest report
from collections.abc import Iterator

ROOT = os.path.dirname(os.path.abspath(__file__))
VENV = os.path.join(ROOT, ".venv")
# The oldest Django that pyproject.toml allows, so that CI cannot break it unnoticed.
VENV_DJANGO52 = os.path.join(ROOT, ".venv-django52")
MINIMUM = (3, 12)
# Test files whose outcome cannot depend on the Django version (see test_django52).
DJANGO_INDEPENDENT = ("test_packaging.py", "test_bench_smoke.py")
DJANGO52_PINS = ("django>=5.2,<5.3",)


def say(message: str) -> None:
    print(f"dev.py: {message}", flush=True)  # noqa: T201


def version_of(python: str) -> tuple[int, int] | None:
    try:
        out = subprocess.run(
            [python, "-c", "import sys; print(*sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    major, minor = out.split()
    return int(major), int(minor)


def candidates() -> list[str]:
    found = []
    if os.environ.get("PYTHON"):
        found.append(os.environ["PYTHON"])
    for name in ("python3.13", "python3.12", "python3.14", "python3"):
        path = shutil.which(name)
        if path:
            found.append(path)
    roots = [os.environ.get("PYENV_ROOT", ""), os.path.expanduser("~/.pyenv")]
    pyenv = shutil.which("pyenv")
    if pyenv:
        root = subprocess.run(
            [pyenv, "root"], capture_output=True, text=True, check=False
        ).stdout.strip()
        roots.insert(0, root)
    for root in filter(None, roots):
        found += sorted(
            glob.glob(os.path.join(root, "versions", "3.1[2-9]*", "bin", "python3")), reverse=True
        )
    found += sorted(
        glob.glob(os.path.expanduser("~/.local/share/uv/python/cpython-3.1[2-9]*/bin/python3")),
        reverse=True,
    )
    return list(dict.fromkeys(found))


def find_python() -> str:
    tried = []
    for python in candidates():
        version = version_of(python)
        tried.append(f"{python} ({'.'.join(map(str, version)) if version else 'does not run'})")
        if version and version >= MINIMUM:
            return python
    lines = "\n  ".join(tried) or "(no python3 on PATH)"
    sys.exit(
        "dev.py: django-jobs needs Python >= 3.12 (Django 6 requires it) and found none.\n"
        f"  tried:\n  {lines}\n"
        "  Install one (e.g. `pyenv install 3.12`, `uv python install 3.12`, or your system's\n"
        "  python3.12 package), or point PYTHON=/path/to/python3.12 at one, then run this again."
    )


def venv_python(venv: str = VENV) -> str:
    return os.path.join(venv, "bin", "python")


def ensure_venv(extras: str, venv: str = VENV, pins: tuple[str, ...] = ()) -> str:
    """Create venv with a suitable Python; install the project (once per change of pyproject)."""
    python = venv_python(venv)
    if os.path.exists(python) and (version_of(python) or (0, 0)) < MINIMUM:
        say(f"{venv} was made with an older Python; rebuilding it")
        shutil.rmtree(venv)
    if not os.path.exists(python):
        base = find_python()
        say(f"creating {venv} with {base}")
        subprocess.run([base, "-m", "venv", venv], check=True)
        subprocess.run([python, "-m", "pip", "install", "--quiet", "--upgrade", "pip"], check=True)
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        stamp = hashlib.sha256(f.read() + extras.encode() + " ".join(pins).encode()).hexdigest()
    stamp_file = os.path.join(venv, f".installed-{extras or 'base'}")
    if not os.path.exists(stamp_file) or open(stamp_file).read() != stamp:
        extra = ", ".join(filter(None, [extras, *pins]))
        say(f"installing django-jobs{' with ' + extra if extra else ''} into {venv}")
        # The distribution was called django-jobs before it became django-durable-jobs.
        subprocess.run(
            [python, "-m", "pip", "uninstall", "--yes", "--quiet", "django-jobs"],
            capture_output=True,
            check=False,
        )
        command = [python, "-m", "pip", "install", "--quiet", "-e", ROOT, *pins]
        if extras:
            command += ["--group", extras]
        subprocess.run(command, check=True)
        with open(stamp_file, "w") as f:
            f.write(stamp)
    return python


def demo(args: list[str]) -> int:
    python = ensure_venv("")
    project = os.path.join(ROOT, "example_project")
    return subprocess.run([python, "manage.py", "demo", *args], cwd=project, check=False).returncode


def postgres_ready(python: str) -> bool:
    check = (
        "import os, psycopg; psycopg.connect(host=os.environ.get('PGHOST', '127.0.0.1'), "
        "port=os.environ.get('PGPORT', '5432'), user=os.environ.get('PGUSER', 'postgres'), "
        "dbname='postgres', connect_timeout=5).close()"
    )
    return runs(python, check)


# The second PostgreSQL server of the several-databases tests (tests/settings.py's "jobs2").
JOBS2_CLUSTER = "jobs2"


def ensure_second_postgres() -> bool:
    """Start the PostgreSQL cluster "jobs2" on JOBS2_PGPORT (5433), making it if need be."""
    port = os.environ.get("JOBS2_PGPORT", "5433")
    host = os.environ.get("JOBS2_PGHOST", "127.0.0.1")

    def ready() -> bool:
        check = ["pg_isready", "-h", host, "-p", port, "-q"]
        return shutil.which("pg_isready") is not None and subprocess.run(check).returncode == 0

    if ready():
        return True
    root = hasattr(os, "geteuid") and os.geteuid() == 0
    if not (root and shutil.which("pg_createcluster") and os.path.isdir("/etc/postgresql")):
        say(f"no PostgreSQL on {host}:{port} for the several-databases tests (JOBS2_PGPORT)")
        return False
    version = sorted(os.listdir("/etc/postgresql"))[0]
    folder = f"/etc/postgresql/{version}/{JOBS2_CLUSTER}"
    if not os.path.isdir(folder):
        say(f"making the PostgreSQL cluster {JOBS2_CLUSTER} on port {port}")
        subprocess.run(
            ["pg_createcluster", version, JOBS2_CLUSTER, "--port", port],
            stdout=subprocess.DEVNULL,
            check=True,
        )
        with open(f"{folder}/pg_hba.conf", "w") as hba:  # as the first cluster: trust
            hba.write("local all all trust\nhost all all 127.0.0.1/32 trust\n")
        with open(f"{folder}/conf.d/django-jobs.conf", "w") as extra:
            extra.write("listen_addresses = '127.0.0.1'\nmax_connections = 100\n")
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", version, JOBS2_CLUSTER, "start"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=False,
    )
    for _ in range(60):
        if ready():
            return True
        time.sleep(0.5)
    say(f"the PostgreSQL cluster {JOBS2_CLUSTER} did not start on port {port}")
    return False


def runs(python: str, code: str) -> bool:
    """Whether python runs code without an error (a connection check, an import)."""
    return subprocess.run([python, "-c", code], capture_output=True, check=False).returncode == 0


def ensure_browser() -> bool:
    """Make Debian's chromium and chromium-driver available for the admin's browser test."""
    if shutil.which("chromium") and shutil.which("chromedriver"):
        return True
    apt = shutil.which("apt-get")
    if apt and hasattr(os, "geteuid") and os.geteuid() == 0:
        say("installing Debian's chromium and chromium-driver for the admin's browser test")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        steps = (
            [apt, "update", "-qq"],
            [apt, "install", "-y", "-qq", "chromium", "chromium-driver"],
        )
        for step in steps:
            if subprocess.run(step, env=env, stdout=subprocess.DEVNULL, check=False).returncode:
                break
        if shutil.which("chromium") and shutil.which("chromedriver"):
            return True
    say(
        "no chromium/chromedriver: the admin's browser test will be skipped "
        "(install them with: apt-get install chromium chromium-driver)"
    )
    return False


def pytest_run(
    python: str, env: dict[str, str], args: list[str], report: str
) -> tuple[int, list[str]]:
    code = subprocess.run(
        [python, "-m", "pytest", f"--junitxml={report}", *args], cwd=ROOT, env=env, check=False
    ).returncode
    skipped = []
    if os.path.exists(report):
        for case in ET.parse(report).getroot().iter("testcase"):  # noqa: S314
            for skip in case.iter("skipped"):
                skipped.append(f"{case.get('classname')}.{case.get('name')}: {skip.get('message')}")
    return code, skipped


def test(args: list[str]) -> int:
    python = ensure_venv("test")
    if not postgres_ready(python):
        sys.exit(
            "dev.py: PostgreSQL is not reachable at "
            f"{os.environ.get('PGHOST', '127.0.0.1')}:{os.environ.get('PGPORT', '5432')} "
            f"as {os.environ.get('PGUSER', 'postgres')}.\n"
            "  Start it (on Debian: pg_ctlcluster --skip-systemctl-redirect "
            "$(ls /etc/postgresql) main start)\n"
            "  or set PGHOST/PGPORT/PGUSER/PGPASSWORD to one you can use."
        )
    os.makedirs(os.path.join(ROOT, "reports"), exist_ok=True)
    ensure_second_postgres()  # without it, the several-databases tests fail (not skip)
    base_env = dict(os.environ)
    if ensure_browser() or os.environ.get("CI"):
        # The browser test then fails, rather than skips, without a browser.
        base_env["JOBS_REQUIRE_BROWSER"] = "1"
    code = postgres_run(python, base_env, args, "postgres", "PostgreSQL")
    if code:
        return code
    # The venvs the next stages use are made now, one pip at a time.
    ensure_mysqlclient()
    ensure_venv("test", VENV_DJANGO52, DJANGO52_PINS)
    # Only the PostgreSQL run above restarts PostgreSQL (its chaos tests); these two
    # share no database and no file of the tree, so they run side by side.
    code = side_by_side(["test-mariadb", "test-django52"], args, base_env)
    if code:
        return code
    # SQLite alone: its one writer at a time, on a machine busy with two other runs,
    # held settles past their leases (a non-atomic step then ran twice, as it may).
    code = test_sqlite(args)
    if code:
        return code
    return test_pgbouncer(args)


def test_sqlite(args: list[str]) -> int:
    """Run the suite on SQLite (the tests marked postgres skip)."""
    python = ensure_venv("test")
    say("running the tests on SQLite")
    env = {**os.environ, "TEST_DB": "sqlite"}
    code, _ = pytest_run(python, env, args, os.path.join(ROOT, "reports", "sqlite.xml"))
    return code


def side_by_side(stages: list[str], args: list[str], env: dict[str, str]) -> int:
    """Run `dev.py STAGE args` for each stage at once; print each log whole, in order."""
    say("running side by side: " + ", ".join(stages) + " (logs in reports/)")
    running = []
    for stage in stages:
        log = os.path.join(ROOT, "reports", f"{stage}.log")
        with open(log, "w") as out:
            command = [sys.executable, os.path.abspath(__file__), stage, *args]
            process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=out)
        running.append((stage, log, process, time.monotonic()))
    codes = []
    for stage, _, process, started in running:
        code = process.wait()
        codes.append(code)
        say(f"{stage}: exit {code} after {time.monotonic() - started:.0f} s")
    for (stage, log, _, _), code in zip(running, codes, strict=True):
        say(f"--- {stage} (exit {code}) ---")
        with open(log) as f:
            sys.stdout.write(f.read())
        sys.stdout.flush()
    return next((code for code in codes if code), 0)


def postgres_run(python: str, env: dict[str, str], args: list[str], report: str, label: str) -> int:
    """Run pytest on PostgreSQL; fail when a PostgreSQL test was skipped."""
    say(f"running the tests on {label}")
    env = {**env, "TEST_DB": "postgres"}
    code, skipped = pytest_run(python, env, args, os.path.join(ROOT, "reports", f"{report}.xml"))
    if code:
        return code
    postgres_skips = [s for s in skipped if "postgres" in s.lower()]
    if postgres_skips:
        say(f"PostgreSQL tests were skipped on the {label} run:\n  " + "\n  ".join(postgres_skips))
        return 1
    return 0


def test_django52(args: list[str]) -> int:
    """Run the suite on the oldest supported Django (5.2) against PostgreSQL."""
    python = ensure_venv("test", VENV_DJANGO52, DJANGO52_PINS)
    ensure_second_postgres()
    # django.tasks (Django >= 6.0) tests skip here by design; their skip reasons name no PostgreSQL.
    # Without arguments, the MariaDB stage's selection (the slow tests are two thirds of the
    # PostgreSQL run's time, and drive the same code through more processes, not other
    # Django APIs; the slow ones marked mariadb stay), without the wheel build and the
    # benchmark's smoke run: the Django 6 run covers those, and CI has 45 minutes in all.
    subset = [
        "-m",
        f"({MARIADB_SELECTION}) and not chaos",
        *(f"--ignore=tests/{name}" for name in DJANGO_INDEPENDENT),
    ]
    return postgres_run(
        python, dict(os.environ), args or subset, "postgres-django52", "PostgreSQL, Django 5.2"
    )


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def apt_install(packages: list[str], why: str) -> bool:
    """Install Debian packages when this is root on a system with apt-get; say whether it ran."""
    apt = shutil.which("apt-get")
    if not (apt and hasattr(os, "geteuid") and os.geteuid() == 0):
        return False
    say(f"installing Debian's {' and '.join(packages)} {why}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for step in ([apt, "update", "-qq"], [apt, "install", "-y", "-qq", *packages]):
        subprocess.run(step, env=env, stdout=subprocess.DEVNULL, check=False)
    return True


def ensure_pgbouncer() -> str | None:
    """Return Debian's pgbouncer, installing it when missing and this is root."""
    found = shutil.which("pgbouncer") or shutil.which("pgbouncer", path="/usr/sbin")
    if not found and apt_install(["pgbouncer"], "for the transaction-pooling run"):
        found = shutil.which("pgbouncer") or shutil.which("pgbouncer", path="/usr/sbin")
    return found


@contextlib.contextmanager
def pgbouncer(binary: str) -> Iterator[int]:
    """Run pgbouncer in transaction pooling in front of PostgreSQL; yield its port."""
    host = os.environ.get("PGHOST", "127.0.0.1")
    upstream = f"host={host} port={os.environ.get('PGPORT', '5432')}"
    if os.environ.get("PGPASSWORD"):
        upstream += f" password={os.environ['PGPASSWORD']}"
    user = os.environ.get("PGUSER", "postgres")
    port = free_port()
    folder = tempfile.mkdtemp(prefix="django-jobs-pgbouncer-")
    os.chmod(folder, 0o755)  # noqa: S103 - pgbouncer drops root and must still read its config
    with open(os.path.join(folder, "userlist.txt"), "w") as f:
        f.write(f'"{user}" ""\n')
    config = os.path.join(folder, "pgbouncer.ini")
    with open(config, "w") as f:
        f.write(
            "[databases]\n"
            f"* = {upstream}\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
            f"auth_type = trust\nauth_file = {folder}/userlist.txt\nadmin_users = {user}\n"
            "pool_mode = transaction\nmax_client_conn = 1000\ndefault_pool_size = 20\n"
            # Idle server sessions go soon, so that dropping the test databases is not refused.
            "server_idle_timeout = 2\n"
            "ignore_startup_parameters = extra_float_digits,options\n"
        )
    for name in os.listdir(folder):
        os.chmod(os.path.join(folder, name), 0o644)
    # pgbouncer refuses to run as root; -u makes it drop to an unprivileged user.
    command = [binary, config]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        command[1:1] = ["-u", "nobody"]
    log = open(os.path.join(folder, "pgbouncer.log"), "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)  # noqa: S603
    try:
        for _ in range(100):
            if proc.poll() is not None:
                log.close()
                sys.exit(
                    "dev.py: pgbouncer did not start:\n"
                    + open(os.path.join(folder, "pgbouncer.log")).read()
                )
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.1)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()
        shutil.rmtree(folder, ignore_errors=True)


def drop_databases(python: str, names: list[str]) -> None:
    """Drop test databases directly on PostgreSQL, closing the pooler's sessions to them."""
    drop = (
        "import os, sys, psycopg\n"
        "with psycopg.connect(host=os.environ.get('PGHOST', '127.0.0.1'), "
        "port=os.environ.get('PGPORT', '5432'), user=os.environ.get('PGUSER', 'postgres'), "
        "dbname='postgres', autocommit=True) as conn:\n"
        "    for name in sys.argv[1:]:\n"
        "        conn.execute(f'DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)')\n"
    )
    subprocess.run([python, "-c", drop, *names], check=True)


def test_pgbouncer(args: list[str]) -> int:
    """Run the tests marked pgbouncer through PgBouncer in transaction pooling."""
    python = ensure_venv("test")
    binary = ensure_pgbouncer()
    if not binary:
        say("no pgbouncer: the transaction-pooling run is left out (apt-get install pgbouncer)")
        return 1 if os.environ.get("CI") else 0
    name = os.environ.get("JOBS_TEST_DB", "django_jobs") + "_pgbouncer"
    # pytest-django makes these; through the pooler it could not drop them (open server
    # sessions), so they are dropped here directly, before and after.
    databases = [f"test_{name}", f"test_{name}_other"]
    drop_databases(python, databases)
    try:
        with pgbouncer(binary) as port:
            say(f"running the pgbouncer tests through PgBouncer (transaction pooling, port {port})")
            env = {**os.environ, "TEST_DB": "postgres", "JOBS_TEST_DB": name}
            env.update(PGPORT=str(port), JOBS_PGBOUNCER="1")
            # --reuse-db: pytest-django creates the databases if missing and never drops them.
            args = ["-m", "pgbouncer", *args, "--reuse-db"]
            report = os.path.join(ROOT, "reports", "pgbouncer.xml")
            code, skipped = pytest_run(python, env, args, report)
    finally:
        drop_databases(python, databases)
    if code == 5:  # a selection of the caller's without pgbouncer tests
        say("no pgbouncer tests in this selection")
        return 0
    if code:
        return code
    if skipped:
        say("tests were skipped on the PgBouncer run:\n  " + "\n  ".join(skipped))
        return 1
    return 0


# The MariaDB stage of `test`: the suite without the slow tests, plus the slow ones
# marked mariadb (several worker processes sharing 5,000 atomic jobs, SIGKILL rescue).
MARIADB_SELECTION = "not slow or mariadb"


# What may skip on the MariaDB run: PostgreSQL-only tests, tests that say why MariaDB
# cannot run them, and the skips every run has (the pgbouncer run's own tests, the
# tests of a Django without django.tasks).
MARIADB_SKIPS = (
    "needs PostgreSQL",
    "not on MariaDB",
    "runs in dev.py's pgbouncer run only",
    "this Django has django.tasks",
)


def mariadb_ready(python: str) -> bool:
    check = (
        "import os, MySQLdb; MySQLdb.connect(host=os.environ.get('MYSQL_HOST', '127.0.0.1'), "
        "port=int(os.environ.get('MYSQL_PORT', '3306')), user=os.environ.get('MYSQL_USER', "
        "'root'), password=os.environ.get('MYSQL_PASSWORD', ''), connect_timeout=5).close()"
    )
    return runs(python, check)


def ensure_mysqlclient() -> str:
    """Install the mariadb group (mysqlclient, built against Debian's client library)."""
    python = ensure_venv("test")
    if not runs(python, "import MySQLdb"):
        if not shutil.which("pkg-config") or not glob.glob("/usr/include/*/mysql.h"):
            apt_install(["pkg-config", "default-libmysqlclient-dev"], "for mysqlclient")
    return ensure_venv("mariadb")


def test_mariadb(args: list[str]) -> int:
    """Run the MariaDB stage; fail when a test was skipped that MariaDB should run."""
    python = ensure_mysqlclient()
    if not mariadb_ready(python):
        sys.exit(
            "dev.py: MariaDB is not reachable at "
            f"{os.environ.get('MYSQL_HOST', '127.0.0.1')}:{os.environ.get('MYSQL_PORT', '3306')} "
            f"as {os.environ.get('MYSQL_USER', 'root')}.\n"
            "  Start it (on Debian: service mariadb start) or set MYSQL_HOST/MYSQL_PORT/"
            "MYSQL_USER/MYSQL_PASSWORD to one you can use."
        )
    say(f'running the tests on MariaDB (-m "{MARIADB_SELECTION}")')
    env = {**os.environ, "TEST_DB": "mariadb"}
    args = ["-m", MARIADB_SELECTION, *args]
    code, skipped = pytest_run(python, env, args, os.path.join(ROOT, "reports", "mariadb.xml"))
    if code:
        return code
    unexpected = [s for s in skipped if not any(why in s for why in MARIADB_SKIPS)]
    if unexpected:
        say("tests were skipped on the MariaDB run:\n  " + "\n  ".join(unexpected))
        return 1
    return 0


def typecheck(args: list[str]) -> int:
    """Run mypy over the package, as configured in pyproject.toml ([tool.mypy])."""
    python = ensure_venv("test")
    return subprocess.run([python, "-m", "mypy", *args], cwd=ROOT, check=False).returncode


def bench(args: list[str]) -> int:
    python = ensure_venv("test")
    return subprocess.run(
        [python, os.path.join(ROOT, "bench", "run.py"), *args], cwd=ROOT, check=False
    ).returncode


def docs(args: list[str]) -> int:
    """Build docs/ with Sphinx into docs/_build/html; any warning fails the build."""
    python = ensure_venv("docs")
    source = os.path.join(ROOT, "docs")
    out = os.path.join(source, "_build", "html")
    # -E: read every page again, so that a warning of an unchanged page is not hidden.
    command = [python, "-m", "sphinx", "-W", "--keep-going", "-E", "-q", "-b", "html"]
    code = subprocess.run([*command, *args, source, out], check=False).returncode
    if code == 0:
        say(f"documentation built: {os.path.join(out, 'index.html')}")
    return code


COMMANDS = {
    "demo": demo,
    "test": test,
    "test-sqlite": test_sqlite,
    "test-django52": test_django52,
    "test-pgbouncer": test_pgbouncer,
    "test-mariadb": test_mariadb,
    "bench": bench,
    "docs": docs,
    "typecheck": typecheck,
}


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
        print(__doc__)  # noqa: T201
        return 2
    try:
        return COMMANDS[sys.argv[1]](sys.argv[2:])
    except subprocess.CalledProcessError as exc:
        say(f"this step failed (exit {exc.returncode}): {' '.join(map(str, exc.cmd))}")
        return exc.returncode or 1


if __name__ == "__main__":
    sys.exit(main())
