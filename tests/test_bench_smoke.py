"""The benchmark suite stays runnable: CI runs its quick version (it is not a timed test)."""

import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT


@pytest.mark.postgres
@pytest.mark.slow
def test_quick_benchmark_runs_and_prints_its_table():
    env = {**os.environ, "BENCH_DB": f"{os.environ.get('JOBS_TEST_DB', 'django_jobs')}_bench"}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "run.py"), "--quick"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    table = out.stdout.split("| figure |", 1)[1]
    for figure in (
        "E1 ",
        "E2 ",
        "D1 ",
        "WF ",
        "D2 ",
        "D2X ",  # the second PostgreSQL server, as the several-databases tests need
        "D1X ",
        "RP ",
        "L1 ",
        "IDLE ",
        "SCALE ",
        "MEM ",
        "PGB ",
    ):
        assert f"| {figure}" in table, figure
