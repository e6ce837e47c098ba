""".github/workflows/ci.yml: a fork's GitHub Actions run the lab's own CI (`.ci/run`, which is `make test`)."""
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
WORKFLOW = REPO / ".github" / "workflows" / "ci.yml"


def _workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


def test_runs_on_push_and_pull_request():
    wf = _workflow()
    triggers = wf.get("on", wf.get(True))  # YAML 1.1 (PyYAML) reads the key `on` as True
    names = set(triggers) if isinstance(triggers, (dict, list)) else {triggers}
    assert {"push", "pull_request"} <= names, triggers


def test_a_job_runs_ci_run_on_ubuntu_with_python_311_and_cpu_torch():
    jobs = _workflow()["jobs"]
    found = []
    for name, job in jobs.items():
        steps = job.get("steps", [])
        runs = [s for s in steps if ".ci/run" in str(s.get("run", ""))]
        if not runs:
            continue
        found.append(name)
        assert "ubuntu" in str(job["runs-on"]), job["runs-on"]
        python = [s for s in steps if str(s.get("uses", "")).startswith("actions/setup-python@")]
        assert python and str(python[0]["with"]["python-version"]) == "3.11"
        assert any(str(s.get("uses", "")).startswith("actions/checkout@") for s in steps)
        env = {**job.get("env", {}), **runs[0].get("env", {})}
        # PyPI's Linux torch is the CUDA build: the Makefile's TORCH_PIP_ARGS must point pip at the CPU wheels.
        assert "/cpu" in env.get("TORCH_PIP_ARGS", ""), env
        assert Path(REPO / ".ci/run").exists()
    assert found, "no job has a step that runs .ci/run"


def test_ci_run_calls_make_test():
    lines = [ln.strip() for ln in (REPO / ".ci" / "run").read_text().splitlines()]
    assert "make test" in lines
