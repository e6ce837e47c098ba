"""The project's files that are not Python but decide how a run starts: the shell scripts that launch it
(`torchrun --master_port 12345 train.py`, `export MASTER_PORT=29500` sourced by a SLURM job) and the JSON
configs a script reads its rendezvous address from. Chapter 09's port rule asks both."""

from __future__ import annotations

import re
from pathlib import Path

from .files import project_files, shell_scripts
from .registry import Finding

# `--master_port 12345`, `--master-port=29500`, `MASTER_PORT=29500` or `export MASTER_PORT="8787"` (MT-DNN's,
# exported or inline, quoted or not; DiffCardGCN's bash array `"--master_port" "7500"`); not `$PORT`, not
# `${MASTER_PORT:-29500}` (a fallback the environment overrides)
FIXED_PORT = re.compile(r"(--master[_-]port[\"']?[= ]+|\bMASTER_PORT=)[\"']?(\d{2,5})\b", re.I)  # (Guyu's
# `--MASTER_PORT 28512`, an option of its own script that it writes into MASTER_PORT) ... or torchrun's c10d
# rendezvous at a fixed address (CosyVoice's `--rdzv_endpoint="localhost:1234"`)
FIXED_ENDPOINT = re.compile(r"(--rdzv[_-]endpoint[\"']?[= ]+)[\"']?[^:\s\"'$]+:(\d{2,5})\b")
# ... or an address with its port handed to the script's init_method (`--dist-url "tcp://127.0.0.1:1235"`, GLNet)
FIXED_URL = re.compile(r"(--(?:dist[_-]url|init[_-]method)[\"']?[= ]+)[\"']?tcp://[^:\s\"']+:(\d{2,5})\b")


# `--master_port=${PORT}` or `--master_port $PORT`, and `PORT=9996` (a constant, no `${PORT:-...}` fallback)
VARIABLE_PORT = re.compile(r"(--master[_-]port[= ]+)\$(?:\{(\w+)\}|(\w+))")
PORT_VARIABLE = re.compile(r"^\s*(?:export\s+)?(\w+)=[\"']?(\d{2,5})[\"']?\s*(?:#.*)?$")
# `PORT=${3:-29000}`: a fallback for the script's third argument, not for the environment: a command that passes
# two arguments (STEERER's README: `sh train.sh CONFIG GPUS`) rendezvouses on the fixed port
POSITIONAL_PORT = re.compile(r"^\s*(?:export\s+)?(\w+)=[\"']?\$\{\d:-(\d{2,5})\}[\"']?\s*(?:#.*)?$")
# ... or a URL variable built with a fixed port (SSL4EO-S12's `dist_url+=:40000`), then `--dist-url $dist_url`
URL_VARIABLE = re.compile(r"^\s*(?:export\s+)?(\w*(?:url|addr|endpoint|init)\w*)\+?=[\"']?[^\s\"'#]*:(\d{2,5})[\"']?\s*"
                          r"(?:#.*)?$", re.I)
VARIABLE_URL = re.compile(r"(--(?:dist[_-]url|init[_-]method)[= ]+)[\"']?\$(?:\{(\w+)\}|(\w+))")


def fixed_ports_in_launch_scripts(root: Path, url_sites: tuple = ()) -> list[Finding]:
    """A fixed rendezvous port in a shell script of the project: every run launched by that script, on a host
    where another job (or a stale one) holds the port, fails to rendezvous. `url_sites`: (path, line) of the
    init_process_group calls that take the address a `--dist-url` hands in, named as related places."""
    found = []
    for path in shell_scripts(root):
        try:
            lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            continue
        # `PORT=9996` set in the script, then `--master_port=${PORT}` (YouReID's cmd.sh): the variable is the port
        fixed = {v.group(1): v.group(2) for v in [*map(PORT_VARIABLE.match, lines), *map(POSITIONAL_PORT.match, lines)]
                 if v is not None}
        urls = {v.group(1): v.group(2) for v in map(URL_VARIABLE.match, lines) if v is not None}
        for i, line in enumerate(lines, 1):
            code = re.sub(r"(^|\s)#.*$", "", line)  # a comment, not `${#gpu_ids[@]}` (Copy-is-all-you-need's)
            hit = FIXED_PORT.search(code) or FIXED_URL.search(code) or FIXED_ENDPOINT.search(code)
            via = VARIABLE_PORT.search(code)
            name = via.group(2) or via.group(3) if via is not None else None
            if hit is None and name in fixed:
                hit = via
            url = VARIABLE_URL.search(code)
            if hit is None and url is not None and (url.group(2) or url.group(3)) in urls:
                hit = via = url
                name = url.group(2) or url.group(3)
                fixed = {**fixed, name: urls[name]}
            if hit is not None and hit.re is FIXED_PORT and hit.group(1).startswith("--") and _handed_to_a_script(
                    lines, i, hit.start()) and not _reads_a_port_option(root):
                continue  # (Segmentation Benchmark's `torchrun ... train.py ... --master_port 47720`: an option of a
                # script that has none, so no rendezvous port; Guyu's script reads its --MASTER_PORT, a fixed port)
            if hit is not None and hit.re is FIXED_URL and (script := _script_of(lines, i, hit.start())) \
                    and _rendezvous_on_env(root, script):
                continue  # (a MoCo fork's `--dist-url tcp://localhost:10001` to a script whose init_process_group
                # takes "env://": the option is never read there; its sibling script, which reads it, is judged apart)
            if hit is None or re.search(r"--standalone\b", code) and hit.re is not FIXED_URL:
                continue  # (torchrun --standalone rendezvouses on localhost:0, a free port: its --master_port is
                # never used, torch/distributed/run.py's get_rdzv_endpoint; MeanFlow's scripts)
            text = "`" + re.sub(r"[\"']", "", hit.group(0).strip()) + "`"  # (MT-DNN's quotes left out)
            text += f" ({name}={fixed[name]} above)" if hit is via else ""
            found.append(Finding(i, "hard-coded-master-port", (
                f"{text} in this launch script fixes the rendezvous port: a second job on this "
                "host (or a stale one) collides on the port — torchrun --standalone, or "
                "--master_port=${MASTER_PORT:-29500} so the environment can choose"), "check-by-hand", str(path),
                url_sites[:3] if hit.re is FIXED_URL else ()))
            break  # one finding per script: its port is one choice
    return found


def _handed_to_a_script(lines: list[str], i: int, col: int) -> bool:
    """The option at line i (1-based), column col, comes after a `.py` script in its command (continued lines
    joined): an argument of the script, not of the launcher."""
    start = i - 1
    while start > 0 and lines[start - 1].rstrip().endswith("\\") and not lines[start - 1].lstrip().startswith("#"):
        # (not a commented-out command above that ends in a backslash too: RoboFlamingo's launch script)
        start -= 1
    before = " ".join(lines[start:i - 1]) + " " + lines[i - 1][:col]
    return re.search(r"\S+\.py\b", before) is not None


def _rendezvous_on_env(root: Path, script: str) -> bool:
    """The script the command runs sets up its group on `init_method="env://"` itself, whatever --dist-url says."""
    found = [p for p in project_files(root, ".py") if p.name == Path(script).name]
    return len(found) == 1 and re.search(r"init_process_group\([^)]*init_method\s*=\s*[\"']env://", found[0].read_text(
        encoding="utf-8", errors="replace")) is not None


def _script_of(lines: list[str], i: int, col: int) -> str | None:
    """The `.py` script the command around line i (1-based) runs, before column col (continued lines joined)."""
    start = i - 1
    while start > 0 and lines[start - 1].rstrip().endswith("\\") and not lines[start - 1].lstrip().startswith("#"):
        start -= 1
    found = re.findall(r"(\S+\.py)\b", " ".join(lines[start:i - 1]) + " " + lines[i - 1][:col])
    return found[-1] if found else None


def _reads_a_port_option(root: Path) -> bool:
    """Some Python file of the project names a master-port option (`--master_port`, `args.MASTER_PORT`)."""
    return any(re.search(r"master[_-]port", p.read_text(encoding="utf-8", errors="replace"), re.I)
               for p in project_files(root, ".py"))
