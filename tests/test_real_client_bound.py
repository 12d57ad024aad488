"""bench/real_client_budget.py's bound on a recording's traffic (issue 41's min_bytes_per_step and
bound_us on the real-client tier), on recordings written by hand in FAKECUDA_LAUNCH_USES's form:
the blocks a step touches, the host->GPU bytes Belady's MIN must fetch at a capacity, and the
GPU->host bytes of data written and read again that a capacity cannot hold."""
import json
import pathlib
import sys

import pytest

from helpers import markdown_table

ROOT = pathlib.Path(__file__).resolve().parent.parent

sys.path.insert(0, str(ROOT / "bench"))
import real_client_budget as budget  # noqa: E402

MIB = 1 << 20
WARMUP = 3


def recording(tmp_path, step, steps=6, sizes=None):
    """A recording of `steps` steps of launches `step` ([[(ordinal, offset, bytes, mode)], ...]),
    all on thread 0, with allocations 1..3 of 2 MiB unless `sizes` says otherwise."""
    sizes = sizes or {1: 2 * MIB, 2: 2 * MIB, 3: 2 * MIB}
    path = tmp_path / "job.uses"
    lines, order, starts, operands = ["fakecuda-launch-uses 1"], [], [], []
    for _ in range(steps):
        starts.append(len(order))
        for uses in step:
            launch = len(order)
            lines.append(f"0 {launch} kernel {len(uses)}" + "".join(f" {o}:{off}:{n}:{m}" for o, off, n, m in uses))
            order.append([0, launch])
            operands.append([0, launch, [list(u) for u in uses]])
    path.write_text("\n".join(lines) + "\n")
    (tmp_path / "job.uses.order.json").write_text(json.dumps(
        {"order": order, "step_starts": starts, "operands": operands, "sizes": {str(o): n for o, n in sizes.items()}}))
    return path


# Each step: write A, write B, then read both.
WRITE_WRITE_READ = [[(1, 0, 2 * MIB, "w")], [(2, 0, 2 * MIB, "w")], [(1, 0, 2 * MIB, "r"), (2, 0, 2 * MIB, "r")]]


def test_room_for_every_block_moves_nothing(tmp_path):
    b = budget.traffic_bound(budget.steady_window(recording(tmp_path, WRITE_WRITE_READ), WARMUP), 2 * 2 * MIB)
    assert b["touched_block_bytes_per_step"] == 4 * MIB
    assert b["min_bytes_per_step"] == 0 and b["min_bytes_d2h_per_step"] == 0 and b["traffic_us"] == 0
    assert b["bound_steps"] == 6 - WARMUP


def test_one_block_of_room_fetches_every_read_and_writes_back_what_is_read_again(tmp_path):
    b = budget.traffic_bound(budget.steady_window(recording(tmp_path, WRITE_WRITE_READ), WARMUP), 2 * MIB)
    # A, B, A, B a step with one block's room: each read a fetch, each write whole none (what the
    # block held is dead there; MIN's steady count: the room's 2 MiB once over its 16 cycles of
    # 3 steps); A and B written, both read at the step's end: 4 MiB live at that cut, 2 of them
    # not on the GPU, every step (not once over the three).
    assert b["min_fetched_bytes_per_step"] == pytest.approx(4 * MIB - 2 * MIB / 16 / 3, abs=1)
    assert b["live_written_bytes"] == 4 * MIB and b["min_bytes_d2h_per_step"] == 2 * MIB
    assert b["min_bytes_per_step"] == b["min_fetched_bytes_per_step"]
    assert b["traffic_us"] == round(max(b["min_bytes_per_step"] / budget.H2D_BYTES_PER_US,
                                        2 * MIB / budget.D2H_BYTES_PER_US), 1)
    # Read in place (rw), each write needs the old value: fetched as MIN always counted it.
    rewritten = [[(u, o, n, "rw") for u, o, n, _ in launch] for launch in WRITE_WRITE_READ]
    b = budget.traffic_bound(budget.steady_window(recording(tmp_path, rewritten), WARMUP), 2 * MIB)
    assert b["min_fetched_bytes_per_step"] == pytest.approx(8 * MIB - 2 * MIB / 16 / 3, abs=1)


def test_what_is_copied_back_is_brought_back(tmp_path):
    """Three blocks written and read back in one launch, with room for two: no read misses MIN
    cannot avoid but the one the room forces; what is copied back is brought back, so the bytes
    in are at least the bytes out."""
    step = [[(1, 0, 2 * MIB, "w")], [(2, 0, 2 * MIB, "w")], [(3, 0, 2 * MIB, "w")],
            [(1, 0, 2 * MIB, "r")], [(2, 0, 2 * MIB, "r")], [(3, 0, 2 * MIB, "r")]]
    b = budget.traffic_bound(budget.steady_window(recording(tmp_path, step), WARMUP), 2 * 2 * MIB)
    assert b["min_bytes_d2h_per_step"] == 2 * MIB and b["min_bytes_per_step"] >= 2 * MIB


def test_the_write_backs_are_counted_at_one_cut_a_step(tmp_path):
    """The argument (pump/simulate/bound.py's docstring) counts copies at cuts a period apart,
    each made since the cut before: one place in every step. Where the steps' most-live places
    differ, the bound takes the place counting most over all of them: here 2 MiB at one step's
    and none at the other's, 1 MiB a step, under the 2 MiB a step the best schedule copies (a
    weaker bound, never an overstated one)."""
    early = [[(1, 0, 2 * MIB, "w")], [(2, 0, 2 * MIB, "w")], [(1, 0, 2 * MIB, "r"), (2, 0, 2 * MIB, "r")],
             [(3, 0, 2 * MIB, "r")]]
    late = [[(3, 0, 2 * MIB, "r")], [(1, 0, 2 * MIB, "w")], [(2, 0, 2 * MIB, "w")],
            [(1, 0, 2 * MIB, "r"), (2, 0, 2 * MIB, "r")]]
    path = recording(tmp_path, early, steps=WARMUP + 2)
    order = json.loads((tmp_path / "job.uses.order.json").read_text())
    # The last step's launches rewritten as `late`.
    last = order["step_starts"][-1]
    for i, uses in enumerate(late):
        order["operands"][last + i][2] = [list(u) for u in uses]
    (tmp_path / "job.uses.order.json").write_text(json.dumps(order))
    b = budget.traffic_bound(budget.steady_window(path, WARMUP), 2 * MIB)
    assert b["live_written_bytes"] == 4 * MIB
    assert b["min_bytes_d2h_per_step"] == 1 * MIB


def test_blocks_are_counted_in_64_kib_pages_and_a_short_allocations_bytes(tmp_path):
    step = [[(1, 100, 10, "r")], [(2, 2 * MIB - 1, 2, "rw")]]  # one page of A; B's last byte and C's first
    b = budget.traffic_bound(budget.steady_window(recording(tmp_path, step, sizes={1: 2 * MIB, 2: 2 * MIB + 4096}),
                                                  WARMUP), 1 << 40)
    assert b["touched_block_bytes_per_step"] == 2 * MIB + 2 * MIB + 4096


def test_a_recording_too_short_for_its_warmup_is_refused(tmp_path):
    with pytest.raises(budget.BudgetError, match="fewer than the warmup"):
        budget.steady_window(recording(tmp_path, WRITE_WRITE_READ, steps=WARMUP + 1), WARMUP)


def test_the_docs_tables_are_the_committed_results():
    """docs/benchmarks.md's tables for scripts/bench-real-client-budget are
    bench/results/real-client-budget.json's: its targets, and the bound's and each variant's figures."""
    committed = json.loads((ROOT / "bench" / "results" / "real-client-budget.json").read_text())
    doc = ROOT / "docs" / "benchmarks.md"
    assert markdown_table(doc, "| workload | target | result | |") == [
        [name, target, value, "met" if met else "MISSED"] for name, target, value, met in committed["target_rows"]]
    assert markdown_table(doc, "| " + " | ".join(budget.TABLE_HEADER) + " |") == [
        [name, *row] for name, w in committed["workloads"].items() for row in budget.table_rows(w)]


def test_data_read_and_written_in_place_is_live_until_then(tmp_path):
    """An optimizer's state: written at the step's end, read and written again at the next one's
    (mode rw). Its old value is needed there, so it is live across the step: with a block of
    room, the other block's write and read beside it leave 2 MiB the room cannot hold."""
    step = [[(2, 0, 2 * MIB, "w")], [(2, 0, 2 * MIB, "r")], [(1, 0, 2 * MIB, "rw")]]
    b = budget.traffic_bound(budget.steady_window(recording(tmp_path, step), WARMUP), 2 * MIB)
    assert b["live_written_bytes"] == 4 * MIB and b["min_bytes_d2h_per_step"] == 2 * MIB
    # Taken for an overwrite, A would be dead from its read to its write: only B live, 2 MiB.
    overwritten = [[(2, 0, 2 * MIB, "w")], [(2, 0, 2 * MIB, "r")], [(1, 0, 2 * MIB, "w")]]
    assert budget.traffic_bound(budget.steady_window(recording(tmp_path, overwritten), WARMUP),
                                2 * MIB)["min_bytes_d2h_per_step"] == 0


def test_a_block_is_overwritten_only_where_none_of_it_is_needed_later(tmp_path):
    """A use that writes part of a block is an overwrite (free in the bound's MIN) only where
    the rest of the block is next read nowhere: here B's write of the first page, with the
    second page written before and read after it, is not; C's write of the first page, the
    second next written, is; a use that reads is never one."""
    page = 64 << 10
    step = [[(1, page, page, "w")],                          # A: the second page
            [(1, 0, page, "w")],                             # B: the first; the second is read by C
            [(1, page, page, "r"), (1, 0, page, "r")],       # C reads both
            [(1, 0, page, "w")],                             # D: the first; the second next written (A)
            [(1, 0, page, "rw")]]                            # E reads and writes the first
    window = budget.steady_window(recording(tmp_path, step, sizes={1: 2 * MIB}), WARMUP)
    overwritten = window[3][:len(step)]
    assert [bool(o) for o in overwritten] == [True, False, False, True, False]
