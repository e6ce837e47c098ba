"""What went wrong in a run, from its own files: who stalled (heartbeats), each rank's Python stack at a hang
(SIGUSR1 -> faulthandler), and which failed rank is the root cause (failures.json, merged across nodes).
Part of the launcher (lab_utils/launch/launcher.py); it reads run folders and signals ranks, it starts nothing.

Taught in notebooks/00_preflight.ipynb (failure reports) and notebooks/09_launching.ipynb (hang diagnosis).
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

from lab_utils.core import distenv, runfiles
from lab_utils.core.runfiles import read_heartbeats
from lab_utils.launch import elastic_driver

if TYPE_CHECKING:
    from lab_utils.launch.process_tree import ProcessTree
    from lab_utils.launch.run_result import RunResult

DUMP_WAIT = 1.5  # seconds for a SIGUSR1 stack dump to reach the rank's log before the rank is stopped


def stalled(run_dir: Path, stall_timeout: float | None, now: float, held_until: float | None = 0.0) -> bool:
    """True when some rank has written a heartbeat and no rank has written one for `stall_timeout` s: every rank
    is waiting (a hang), whatever the total run time. Before the first heartbeat (start-up on a busy box) only
    the overall timeout applies. held_until: the time a caller's hold was released (the stall counts from the
    later of it and the last heartbeat); None while the hold is on (never stalled then)."""
    if not stall_timeout or held_until is None:
        return False
    beats = read_heartbeats(run_dir)
    latest = max((b.get("time", 0) for b in beats.values()), default=None)
    done = beats and all(b.get("phase") == "finished" for b in beats.values())
    return latest is not None and not done and now - max(latest, held_until) > stall_timeout


def describe_hang(beats: dict[int, dict], nproc: int, alive: list[int] | None = None) -> tuple[str, int | None]:
    """Name the rank that fell behind: the others are waiting for it in a collective. alive: the ranks whose
    process was still there at the timeout (those with a stack dump); when every rank had reported 'finished',
    the one still alive hung at exit, after its work (chapter 06's probe: a destructor's deadlock, distenv.finish)."""
    if not beats:
        return "no rank reported any progress (stuck before set-up finished?)", None
    now = time.time()
    if len(beats) == nproc and all(b.get("phase") == "finished" for b in beats.values()) and alive:
        lines = [f"  rank {r}: finished, its process {'still running' if r in alive else 'gone'}"
                 for r in sorted(beats)]
        return (f"every rank reported finished, but rank {', '.join(map(str, alive))} did not exit: a hang at exit, "
                "after the work was done (its stack shows where)\n" + "\n".join(lines)), alive[0]
    lines, order = [], []
    for r in range(nproc):
        b = beats.get(r)
        if b is None:
            lines.append(f"  rank {r}: no heartbeat")
            order.append((-2, -1, r))
            continue
        lines.append(f"  rank {r}: step {b.get('step')} {b.get('phase')} ({now - b['time']:.0f} s ago)")
        order.append((b.get("step", -1), runfiles.phase_index(b.get("phase")), r))
    behind = min(order)
    suspect = behind[2] if len({o[:2] for o in order}) > 1 or nproc == 1 else None
    who = f"rank {suspect} is behind; the others wait for it in a collective" if suspect is not None \
        else "all ranks are at the same step (a collective mismatch, or a hang inside the step)"
    return who + "\n" + "\n".join(lines), suspect


def _rank_log(pid: int, run_dir: Path, beat: dict) -> tuple[int, Path] | None:
    """(global rank, the file its stderr goes to) of a worker: the rank and error file its heartbeat names
    (torch's agent puts the error file inside the rank's log folder), else its own environment (a heartbeat
    written before the error file was recorded); None if it is not a rank."""
    environ = {}
    if beat.get("error_file") is None:
        try:
            environ = psutil.Process(pid).environ()
        except psutil.Error:
            return None
        if "RANK" not in environ and "TORCHELASTIC_ERROR_FILE" not in environ:
            return None
    rank = int(beat.get("rank", environ.get("RANK", "0")))
    error_file = beat.get("error_file") or environ.get("TORCHELASTIC_ERROR_FILE")
    stderr = Path(error_file).with_name("stderr.log") if error_file else None
    # One process (or a rank started without per-rank logs): its stderr is the run's output.log.
    return rank, stderr if stderr is not None and stderr.exists() else run_dir / "output.log"


def dump_stacks(run_dir: Path, trees: list[ProcessTree], wait: float = DUMP_WAIT) -> dict[int, str]:
    """SIGUSR1 to every rank of the run (each registered a faulthandler dump in distenv.setup), then read what
    each wrote to its log: {rank: its threads' Python stacks}. Ranks are the processes whose pid a heartbeat
    names, so a process that never registered the handler (SIGUSR1 would kill it) is never signalled."""
    beats = read_heartbeats(run_dir)
    ours = {p.pid for tree in trees for p in tree.alive()}
    targets = {}
    for b in beats.values():
        pid = b.get("pid")
        if pid in ours and (found := _rank_log(pid, run_dir, b)) is not None:
            rank, log = found
            targets[rank] = (pid, log, log.stat().st_size if log.exists() else 0)
    for pid, _, _ in targets.values():
        try:
            os.kill(pid, distenv.STACK_DUMP_SIGNAL)
        except ProcessLookupError:
            pass
    if targets:
        time.sleep(wait)
    stacks = {}
    for rank, (_, log, offset) in sorted(targets.items()):
        try:
            with open(log, "rb") as f:
                f.seek(offset)
                text = f.read().decode(errors="replace")
        except OSError:
            continue
        if log.name == "output.log":  # shared by every rank: keep only this rank's dump
            text = "\n".join(line for line in text.splitlines()
                             if "thread 0x" in line.lower() or line.startswith("  File") or not line.strip())
        stacks[rank] = text
    return stacks


def read_failures(run_dir: Path) -> dict | None:
    """failures.json (written by the driver, or by us for one process): every failed rank and the root cause."""
    try:
        return json.loads((Path(run_dir) / elastic_driver.FAILURES).read_text())
    except (OSError, ValueError):
        return None


def _single_process_failures(run_dir: Path, pid: int, returncode: int) -> dict:
    """One process has no agent to report it: describe it the same way, from its error file and exit code."""
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    error_file = run_dir / "logs" / "0" / "error.json"
    return elastic_driver.write_failures(run_dir, {0: ProcessFailure(0, pid, returncode, str(error_file))})


def merge_node_failures(run_dir: Path) -> dict | None:
    """Every node's failures.node{k}.json into one failures.json, the root cause chosen across all nodes (the
    same rule as within one node: the rank whose own error started it, never a peer that lost its connection)."""
    records = []
    for path in sorted(Path(run_dir).glob("failures.node*.json")):
        try:
            records += json.loads(path.read_text())["failures"]
        except (OSError, ValueError, KeyError):
            continue
    if not records:
        return None
    doc = elastic_driver.failures_doc(records)
    runfiles.write_json(doc, Path(run_dir) / elastic_driver.FAILURES)
    return doc


def read_rendezvous_failures(run_dir: Path) -> list[dict]:
    """Every node's record of a rendezvous that never completed (elastic_driver.write_rendezvous_failure)."""
    docs = []
    for path in sorted(Path(run_dir).glob("rendezvous*.json")):
        try:
            docs.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return docs


def describe_rendezvous(docs: list[dict]) -> tuple[str, int | None]:
    """(message, the node that caused it). A node that could not reach the rendezvous (a connection error:
    a wrong address, a firewall) is the cause; a node that only timed out waiting for the others is its victim."""
    cause = next((d for d in docs if d["error"] != "RendezvousTimeoutError"), docs[0])
    lines = [f"  node {d['node']}{' (the cause)' if d is cause else ''}: {d['reason']}"
             for d in sorted(docs, key=lambda d: d["node"])]
    return "the rendezvous never completed; no rank started.\n" + "\n".join(lines), cause["node"]


def classify(result: RunResult, pid: int, timeout: float, signum: int | None,
             stall_timeout: float | None = None) -> None:
    """Fill in the message (and failing rank, traceback) from the run's own files."""
    if result.status == "hang":
        text, result.failing_rank = describe_hang(result.heartbeats, result.nproc * result.nnodes,
                                                  sorted(result.stacks))
        why = f"no exit after the {timeout:.0f} s timeout" if result.seconds > timeout or not stall_timeout \
            else f"no heartbeat from any rank for {stall_timeout:.0f} s"
        result.message = f"hang: {why}; every process was stopped.\n{text}"
    elif result.status == "interrupted":
        result.message = "interrupted; every process was stopped"
    elif result.status == "stopped":
        result.message = f"stopped by {signal.Signals(signum).name}; every process was stopped"
    elif result.returncode != 0:
        result.status = "crashed"
        doc = read_failures(result.run_dir)
        rendezvous = read_rendezvous_failures(result.run_dir)
        if doc is None and rendezvous:
            result.message, result.failing_node = describe_rendezvous(rendezvous)
            return
        if doc is None and result.nproc * result.nnodes == 1:
            doc = _single_process_failures(result.run_dir, pid, result.returncode)
        cause = next((f for f in (doc or {}).get("failures", []) if f["rank"] == doc.get("root_cause")), None)
        if cause is not None:
            result.failing_rank, result.message, result.traceback = cause["rank"], doc["reason"], cause["traceback"]
        if cause is None or not (cause["error_file"] or cause["signal"]):
            # No traceback, no signal (or the driver itself failed: bad arguments, rendezvous): the output says why
            output = (result.run_dir / "output.log").read_text(errors="replace")
            tail = "\n".join(output.strip().splitlines()[-15:])
            result.message = f"{result.message or f'exit code {result.returncode}'}; last output:\n{tail}"
