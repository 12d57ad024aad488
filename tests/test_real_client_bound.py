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


def test_one_block_of_room_fetches_every_use_and_writes_back_what_is_read_again(tmp_path):
    b = budget.traffic_bound(budget.steady_window(recording(tmp_path, WRITE_WRITE_READ), WARMUP), 2 * MIB)
    # A, B, A, B a step with one block's room: each use a fetch (MIN's steady count: the room's
    # 2 MiB once over its 16 cycles of 3 steps); A and B written, both read at the step's end:
    # 4 MiB live at that cut, 2 of them not on the GPU.
    assert b["min_bytes_per_step"] == pytest.approx(8 * MIB - 2 * MIB / 16 / 3, abs=1)
    assert b["live_written_bytes"] == 4 * MIB and b["min_bytes_d2h_per_step"] == round(2 * MIB / 3)
    assert b["traffic_us"] == round(b["min_bytes_per_step"] / budget.LINK_BYTES_PER_US, 1)


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
    assert b["live_written_bytes"] == 4 * MIB and b["min_bytes_d2h_per_step"] == round(2 * MIB / 3)
    # Taken for an overwrite, A would be dead from its read to its write: only B live, 2 MiB.
    overwritten = [[(2, 0, 2 * MIB, "w")], [(2, 0, 2 * MIB, "r")], [(1, 0, 2 * MIB, "w")]]
    assert budget.traffic_bound(budget.steady_window(recording(tmp_path, overwritten), WARMUP),
                                2 * MIB)["min_bytes_d2h_per_step"] == 0
