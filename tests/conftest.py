import os

import pytest


@pytest.fixture
def runs_dir(tmp_path, monkeypatch):
    """Each test's runs go to its own folder (runfiles.runs_dir reads LAB_RUNS_DIR at call time)."""
    d = tmp_path / "runs"
    monkeypatch.setenv("LAB_RUNS_DIR", str(d))
    return d


def pytest_configure(config):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
