"""scripts/pip_install.py hands uv what pip would use (set-up on a box whose wheels lie on its disk must keep
finding them), and keeps pip for a venv that sees a system torch (set-up never replaces a CUDA torch)."""

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("pip_install", REPO / "scripts" / "pip_install.py")
pip_install = importlib.util.module_from_spec(spec)
spec.loader.exec_module(pip_install)


def test_uv_gets_pips_indexes_and_existing_find_links_and_constraints(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    caps = tmp_path / "constraints.txt"
    caps.write_text("torch<=2.14.1\n")
    args = pip_install.uv_arguments({"find-links": [str(wheels), str(tmp_path / "gone")],
                                     "extra-index-url": ["file:///opt/a/simple", "file:///opt/b/simple"],
                                     "constraint": [str(caps), str(tmp_path / "no.txt")]})
    assert args[:2] == ["--index-strategy", "unsafe-best-match"]  # pip's rule: the best version from any index
    pairs = list(zip(args[2::2], args[3::2], strict=True))
    assert ("--find-links", str(wheels)) in pairs
    assert ("--extra-index-url", "file:///opt/a/simple") in pairs
    assert ("--extra-index-url", "file:///opt/b/simple") in pairs
    assert ("--constraint", str(caps)) in pairs
    assert all("gone" not in v and "no.txt" not in v for _, v in pairs)  # pip warns and goes on; uv would stop


def test_pip_environment_variables_override_its_config(monkeypatch):
    monkeypatch.setenv("PIP_FIND_LINKS", "/x /y")
    monkeypatch.setenv("PIP_INDEX_URL", "https://example.invalid/simple")
    found = pip_install.pip_settings()
    assert found["find-links"] == ["/x", "/y"] and found["index-url"] == ["https://example.invalid/simple"]


def test_a_venv_with_system_site_packages_keeps_pip(tmp_path, monkeypatch):
    (tmp_path / "pyvenv.cfg").write_text("home = /usr/bin\ninclude-system-site-packages = true\n")
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    assert pip_install.sees_system_packages()
    (tmp_path / "pyvenv.cfg").write_text("home = /usr/bin\ninclude-system-site-packages = false\n")
    assert not pip_install.sees_system_packages()
