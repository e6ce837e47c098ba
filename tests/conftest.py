import hashlib
import os

import pytest


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
            cache[key] = launcher.launch(name, nproc, given, timeout=300, progress=False, runs_dir=root,
                                         script=script)
        return cache[key]

    return run


def pytest_configure(config):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
