"""`ddp-lab` (= `python -m lab_utils`): preflight, run, keys, compare, doctor, audit, notebooks, demo, bench.

Bad input is reported on one line naming the key or value, with exit code 2 and no traceback.
"""

from __future__ import annotations

import argparse
import sys

from lab_utils.core.config import ConfigError


def _cmd_preflight(args) -> int:
    from lab_utils.launch import preflight

    ok, _ = preflight.run(nproc=args.nproc, timeout=args.timeout)
    return 0 if ok else 1


def _cmd_run(args) -> int:
    from lab_utils.launch import launcher, start_plan

    if not args.twin:  # one launch: a launch zygote would cost its start and serve nothing (docs/design.md)
        start_plan.launches_once()
    if args.twin:  # refuse bad keys for the twin too, before anything is launched
        from lab_utils.launch import twins

        twins.twin_keys(args.overrides, args.nproc)
    request = launcher.request(args.name, args.nproc, args.overrides, timeout=args.timeout,
                               progress=not args.quiet, echo=args.echo, nnodes=args.nnodes)
    result = launcher.launch(request)
    print(result)
    if result.command:
        print(f"$ {result.command_line}")  # the plain torchrun (or python) line this run is equivalent to
    if result.ok:
        print(f"wrote {result.run_dir}/ (config.json, metrics.jsonl, model.pt, logs/)")
    if result.ok and args.twin:
        twin = twins.launch_twin(request)
        print(twin)
        if twin.command:
            print(f"$ {twin.command_line}")
        if not twin.ok:
            return 1
        print(f"float twin: {twin.run_dir}/ — judge a port of {args.name} against it: "
              f"ddp-lab compare {args.name} PORT --noise auto")
    return 0 if result.ok else 1


def _replay(args):
    """(replay, twin) of A's program from B's window states, or None (--windows off, or why not, on stderr).
    `--replay R T`: the two folders given (record.replay made them for your own script); FileNotFoundError
    names one that is not a run folder."""
    from lab_utils.analysis import parity

    if args.replay:
        if args.windows == "off":
            raise ValueError("--replay judges RUN_B's windows, --windows off judges none: give one of them")
        try:
            return tuple(parity.resolve_run(p) for p in args.replay)
        except FileNotFoundError as e:
            raise FileNotFoundError(f"--replay: {e}") from None
    if args.windows == "off":
        return None
    from lab_utils.launch import replay

    try:
        return replay.ensure(parity.resolve_run(args.run_a), parity.resolve_run(args.run_b), progress=not args.json)
    except FileNotFoundError:
        return None  # the command itself names the missing folder
    except replay.NoReplay as e:
        print(f"windows: not replayed: {e}", file=sys.stderr)
        return None


def _cmd_compare(args) -> int:
    from lab_utils.analysis import parity

    given = {"loss_tol": args.loss_tol, "param_tol": args.param_tol, "output_tol": args.output_tol}
    try:
        report = parity.compare(args.run_a, args.run_b, noise_runs=args.noise, replay=_replay(args),
                                **{k: v for k, v in given.items() if v is not None})
    except (FileNotFoundError, ValueError) as e:
        print(f"ddp-lab compare: error: {e}", file=sys.stderr)
        return 2
    print(report.to_json() if args.json else report.format())
    if not args.json and report.steps_compared > 1:
        print(report.divergence_table())
    return 0


def _cmd_doctor(args) -> int:
    """Exit 0: no bug (tier 2 or 3); 1: the runs differ below tier 2 (causes listed); 2: a bad run folder or
    twin; 3: not calibrated — past the fixed tolerances with only float order to blame (give --noise)."""
    import json

    from lab_utils.analysis import doctor

    try:
        diagnosis = doctor.diagnose_runs(args.run_a, args.run_b, noise_runs=args.noise, replay=_replay(args))
        if args.ops_traces:  # a recorded script's step, traced by the script itself (core/op_record.py)
            doctor.add_recorded_ops(diagnosis, *args.ops_traces)
        elif args.ops:  # the first step outside float noise, replayed op by op in this process (core/op_trace.py)
            from lab_utils.core import op_trace

            doctor.add_ops(diagnosis, op_trace.trace, op_trace.OpsUnsupported)
    except (doctor.RunFolderError, ValueError, FileNotFoundError) as e:
        print(f"ddp-lab doctor: error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(diagnosis.to_dict(), sort_keys=True) if args.json else diagnosis.format())
    return diagnosis.exit_code


def _cmd_audit(args) -> int:
    """Exit 0: no finding; 1: findings; 2: a path that cannot be audited (missing, not Python). The paths are one
    project: imports between them (and inside their folder) are followed."""
    from lab_utils.analysis import audit

    skipped: list[str] = []
    try:
        findings = audit.audit_paths(args.scripts, skipped)
    except audit.AuditError as e:
        print(f"ddp-lab audit: error: {e}", file=sys.stderr)
        return 2
    for reason in skipped:  # (a file in the folder that does not parse: the rest is audited, this one is not)
        print(f"ddp-lab audit: warning: not audited: {reason}", file=sys.stderr)
    if args.json:
        print(audit.to_json(findings))
    elif args.sarif:
        print(audit.to_sarif(findings))
    else:
        print(audit.format_findings(findings, args.scripts[0] if len(args.scripts) == 1 else None))
        if skipped:  # the summary line says so too: "no findings" is about the files that were read
            print(f"{len(skipped)} file(s) not audited (not Python): see the warnings")
    return 1 if findings else 0


def _cmd_notebooks(args) -> int:
    from lab_utils import nbbuild

    ok = nbbuild.run_all(args.pattern, out_dir=args.out, timeout=args.timeout)
    return 0 if ok else 1


def _allowed(key) -> str:
    """A key's allowed values in one short phrase: choices, a range, or what an unset value means."""
    if key.choices:
        return " | ".join(key.choices)
    if key.type is bool:
        return "true | false"
    parts = []
    if key.min is not None and key.max is not None:
        parts.append(f"[{key.min}, {key.max}{')' if key.max_open else ']'}")
    elif key.min is not None:
        parts.append(f">= {key.min}")
    elif key.max is not None:
        parts.append(f"{'<' if key.max_open else '<='} {key.max}")
    if key.optional:
        parts.append("or none (derived)")
    return " ".join(parts) or "any"


def keys_table() -> str:
    """Every key of config.KEYS with type, default, allowed values and help, under its group's title."""
    from lab_utils.core.config import KEYS, grouped

    lines = []
    width = max(map(len, KEYS))
    for title, names in grouped().items():
        lines += ["", f"# {title}"] if lines else [f"# {title}"]
        for name in names:
            k = KEYS[name]
            default = "none" if k.default is None else str(k.default).lower() if k.type is bool else str(k.default)
            lines.append(f"{name:<{width}}  {k.type.__name__:<5}  default {default:<12}  {_allowed(k)}")
            lines.append(f"{'':<{width}}  {k.help}")
    return "\n".join(lines)


def _cmd_keys(args) -> int:
    print("keys for `ddp-lab run ... key=value` and scripts/train.py (lab_utils/core/config.py):\n")
    print(keys_table())
    return 0


BENCHES = {"launch": "launch reliability and overhead", "samplers": "DistributedSampler vs GlobalBatchSampler",
           "scaling": "tokens/s, 1 vs 2 GPUs", "profile": "host vs device time per step, launches, top ops",
           "hook": "order-fixed gradient reduction vs stock all-reduce: time, bytes, tier",
           "fsdp2": "FSDP2 vs DDP, stock and ordered: time, bytes received, state held per rank, tier",
           "portbugs": "the port-bug suite at GPT 4x256 x 150 steps, judged against float twins",
           "noise": "where the float-noise margin comes from: the committed measurements, in envelopes",
           "late": "bugs that start late: the whole-run envelope vs the windows, and the replay's cost",
           "ops": "doctor --ops over the port-bug suite: the first operation where each port parts",
           "speed": "after parity: compile, TF32, fused AdamW, buckets, overlap: ms/step, speed-up, tier vs eager",
           "audit": "ddp-lab audit's time per project on the corpus and held-out copies, slowest first"}


def _cmd_bench(args) -> int:
    import importlib

    return importlib.import_module(f"lab_utils.drivers.bench_{args.which}").main(args.rest)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be >= 1")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{value} must be > 0")
    return value


class _Parser(argparse.ArgumentParser):
    """One line on bad input (the usage block is one `--help` away), exit code 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _add_noise(s: argparse.ArgumentParser) -> None:
    s.add_argument("--noise", action="append", metavar="TWIN",
                   help="a float twin of RUN_A (repeatable; `auto`: the runs named RUN_A-twin-*): tier 2 is then "
                        "judged against the twins' float-noise envelope instead of fixed tolerances")
    s.add_argument("--windows", choices=("auto", "off"), default="auto",
                   help="auto (default): when RUN_B holds window states (window_every), replay RUN_A's program from "
                        "each of them with a float twin (cached in RUN_B/replays/) and judge every window against "
                        "it, so a bug that starts late is caught; off: the whole-run envelope only (steps past its "
                        "blind step are then 'not judged')")
    s.add_argument("--replay", nargs=2, metavar=("REPLAY", "TWIN"),
                   help="judge RUN_B's windows against these two run folders instead of launching replays: RUN_A's "
                        "program replayed from RUN_B's window states and its float twin (record.replay, micro=1 "
                        "and micro=2, for a script of your own)")


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="ddp-lab", description="DDP Parity Lab: single-GPU vs DDP, measured.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    s = sub.add_parser("preflight", help="versions, GPUs, backend auto-pick, and a real 2-rank all-reduce")
    s.add_argument("--nproc", type=_positive_int, default=2)
    s.add_argument("--timeout", type=_positive_float, default=120)
    s.set_defaults(func=_cmd_preflight)

    s = sub.add_parser("run", help="train: nproc 1 = plain python, >= 2 = torchrun --standalone",
                       epilog="key=value: `ddp-lab keys` lists every key with its type, default, allowed values "
                              "and meaning.")
    s.add_argument("--name", required=True, help="run folder: runs/NAME")
    s.add_argument("--nproc", type=_positive_int, default=1)
    s.add_argument("--nnodes", type=_positive_int, default=1,
                   help="simulate this many nodes on this box (c10d rendezvous on 127.0.0.1; chapter 09)")
    s.add_argument("--timeout", type=_positive_float, default=600, help="seconds before the run is a hang")
    s.add_argument("--echo", action="store_true", help="stream the job's output")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    s.add_argument("--twin", action="store_true",
                   help="then run its float twin as NAME-twin-* (another float order, the same samples and "
                        "randomness): what `compare A B --noise auto` judges a port of NAME against")
    s.add_argument("overrides", nargs="*", metavar="key=value")
    s.set_defaults(func=_cmd_run)

    s = sub.add_parser("keys", help="every key=value `run` accepts: type, default, allowed values, meaning")
    s.set_defaults(func=_cmd_keys)

    s = sub.add_parser("compare", help="the parity report of two runs (tier 3/2/1/0)")
    s.add_argument("run_a")
    s.add_argument("run_b")
    s.add_argument("--json", action="store_true")
    s.add_argument("--loss-tol", type=_positive_float, help="tier 2: max |Δloss| per step (default: per workload)")
    s.add_argument("--param-tol", type=_positive_float, help="tier 2: max |Δparam| (default: per workload)")
    s.add_argument("--output-tol", type=_positive_float, help="tier 2: max |Δoutput| (default: per workload)")
    _add_noise(s)
    s.set_defaults(func=_cmd_compare)

    s = sub.add_parser("doctor", help="where two runs part and why: first diverging step, causes ranked with "
                                      "evidence (exit 0 no bug, 1 bug, 2 bad folder, 3 not calibrated or not judged)")
    s.add_argument("run_a")
    s.add_argument("run_b")
    s.add_argument("--json", action="store_true")
    s.add_argument("--ops", action="store_true",
                   help="replay the first step outside float noise for A's program and B's (B's ranks emulated) "
                        "from B's state before it (a window state or checkpoint of RUN_B) and name the first "
                        "operation outside float noise: data, forward (module), backward, reduction or optimizer")
    s.add_argument("--ops-traces", nargs=2, metavar=("TRACE_A", "TRACE_B"),
                   help="--ops for your own recorded script: the folders its trace runs wrote (replay_from=RUN_B "
                        "trace_step=S, B's program first, then A's with trace_state=TRACE_B; "
                        "lab_utils/core/op_record.py)")
    _add_noise(s)
    s.set_defaults(func=_cmd_doctor)

    s = sub.add_parser("audit", help="static check of a DDP script or project (files or folders, imports "
                                     "followed) against the corrected checklist (exit 0 clean, 1 findings, 2 bad path)")
    s.add_argument("scripts", nargs="+", metavar="PATH", help="a .py file or a folder")
    fmt = s.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="one object per finding: file, line, rule, severity, "
                                                         "message, chapter")
    fmt.add_argument("--sarif", action="store_true", help="SARIF 2.1.0 (code-scanning tools)")
    s.set_defaults(func=_cmd_audit)

    s = sub.add_parser("notebooks", help="execute every notebook headless into build/ with an HTML index")
    s.add_argument("--pattern", default="notebooks/[0-9]*.ipynb")
    s.add_argument("--out", default="build")
    s.add_argument("--timeout", type=_positive_float, default=900, help="seconds per cell")
    s.set_defaults(func=_cmd_notebooks)

    # listed for --help only: main() hands `demo ...` to the demo before this parser sees it
    sub.add_parser("demo", help="the headline demo: single vs 2 ranks vs naive vs emulated, compared",
                   add_help=False)

    s = sub.add_parser("bench", help="benchmarks that print a table: " + ", ".join(BENCHES))
    s.add_argument("which", choices=sorted(BENCHES), help="; ".join(f"{k}: {v}" for k, v in BENCHES.items()))
    s.add_argument("rest", nargs=argparse.REMAINDER, help="the bench's own options (ddp-lab bench NAME --help)")
    s.set_defaults(func=_cmd_bench)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["demo"]:  # its options are the demo's own (argparse's REMAINDER cannot start with --x)
        from lab_utils.drivers import demo

        return demo.main(argv[1:])
    args = parser().parse_args(argv)
    try:
        return args.func(args)
    except (ConfigError, FileNotFoundError) as e:
        print(f"ddp-lab {args.command}: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `ddp-lab keys | head`: the reader left; not an error of ours
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        print(f"ddp-lab {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
