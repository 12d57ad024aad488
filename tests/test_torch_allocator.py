"""PyTorch's tensors under pump, on fakecuda (tests/c/torch_allocator.c makes a training
step's allocations the ways PyTorch does).

pump's allocator (shim/hooks/torch_allocator.c), driven as PyTorch's CUDAPluggableAllocator
drives it: every tensor is its own managed allocation, and a dead tensor's whole 2 MiB
blocks are discarded in its stream's order before it is freed. fakecuda poisons discarded
pages (NaN as floats), so a discard that came before a tensor's last use would change the
checksum. Its pool hands a freed activation's memory to the next step's at once, as the
driver's does: pump's prefetch of the new tensor must wait for the old one's discard, or
the discard, running after it, leaves the pages for the kernel to fault in again.

PyTorch's caching allocator, followed (shim/hooks/torch_trace.c): tensors handed out of one
managed segment, reported as pump's bridge reports them (pump/boot/torch_trace.cpp), carve
the segment, so pump prefetches the tensors and not the segment."""

import json
import subprocess

import numpy as np
import pytest

from helpers import PUMP_RUN, clean_env
from pump import channel, trace

MIB = 1 << 20
MANAGED_ALL = {"PUMP_MANAGED_ALL": "1"}
STEPS = 3
WEIGHTS, ACTIVATION = 8 * MIB, 6 * MIB  # tests/c/torch_allocator.c; both whole 2 MiB blocks


def bare(run_program, *args):
    result = run_program("torch_allocator", STEPS, *args, pump=False).result
    assert result["pump_allocator"] == 0 and result["managed"] == 0 and result["bytes_discarded"] == 0
    return result


# Whether the driver prefetches a managed pool's memory (fakecuda's knob): where it does, tensors come
# from the device's managed pool; where not, from cuMemAllocManaged, freed in stream order by pump.
@pytest.mark.parametrize("pool_prefetch", ["accept", "refuse"])
def test_tensors_are_managed_and_dead_ones_discarded(run_program, pool_prefetch):
    expected = bare(run_program)
    run = run_program("torch_allocator", STEPS, env=dict(MANAGED_ALL, FAKECUDA_POOL_PREFETCH=pool_prefetch))
    result = run.result
    assert result["pump_allocator"] == 1 and result["managed"] == 1
    assert result["checksum"] == expected["checksum"]
    discarded = STEPS * ACTIVATION + WEIGHTS
    assert result["bytes_discarded"] == discarded  # fakecuda's count of what it discarded
    # Each later step's activation got the dead one's memory, and no prefetch raced its discard.
    totals = run.totals
    reused = result["allocations_reused"] if pool_prefetch == "accept" else totals["unpooled_reuses"]
    assert reused >= 1 and result["gpu_faults"] == 0
    assert totals["bytes_discarded"] == discarded and totals["discards_skipped"] == 0
    assert totals["prefetch_discard_waits"] <= reused
    assert totals["torch_allocs"] == totals["torch_frees"] == STEPS + 1
    assert totals["managed_allocs"] == totals["managed_frees"] == STEPS + 1
    assert totals["errors"] == 0
    assert run.proc.stderr == ""


DRAIN_TIMEOUTS = 3  # shim/engine/discard_marks.c: waits for a stream that ran out, in a row, before discards stop


def test_a_stream_that_does_not_drain_stops_the_discards(run_program):
    # A host function holds the stream while 300 tensors die on it (tests/c/torch_allocator.c,
    # held). pump asks for a discard only once the freeing stream has drained (the driver's
    # discard on a busy stream lands after the work queued behind it: bench/gpu/probes/
    # discard_late.py on the H200), waiting a second at most: three such waits in a row, and it
    # discards no more and says so once; the program neither hangs nor changes.
    expected = bare(run_program, "held")
    run = run_program("torch_allocator", STEPS, "held", env=MANAGED_ALL)
    assert run.result["checksum"] == expected["checksum"] and run.result["gpu_faults"] == 0
    assert run.totals["discards_undrained"] == DRAIN_TIMEOUTS and run.totals["bytes_discarded"] == 0
    assert run.proc.stderr.count("did not drain") == 1, run.proc.stderr
    assert run.totals["errors"] == 0


def traced(c_build, tmp_path, tag, *args, **env):
    """tests/c/torch_allocator.c under pump-run with an embedded pumpd and --trace (the program
    waits for libpump's first write to the ring before what it traces): pump's totals and the
    trace's records."""
    recorded, stats_file = tmp_path / f"{tag}.trace", tmp_path / f"{tag}.json"
    proc = subprocess.run([PUMP_RUN, "--daemon", "embedded", "--trace", str(recorded), "--stats", str(stats_file),
                           "--", str(c_build / "plain" / "torch_allocator"), *map(str, args)],
                          env=dict(clean_env(), LD_LIBRARY_PATH=str(c_build / "plain"), **MANAGED_ALL, **env),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    _, blocks = trace.read(recorded)
    return json.loads(stats_file.read_text())["totals"], np.concatenate([r for _, r in blocks])


def test_the_wait_for_a_stream_to_drain_is_not_kernel_time(c_build, tmp_path):
    # The same held stream under pump-run, traced: the three drains (a second each) happen on the
    # launching thread between its launches, and pumpd reads the gaps between a thread's LAUNCH
    # stamps as kernel time. pump's own time is taken out of the stamps, the drain's with it.
    totals, records = traced(c_build, tmp_path, "held", STEPS, "held")
    assert totals["discards_undrained"] == DRAIN_TIMEOUTS
    stamps = records["time_ns"][records["kind"] == channel.KIND["launch"]]
    # every launch traced but maybe the first, made before the program waited for the ring: the
    # drains come after it, between traced launches
    assert len(stamps) >= totals["launches_managed"] - 1
    assert np.diff(np.sort(stamps)).max() < 0.5e9  # each drain waited 1 s


def traced_steps(c_build, tmp_path, names):
    """torch_allocator's moving activations, traced: per step, the activation's ALLOC (arg0,
    arg3) and the bases of its forward launch."""
    totals, records = traced(c_build, tmp_path, f"names{names}", 12, "moving", "caching", PUMP_TORCH_NAMES=names)
    kinds, args = records["kind"], records["arg"]
    steps = np.flatnonzero(kinds == channel.KIND["step"])
    out = []
    for a, b in zip(steps, steps[1:]):
        allocs = [(int(x[0]), int(x[3])) for k, x in zip(kinds[a:b], args[a:b])
                  if k == channel.KIND["alloc"] and int(x[1]) == ACTIVATION]
        launches = [int(i) for i in np.flatnonzero(kinds[a:b] == channel.KIND["launch"])]
        out.append((allocs[0], tuple(int(v) for v in args[a + launches[0]][2:4])))
    assert len(out) == 11, f"{len(out)} steps traced"  # every step but the last, ended by none
    return totals, out


def test_named_tensors_keep_their_names_where_their_addresses_change(c_build, tmp_path):
    # The activation alternates between two places, as PyTorch's tensors move from step to step;
    # named (PUMP_TORCH_NAMES=1), pumpd hears it at one address every step, where it really is
    # beside it (ALLOC's arg3), and the forward launch names it by that address: its launch key
    # repeats. By address, its launches alternate, and no key repeats a step later.
    totals, named = traced_steps(c_build, tmp_path, "1")
    assert totals["tensor_names_bound"] > 0 and totals["errors"] == 0
    names = {alloc[0] for alloc, _ in named}
    places = [alloc[1] for alloc, _ in named]
    assert len(names) == 1 and min(names) >= channel.NAMES_BASE, named
    assert len(set(places)) == 2 and places[0] != places[1], named
    assert len({bases for _, bases in named}) == 1 and named[0][1][1] in names, named
    totals, plain = traced_steps(c_build, tmp_path, "0")
    assert totals["tensor_names_bound"] == 0
    assert all(alloc[1] == 0 and alloc[0] < channel.NAMES_BASE for alloc, _ in plain), plain
    assert len({bases for _, bases in plain}) == 2, plain


def test_a_discard_that_cannot_be_marked_leaves_its_memory_to_faults(run_program):
    # Without events, pump cannot order a prefetch of the memory after its discard: the next
    # tensor there is never prefetched (its kernels fault it in), and nothing more is discarded.
    expected = bare(run_program)
    run = run_program("torch_allocator", STEPS, env={**MANAGED_ALL, "FAKECUDA_FAIL": "cuEventRecord=999"})
    assert run.result["checksum"] == expected["checksum"]
    assert run.totals["bytes_discarded"] == ACTIVATION  # the first step's, then no more
    assert run.totals["prefetch_discard_skips"] > 0 and run.result["gpu_faults"] > 0
    assert run.totals["errors"] > 0


def test_the_legacy_stream_gets_no_discard(run_program):
    # The driver refuses discards on the legacy NULL stream (PyTorch's default stream):
    # pump frees without one there.
    expected = bare(run_program, "legacy")
    run = run_program("torch_allocator", STEPS, "legacy", env=MANAGED_ALL)
    assert run.result["checksum"] == expected["checksum"]
    assert run.result["managed"] == 1 and run.result["bytes_discarded"] == 0
    assert run.totals["bytes_discarded"] == 0 and run.totals["torch_frees"] == STEPS + 1
    assert run.totals["errors"] == 0


def test_without_managed_all_tensors_stay_device_memory(run_program):
    expected = bare(run_program)
    run = run_program("torch_allocator", STEPS, env={"PUMP_MANAGED_ALL": "0"})
    assert run.result["managed"] == 0 and run.result["bytes_discarded"] == 0
    assert run.result["checksum"] == expected["checksum"]
    assert run.totals["torch_allocs"] == STEPS + 1 and run.totals["managed_allocs"] == 0


@pytest.mark.parametrize("variant", ["asan", "tsan"])
def test_sanitized(run_program, variant):
    expected = bare(run_program, "held")
    run = run_program("torch_allocator", STEPS, "held", variant=variant, env=MANAGED_ALL)
    assert run.result["checksum"] == expected["checksum"]
    assert run.result["bytes_discarded"] == 0 and run.totals["discards_undrained"] == DRAIN_TIMEOUTS
    assert run.result["gpu_faults"] == 0


SEGMENT = 20 * MIB  # tests/c/torch_allocator.c's caching-allocator segment
# A second segment as large must fit after the first one's free: the carved segment's bytes
# are given back to the capacity.
CAP = {"PUMP_MANAGED_ALL": "1", "PUMP_CAPACITY": "24M"}


@pytest.mark.parametrize("legacy", [(), ("legacy",)], ids=["stream", "legacy"])
def test_caching_allocator_tensors_are_tracked_not_its_segments(run_program, legacy):
    expected = bare(run_program, *legacy, "caching")
    run = run_program("torch_allocator", STEPS, *legacy, "caching", env=CAP)
    result, totals = run.result, run.totals
    assert result["managed"] == 1 and result["checksum"] == expected["checksum"]
    # Only the tensors went to the GPU, never the segment's free 6 MiB; nothing faulted.
    assert result["device_resident_peak"] == WEIGHTS + ACTIVATION
    assert result["gpu_faults"] == 0 and result["bytes_discarded"] == 0
    assert totals["torch_tensor_allocs"] == totals["torch_tensor_frees"] == STEPS + 1
    assert totals["managed_allocs"] == totals["managed_frees"] == 2  # the two segments
    assert totals["errors"] == 0 and run.proc.stderr == ""


def test_unfollowed_caching_allocator_prefetches_whole_segments(run_program):
    # What pump does when its bridge could not be built: the same values, coarser prefetches.
    expected = bare(run_program, "segments")
    run = run_program("torch_allocator", STEPS, "segments", env=CAP)
    assert run.result["checksum"] == expected["checksum"]
    assert run.result["device_resident_peak"] == SEGMENT
    assert run.totals["torch_tensor_allocs"] == 0 and run.totals["managed_allocs"] == 2


def test_caching_allocator_without_managed_all_is_left_alone(run_program):
    run = run_program("torch_allocator", STEPS, "caching", env={"PUMP_MANAGED_ALL": "0"})
    assert run.result["managed"] == 0 and run.result["checksum"] == bare(run_program, "caching")["checksum"]
    assert run.totals["torch_tensor_allocs"] == 0 and run.totals["managed_allocs"] == 0


@pytest.mark.parametrize("variant", ["asan", "tsan"])
def test_caching_allocator_sanitized(run_program, variant):
    expected = bare(run_program, "caching")
    run = run_program("torch_allocator", STEPS, "caching", variant=variant, env=CAP)
    assert run.result["checksum"] == expected["checksum"]
    assert run.result["device_resident_peak"] == WEIGHTS + ACTIVATION


# A tensor freed on its stream while another still reads it (tests/c/torch_streams.c): record_stream
# never reaches a pluggable allocator, so pump orders the free after every other stream it saw
# launches on, and discards nothing once a second stream is in use (shim/engine/stream_users.c).
def streams_bare(run_program):
    result = run_program("torch_streams", pump=False).result
    assert result["pump_allocator"] == 0 and result["reused"] == 1
    assert result["checksum"] == result["expected"]  # record_stream honoured, as PyTorch's allocators do
    return result


@pytest.mark.parametrize("managed_all", ["1", "0"])
def test_a_tensor_read_on_another_stream_is_freed_after_the_read(run_program, managed_all):
    # Before: the freeing stream did not wait for the reader, the pool gave the memory to the
    # next tensor at once, and the reader summed its values (checksum 1051721722.0, not 4194298.0).
    expected = streams_bare(run_program)
    run = run_program("torch_streams", env={"PUMP_MANAGED_ALL": managed_all})
    assert run.result["pump_allocator"] == 1 and run.result["reused"] == 1
    assert run.result["checksum"] == expected["checksum"]
    assert run.totals["torch_free_waits"] == 2  # each of the two frees waited for stream B
    assert run.totals["torch_frees_unordered"] == 0 and run.totals["errors"] == 0
    assert run.proc.stderr == ""


def test_a_tensor_used_on_two_streams_is_never_discarded(run_program):
    # Before: both tensors' blocks were discarded (8 MiB), the first while stream B read it.
    run = run_program("torch_streams", env=MANAGED_ALL)
    assert run.totals["torch_frees"] == 2 and run.totals["discards_declined"] == 2
    assert run.totals["bytes_discarded"] == 0 and run.result["bytes_discarded"] == 0


def test_a_tensor_no_launch_named_is_not_discarded(run_program):
    # Only copies, memsets or collectives may have used it: pump saw none of its uses.
    # Before: its 4 MiB were discarded.
    run = run_program("torch_streams", "unlaunched", env=MANAGED_ALL)
    assert run.totals["torch_frees"] == 1 and run.totals["discards_declined"] == 1
    assert run.totals["bytes_discarded"] == 0 and run.totals["torch_free_waits"] == 0


@pytest.mark.parametrize("variant", ["plain", "asan"])
def test_a_destroyed_stream_is_forgotten(run_program, variant):
    # Once stream B is destroyed, pump names it no more: the free on A waits for nothing, and
    # A is the only stream left, so the tensor is discarded. Before, the free asked the driver
    # about B's dead handle (under ASan: heap-use-after-free in fakecuda's cuStreamGetCtx).
    run = run_program("torch_streams", "destroyed", variant=variant, env=MANAGED_ALL)
    assert run.result["bytes_discarded"] == 4 * MIB  # tests/c/torch_streams.c's tensor, launch-named
    assert run.totals["torch_free_waits"] == 0 and run.totals["discards_declined"] == 0
    assert run.totals["torch_frees_unordered"] == 0 and run.totals["errors"] == 0
    assert run.proc.stderr == ""


@pytest.mark.parametrize("variant", ["asan", "tsan"])
def test_streams_sanitized(run_program, variant):
    expected = streams_bare(run_program)
    run = run_program("torch_streams", variant=variant, env=MANAGED_ALL)
    assert run.result["checksum"] == expected["checksum"] and run.result["reused"] == 1
    assert run.totals["discards_declined"] == 2 and run.totals["bytes_discarded"] == 0
    assert run.proc.stderr == ""
