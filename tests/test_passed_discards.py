"""PyTorch's caching allocator's dead tensors on a device the job's memory exceeds, discarded once
the GPU has passed their frees (shim/policy/passed_discards.c; issue 41 item 2), on fakecuda.

tests/c/passed_discard.c frees a 16 MiB tensor, synchronises, and asks for the same memory again
after another tensor's allocation has made the discard; once the new tensor's stream is done the
host writes it. fakecuda drops a discard's pages in address order on the discarding stream (with
poison), so a write the stream did not order after the discard is lost."""

import pytest

MIB = 1 << 20
ROUNDS = 6
DEAD = 16 * MIB  # tests/c/passed_discard.c
FULL_CARD = {"FAKECUDA_DEVICE_MEMORY": "64M", "PUMP_CAPACITY": "host"}


@pytest.mark.parametrize("variant", ["plain", "asan", "tsan"])
def test_memory_handed_out_again_waits_for_its_discard(run_program, variant):
    """Each round's dead tensor is discarded (its whole blocks, on pump's discard stream) and the
    tensor's stream waits for that before the allocator's next tensor there is used. Without the
    wait (passed_discards.c's pump_stream_after_discard) every word the host wrote was lost:
    98,304 of 98,304, in every variant."""
    bare = run_program("passed_discard", ROUNDS, pump=False, env={"FAKECUDA_DEVICE_MEMORY": "64M"}).result
    assert bare == {"wrong_words": 0, "bytes_discarded": 0, "discard_races": 0}
    run = run_program("passed_discard", ROUNDS, variant=variant, env=FULL_CARD, timeout=600)
    assert run.proc.returncode == 0, run.proc.stderr[-4000:]
    assert "Sanitizer" not in run.proc.stderr and "runtime error" not in run.proc.stderr, run.proc.stderr[-4000:]
    assert run.result == {"wrong_words": 0, "bytes_discarded": ROUNDS * DEAD, "discard_races": 0}
    t = run.totals
    assert t["torch_tensor_discards"] == ROUNDS and t["bytes_discarded"] == ROUNDS * DEAD, t
    assert t["evictions"] > 0 and t["errors"] == 0


def test_no_discard_where_they_are_off(run_program):
    run = run_program("passed_discard", ROUNDS, env={**FULL_CARD, "PUMP_TORCH_DISCARDS": "0"})
    assert run.result == {"wrong_words": 0, "bytes_discarded": 0, "discard_races": 0}
    assert run.totals["torch_tensor_discards"] == 0

