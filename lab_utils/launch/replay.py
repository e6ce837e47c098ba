"""Replays of run A's program from run B's window states, for `ddp-lab compare` and `doctor` (no blind zone).

What a replay is: lab_utils/core/windows.py; how B is judged against it: lab_utils/analysis/windows.py. This
module launches the two runs the judgement needs, in one process each: A's keys with `replay_from=B` (A's
world size emulated, `emulate_ranks=W`, when A ran on W ranks) and the float twin the lab makes for those keys
(float_twin.twin_of), set to B's state at the same steps. They live in B/replays/A and B/replays/A-twin-SUFFIX
and are reused while A's keys and B's window states are unchanged (replay.json holds what they were made from).

Launch side: imports core/ and launch/ only; reads config.json as plain JSON.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from lab_utils.core import config as config_mod
from lab_utils.core import float_twin, runfiles, windows
from lab_utils.launch import launcher

# A's keys that a replay does not take: where it writes, how A itself was started, stopped or saved.
NOT_REPLAYED = {"out_dir", "resume", "replay_from", "fault", "fault_rank", "fault_step", "window_every",
                "checkpoint_every", "checkpoint_write", "checkpoint_style"}
STAMP = "replay.json"


class NoReplay(Exception):
    """Why A's program cannot be replayed from B's states (the report then leaves later steps not judged)."""


def replay_keys(config_a: dict) -> dict:
    """A's keys for a one-process replay: A's config.json keys, less NOT_REPLAYED, with A's world size emulated."""
    keys = dict(config_a.get("config") or {})
    unknown = sorted(set(keys) - set(config_mod.KEYS))
    if not keys or unknown:
        raise NoReplay("A is not a run of scripts/train.py (its config.json holds no lab keys"
                       + (f"; unknown: {', '.join(unknown[:5])}" if unknown else "") + ")")
    world = int(config_a.get("world_size") or 1)
    keys = {k: v for k, v in keys.items() if v is not None and k not in NOT_REPLAYED}
    if world > 1:
        keys["emulate_ranks"] = world  # A's program at one process: its ranks emulated (tier 3 for ordered/tree)
    keys["window_every"] = 0
    return keys


def _stamp(a: Path, keys: dict, b: Path) -> str:
    held = [(s, windows.state_path(b, s).stat().st_size, windows.state_path(b, s).stat().st_mtime_ns)
            for s in windows.steps(b)]
    return hashlib.sha256(json.dumps([str(a), keys, held], sort_keys=True, default=str).encode()).hexdigest()


def _fresh(folder: Path, stamp: str) -> bool:
    try:
        return (json.loads((folder / STAMP).read_text()).get("stamp") == stamp
                and (folder / runfiles.RESULT).exists())
    except (OSError, ValueError):
        return False


def ensure(run_a: Path, run_b: Path, timeout: float = 1800, progress: bool = True) -> tuple[Path, Path]:
    """(replay, twin) folders of A's program from B's window states, launched unless cached; NoReplay says why
    not (B holds no window states, A is not a lab run, a launch failed)."""
    run_a, run_b = Path(run_a), Path(run_b)
    if not windows.steps(run_b):
        raise NoReplay(f"{run_b.name} holds no window states ({runfiles.WINDOWS}/: a run with window_every=0, or "
                       f"older than them)")
    config_a = json.loads((run_a / runfiles.CONFIG).read_text()) if (run_a / runfiles.CONFIG).exists() else {}
    keys = replay_keys(config_a)
    keys["replay_from"] = str(run_b.resolve())
    try:
        suffix, twin = float_twin.twin_of(keys, config_mod.resolve(keys, world_size=1))
    except config_mod.ConfigError as e:
        raise NoReplay(f"A's keys do not make a replay here: {e}") from None
    where = run_b / runfiles.REPLAYS
    names = (run_a.name, f"{run_a.name}{float_twin.SEPARATOR}{suffix}")
    stamp = _stamp(run_a, keys, run_b)
    todo = {n: launcher.request(n, 1, k, timeout=timeout, runs_dir=where)
            for n, k in zip(names, (keys, twin), strict=True) if not _fresh(where / n, stamp)}
    if todo:
        if progress:
            print(f"replaying {run_a.name}'s program from {len(windows.steps(run_b))} window states of "
                  f"{run_b.name} (and its float twin) into {where}/", flush=True)
        results = launcher.launch_many(todo, max_workers=2)
        failed = [r for r in results.values() if not r.ok]
        if failed:
            raise NoReplay(f"the replay {failed[0].name} failed: {failed[0].message}")
        for n in todo:
            runfiles.write_json({"stamp": stamp, "a": str(run_a), "b": str(run_b)}, where / n / STAMP)
    return where / names[0], where / names[1]
