#!/usr/bin/env python3
"""Set up and run django-jobs' development tasks with any python3.

    python3 dev.py demo     # install, then watch the example project work (SQLite)
    python3 dev.py test     # install, then run the test suite (PostgreSQL, then SQLite)
    python3 dev.py bench    # install, then run the benchmarks (PostgreSQL)

It finds a Python >= 3.12 (Django 6 needs it) even when `python3` is older,
makes .venv with it, and installs the project there. Set PYTHON=/path/to/python
to choose the interpreter yourself.
"""

from __future__ import annotations

import glob
import hashlib
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET  # noqa: N817, S405 - our own pytest report

ROOT = os.path.dirname(os.path.abspath(__file__))
VENV = os.path.join(ROOT, ".venv")
MINIMUM = (3, 12)


def say(message: str) -> None:
    print(f"dev.py: {message}", flush=True)  # noqa: T201


def version_of(python: str) -> tuple[int, int] | None:
    try:
        out = subprocess.run(
            [python, "-c", "import sys; print(*sys.version_info[:2])"],
            capture_output=True, text=True, timeout=20, check=True,
        ).stdout  # fmt: skip
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


def venv_python() -> str:
    return os.path.join(VENV, "bin", "python")


def ensure_venv(extras: str) -> str:
    """Create .venv with a suitable Python; install the project (once per change of pyproject)."""
    python = venv_python()
    if os.path.exists(python) and (version_of(python) or (0, 0)) < MINIMUM:
        say(f"{VENV} was made with an older Python; rebuilding it")
        shutil.rmtree(VENV)
    if not os.path.exists(python):
        base = find_python()
        say(f"creating {VENV} with {base}")
        subprocess.run([base, "-m", "venv", VENV], check=True)
        subprocess.run([python, "-m", "pip", "install", "--quiet", "--upgrade", "pip"], check=True)
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        stamp = hashlib.sha256(f.read() + extras.encode()).hexdigest()
    stamp_file = os.path.join(VENV, f".installed-{extras or 'base'}")
    if not os.path.exists(stamp_file) or open(stamp_file).read() != stamp:
        say(f"installing django-jobs{' with ' + extras if extras else ''} into {VENV}")
        command = [python, "-m", "pip", "install", "--quiet", "-e", ROOT]
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
    return subprocess.run([python, "-c", check], capture_output=True, check=False).returncode == 0


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
    base_env = dict(os.environ)
    if ensure_browser() or os.environ.get("CI"):
        # The browser test then fails, rather than skips, without a browser.
        base_env["JOBS_REQUIRE_BROWSER"] = "1"
    env = {**base_env, "TEST_DB": "postgres"}
    say("running the tests on PostgreSQL")
    code, skipped = pytest_run(python, env, args, os.path.join(ROOT, "reports", "postgres.xml"))
    if code:
        return code
    postgres_skips = [s for s in skipped if "postgres" in s.lower()]
    if postgres_skips:
        say(
            "PostgreSQL tests were skipped on the PostgreSQL run:\n  " + "\n  ".join(postgres_skips)
        )
        return 1
    say("running the tests on SQLite")
    env = {**base_env, "TEST_DB": "sqlite"}
    code, _ = pytest_run(python, env, args, os.path.join(ROOT, "reports", "sqlite.xml"))
    return code


def bench(args: list[str]) -> int:
    python = ensure_venv("test")
    return subprocess.run(
        [python, os.path.join(ROOT, "bench", "run.py"), *args], cwd=ROOT, check=False
    ).returncode


COMMANDS = {"demo": demo, "test": test, "bench": bench}


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
