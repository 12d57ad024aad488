"""Use events with generations (issue 42, risk 1), on fakecuda (tests/c/use_recycle.c).

Each context records its use tokens in a ring of 1,024 events. A token kept long, as pump's
cache of stream-ordered managed blocks keeps a freed block's (shim/policy/managed_all_cache.c), may
find its slot recorded again, maybe on another stream: a wait on the slot's event then waits
for an unrelated point. Before, that is what happened: a block freed on stream A while a reader
held there was handed to stream B 1,100 uses later, and B's overwrite ran before A's reader
(its sum 106,954,746 instead of 4,194,298). Now a wait on a token whose slot was recorded again
waits for a fresh point of the eviction stream, which waited for the token's record before
the slot was reused."""

import pytest

CACHE = {"FAKECUDA_POOL_PREFETCH": "refuse", "PUMP_MANAGED_ALL": "1", "PUMP_BUDGET": "64MiB",
         "TSAN_OPTIONS": "halt_on_error=1"}


@pytest.mark.parametrize("variant", ["plain", "asan", "tsan"])
@pytest.mark.parametrize("uses", [100, 1100])
def test_a_block_handed_to_another_stream_waits_for_its_last_use(run_program, variant, uses):
    bare = run_program("use_recycle", uses, pump=False, env={"FAKECUDA_POOL_PREFETCH": "refuse"}).result
    run = run_program("use_recycle", uses, variant=variant, env=CACHE)
    assert run.proc.returncode == 0, run.proc.stderr[-3000:]
    assert "Sanitizer" not in run.proc.stderr, run.proc.stderr[-3000:]
    assert run.result["reused"]  # pump's cache handed B the block A freed
    assert run.result["sum"] == bare["sum"] == 4194298.0
    t = run.totals
    assert t["errors"] == 0
    # Past the ring's 1,024 uses the token's slot was recorded again: the wait was made anew.
    assert (t["use_waits_recycled"] > 0) == (uses > 1024), t["use_waits_recycled"]
