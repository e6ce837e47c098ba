"""The port-bug suite: every bug the series teaches is caught (below tier 2, right cause), every correct
port passes (tier >= 2), judged against the float twin of each single run (tier 2 = within its float-noise
envelope). Real 2-rank gloo runs through the launcher; the tables are lab_utils/portbugs.SUITE (DDP) and
FSDP2_SUITE (chapter 14: FSDP2's own bugs, its correct ports, and its ordered and tree reductions). The same table
at GPT 4x256 x 150 steps is `ddp-lab bench portbugs` (about 40 minutes on 2 cores: a benchmark, not a test).

Runs are shared between the parametrized cases (one module-wide runs folder, one run per distinct
(nproc, keys)), so e.g. the plain single run serves the doubled-batch bug and the plain port.
"""
import json
import math

import pytest

from lab_utils.analysis import doctor, parity, portbugs
from lab_utils.analysis.portbugs import FSDP2_SUITE, SUITE
from lab_utils.core import float_twin, runfiles
from lab_utils.launch import launcher

ALL = SUITE + FSDP2_SUITE


@pytest.fixture(scope="module")
def suite_runs(tmp_path_factory):
    """A runs folder for the whole module; `get(nproc, keys)` launches a run once and returns its folder."""
    root = tmp_path_factory.mktemp("port_bugs") / "runs"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LAB_RUNS_DIR", str(root))
        # Every distinct run up front, two at a time: a toy launch is mostly process start-up (python + torch
        # imports, single-threaded), so two overlapping launches keep both cores busy where one leaves ~1/4
        # idle. Overlap changes wall time only: each rank uses one thread and a fixed reduction order.
        needed = {portbugs.run_name(nproc, keys): (nproc, keys) for nproc, keys in portbugs.runs_needed(ALL).values()}
        specs = {name: (name, nproc, list(keys)) for name, (nproc, keys) in needed.items()}
        launcher.launch_many(launcher.requests_from_specs(specs, timeout=600), max_workers=2, raise_on_failure=True)

        def get(nproc, keys):
            name = portbugs.run_name(nproc, keys)
            if not (root / name / "result.json").exists():
                launcher.launch(launcher.request(name, nproc, list(keys), timeout=600,
                                                 progress=False)).raise_for_status()
            return root / name

        yield get


def twin_of(bug, suite_runs):
    """The float twin of the bug's single run (portbugs.twin: two micro-batches, or every weight one ulp up)."""
    return suite_runs(1, portbugs.twin(bug.single)[1])


def report_for(bug, suite_runs, calibrated: bool = True) -> parity.ParityReport:
    noise = [twin_of(bug, suite_runs)] if calibrated else None
    return parity.compare(suite_runs(1, bug.single), suite_runs(bug.nproc, bug.ddp), noise_runs=noise)


@pytest.mark.parametrize("bug", ALL, ids=[b.name for b in ALL])
def test_port_bug_suite(bug, suite_runs):
    report = report_for(bug, suite_runs)
    assert report.calibrated, report.format()
    assert portbugs.problems(bug, report) == [], report.format()
    if bug.expected != "catch":
        assert report.cause is None, report.format()
    # `ddp-lab doctor` on the same two folders (no second launch): its top cause is the bug's, or "no bug".
    diagnosis = doctor.diagnose_runs(suite_runs(1, bug.single), suite_runs(bug.nproc, bug.ddp),
                                     noise_runs=[twin_of(bug, suite_runs)])
    assert portbugs.doctor_problems(bug, diagnosis) == [], diagnosis.format()


@pytest.mark.parametrize("bug", [b for b in ALL if b.expected == "catch"], ids=lambda b: b.name)
def test_bugs_leave_the_envelope_at_their_onset_by_decades(bug, suite_runs):
    """A bug is not merely outside the envelope: at its first step out it sits at least 100 envelopes away
    (the margin), while the envelope there is still at ulp level."""
    from lab_utils.drivers.bench_portbugs import envelopes

    report = report_for(bug, suite_runs)
    first = min(s for s in (report.first_step_over_tol, report.first_step_over_grad_rtol) if s is not None)
    assert envelopes(report, bug) >= report.margin, report.divergence_table()
    # ulp level: at the tiny GPT's loss (~2-5) one fp32 ulp is 2.4e-7 or 4.8e-7
    assert report.twin_loss[first] <= 1e-5, report.divergence_table()


def test_set_epoch_bug_diverges_exactly_at_the_epoch_boundary(suite_runs):
    bug = next(b for b in SUITE if b.name == "set_epoch_forgotten")
    report = report_for(bug, suite_runs)
    boundary = math.ceil(portbugs.EPOCH_SAMPLES / 16)  # global_batch_size 16: epoch 1 starts at step 2
    assert report.first_step_over_tol == boundary and f"until step {boundary}" in report.cause.text, report.format()
    fixed = report_for(bug, suite_runs, calibrated=False)  # the same with the fixed tolerances
    assert fixed.first_step_over_tol == boundary, fixed.format()


def test_the_grad_norm_rule_is_what_catches_sum_loss_under_adamw(suite_runs):
    """Without the gradient-norm check the §3.2 bug passes as tier 2 under AdamW (loss and outputs agree);
    the ratio of the norms is exactly 1/world_size."""
    bug = next(b for b in SUITE if b.name == "sum_loss_unscaled_adamw")
    report = report_for(bug, suite_runs, calibrated=False)
    assert report.grad_norm_ratio_median == pytest.approx(0.5, rel=1e-3), report.format()
    blind = parity.compare(suite_runs(1, bug.single), suite_runs(bug.nproc, bug.ddp), grad_rtol=math.inf)
    assert blind.tier == 2, blind.format()


def test_suite_table_is_well_formed():
    names = [b.name for b in ALL]
    assert len(names) == len(set(names))
    assert {b.expected for b in SUITE} == {b.expected for b in FSDP2_SUITE} == set(portbugs.EXPECTED)
    assert all("wrap=fsdp2" in b.ddp for b in FSDP2_SUITE) and not any("wrap=fsdp2" in b.ddp for b in SUITE)
    # Singles are shared: fewer runs than two per case, or the suite would cost twice the wall time; and one
    # float twin per distinct single run, no more.
    needed = portbugs.runs_needed(ALL)
    twins = [n for n in needed if float_twin.SEPARATOR in n]
    singles = {portbugs.run_name(1, b.single) for b in ALL}
    assert len(needed) - len(twins) < 2 * len(ALL)
    assert sorted(n.split(float_twin.SEPARATOR)[0] for n in twins) == sorted(singles)
    with pytest.raises(ValueError, match="not one of parity.CAUSES"):
        portbugs.PortBug("x", "", (), (), "catch", "no_such_cause")
    with pytest.raises(ValueError, match="names a cause"):
        portbugs.PortBug("x", "", (), (), "pass", "global_batch")


@pytest.mark.parametrize("bug", [b for b in FSDP2_SUITE if any(k.startswith("fsdp2_bug=") for k in b.ddp)],
                         ids=lambda b: b.name)
def test_fsdp2_setup_bugs_list_the_keys_own_fix_too(bug, suite_runs):
    """Caught from the data first (the suite's test); the doctor also lists the fsdp2_bug key's own fix
    (fsdp2_setup), since the two folders' configs name it."""
    diagnosis = doctor.diagnose_runs(suite_runs(1, bug.single), suite_runs(bug.nproc, bug.ddp),
                                     noise_runs=[twin_of(bug, suite_runs)])
    assert any(c.code == "fsdp2_setup" for c in diagnosis.causes), [c.code for c in diagnosis.causes]


def test_tree_entries_share_one_single_run_whose_twin_is_a_tree_too():
    """Chapter 13's three entries compare against ONE run, the tree at 1 process; its float twin (16 chunks of 1:
    another tree) must be a configuration the tree accepts, or the suite could not launch it."""
    from lab_utils.core import config

    tree = [b for b in SUITE if b.article.startswith("ch13")]
    assert len(tree) == 3 and len({portbugs.run_name(1, b.single) for b in tree}) == 1
    twin_keys = config.resolve(list(portbugs.twin(tree[0].single)[1]), 1)
    assert twin_keys["grad_reduction"] == "tree" and twin_keys["micro_batch_size"] == 1


def test_unused_parameter_with_the_flag_off_is_an_error_not_a_tier(runs_dir):
    """Chapter 05's bug that no tier can describe: a branch unused in a step, find_unused_parameters=false.
    DDP's reducer raises on the next step; the launcher must report it as a crash with the rank's own error."""
    from lab_utils.launch import probes

    result = launcher.launch(launcher.request("pb_unused_off", 2, {"steps": 3, "find_unused_parameters": False},
                                              timeout=600, progress=False, script=probes.FLAGS_PROBE,
                                              extra_env={"LAB_FLAGS_PROBE": "unused"}))
    assert result.status == "crashed", str(result)
    assert "Expected to have finished reduction in the prior iteration" in result.message + result.traceback, \
        str(result)
    assert result.failing_rank in (0, 1)


@pytest.mark.parametrize("name", ["clip_inside_no_sync_window", "clip_per_micro_batch", "clip_scaled_gradients"])
def test_clipping_causes_come_from_the_data(name, suite_runs):
    """The three clipping bugs are named grad_clip with clip_bug removed from both config.json files (what a
    recorded script's folder looks like): the report reads the metrics, not the key that made the bug."""
    from lab_utils.analysis import causes

    bug = next(b for b in SUITE if b.name == name)
    report = report_for(bug, suite_runs)
    run_a, run_b = suite_runs(1, bug.single), suite_runs(bug.nproc, bug.ddp)
    ca, cb = (json.loads((run / "config.json").read_text()) for run in (run_a, run_b))
    for c in (ca, cb):
        c["config"].pop("clip_bug", None)
    e = causes.Evidence(report, runfiles.read_metrics(run_a), runfiles.read_metrics(run_b), ca, cb,
                        replica_a=causes.replica_hashes(run_a), replica_b=causes.replica_hashes(run_b))
    cause = causes.first(e)
    assert cause is not None and cause.code == "grad_clip" and "clip_bug" not in cause.text, cause
