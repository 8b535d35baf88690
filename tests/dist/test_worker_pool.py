"""The suite's warm ranks (tests/workers) keep a failing command to its own test.

A command that fails on one rank while the others wait for it in a collective is the worst case: the
waiting ranks never return by themselves. The pool must report that command alone as failed, with
the failing rank's traceback, and run the next command on a new job as if nothing had happened.
"""

from __future__ import annotations

import textwrap

import pytest

from tests.workers.pool import POOL, PoolJobFailed

pytestmark = pytest.mark.dist
pytest_plugins = ["pytester"]

# rank 1 raises while rank 0 waits for it inside an all-reduce
HANGING_FAILURE = textwrap.dedent("""
    import os, torch, torch.distributed as dist
    if os.environ["RANK"] == "1":
        raise ValueError("injected failure on rank 1")
    dist.all_reduce(torch.ones(1))
""")
SUM = "import torch, torch.distributed as dist; t = torch.ones(1); dist.all_reduce(t); print('SUM', int(t))"


def test_a_rank_that_fails_inside_a_collective_fails_that_command_alone():
    with pytest.raises(PoolJobFailed) as info:
        POOL.run(["-c", HANGING_FAILURE], nproc=2, timeout=600, sync_timeout=5)
    report = str(info.value)
    assert "ValueError: injected failure on rank 1" in report and "--- rank 1 (exit code 1)" in report, report
    after = POOL.run(["-c", SUM], nproc=2, timeout=120)
    assert after.returncode == 0 and "SUM 2" in after.stdout, after.stderr


def test_an_exit_code_comes_back_and_the_job_stays_warm():
    POOL.run(["-c", "pass"], nproc=2, check=True)
    before = POOL.jobs[2]
    proc = POOL.run(["-c", "import sys; print('bye'); sys.exit(3)"], nproc=2)
    assert proc.returncode == 3 and proc.stdout == "bye\n"
    assert POOL.jobs[2] is before and POOL.run(["-c", SUM], nproc=2).stdout == "SUM 2\n"


def test_an_injected_failing_scenario_fails_only_its_own_test(pytester):
    """Three scenarios on one warm 2-rank job, the middle one broken: pytest reports exactly that one,
    with its message and the rank's traceback, and the scenario after it passes."""
    pytester.makepyfile(test_scenarios=textwrap.dedent(f"""
        import pytest
        from tests.workers.pool import POOL

        SUM = {SUM!r}
        BROKEN = {HANGING_FAILURE!r}

        @pytest.mark.parametrize("scenario", ["first", "broken", "last"])
        def test_scenario(scenario):
            proc = POOL.run(["-c", BROKEN if scenario == "broken" else SUM], nproc=2, timeout=600, sync_timeout=5)
            assert proc.returncode == 0 and "SUM 2" in proc.stdout, proc.stderr
    """))
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-q")
    result.assert_outcomes(passed=2, failed=1)
    failures = [r for r in result.reprec.getreports("pytest_runtest_logreport") if r.failed]
    assert [r.nodeid.split("::")[-1] for r in failures] == ["test_scenario[broken]"]
    assert "ValueError: injected failure on rank 1" in failures[0].longreprtext
