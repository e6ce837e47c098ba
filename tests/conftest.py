"""Fixtures every test folder shares, and the `slow` mark's rule.

The tests live in one folder per layer (core/, analysis/, launch/, lessons/, notebooks/, cli/, contracts/:
docs/design.md "Tests"). This folder stays on sys.path (pytest puts a conftest's folder there), so
`from processes import ...` (tests/processes.py) works from any of them.

`slow`: a test that starts processes (ranks, a training run, a Python interpreter, a notebook kernel) or takes over
about 2 s. `pytest tests -m "not slow"` (`make test-fast`) is the rest, under a minute on the 2-core CI box. A file
whose tests are all slow says so once (`pytestmark = pytest.mark.slow`); SLOW_FILES are whole files marked here
instead, because their contents are being changed on other branches (move the mark into them when those land)."""

import hashlib
import os
from pathlib import Path

import pytest

SLOW_FILES = {"core/test_fsdp2.py", "analysis/test_port_bugs.py"}  # every test of each reads real runs


@pytest.fixture
def runs_dir(tmp_path, monkeypatch):
    """Each test's runs go to its own folder (runfiles.runs_dir reads LAB_RUNS_DIR at call time)."""
    d = tmp_path / "runs"
    monkeypatch.setenv("LAB_RUNS_DIR", str(d))
    return d


@pytest.fixture(scope="session")
def shared_run(tmp_path_factory):
    """shared_run(nproc, keys[, script]) -> RunResult: one real launch per session for each distinct (script,
    nproc, keys), so tests that need the very same run read one (test_launcher's plain 2-rank run is
    test_multinode's standalone reference). Only for runs that tests read and never change; a test comparing
    two runs passes different keys, so it never compares a run with itself."""
    from lab_utils.core import config
    from lab_utils.launch import launcher

    root = tmp_path_factory.mktemp("shared_runs")
    cache = {}

    def run(nproc: int, keys, script=launcher.TRAIN):
        given = config.parse_overrides(keys)
        key = (str(script), nproc, tuple(sorted((k, repr(v)) for k, v in given.items())))
        if key not in cache:
            name = f"shared_n{nproc}_{hashlib.sha256(repr(key).encode()).hexdigest()[:10]}"
            cache[key] = launcher.launch(launcher.request(name, nproc, given, timeout=300, progress=False,
                                                          runs_dir=root,
                                                          script=script))
        return cache[key]

    return run


def pytest_configure(config):
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    for item in items:
        path = item.path
        if path.is_relative_to(here) and path.relative_to(here).as_posix() in SLOW_FILES:
            item.add_marker(pytest.mark.slow)
