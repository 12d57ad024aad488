"""bench/victim_orders.py's replay of a recording under victim orders (scripts/bench-victim-orders),
on recordings written by hand (test_real_client_bound.py's), and docs/benchmarks.md's table of
the committed result."""
import json
import pathlib
import random
import sys

import pytest

from helpers import markdown_table
from test_real_client_bound import MIB, WARMUP, recording

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import real_client_budget as budget  # noqa: E402
import victim_orders  # noqa: E402
from helpers import load_script  # noqa: E402

BLOCK = 2 * MIB


def block(n, mode):
    return [(n, 0, BLOCK, mode)]


# A step: A read, B written whole and read, C read, A read again. With room for two, at C's read
# A (read next) and B (written whole next: dead) are resident: least recently used evicts A,
# copied out and brought back for the step's last read, where B goes, free; B dead first
# leaves A where it is.
STEP = [block(1, "r"), block(2, "w"), block(2, "r"), block(3, "r"), block(1, "r")]


def orders(tmp_path, step, capacity):
    window = budget.steady_window(recording(tmp_path, step, sizes={1: BLOCK, 2: BLOCK, 3: BLOCK}), WARMUP)
    return {o: victim_orders.replay(window, capacity, o) for o in victim_orders.ORDERS}, \
        budget.traffic_bound(window, capacity)


def test_room_for_everything_moves_nothing(tmp_path):
    moved, _ = orders(tmp_path, STEP, 3 * BLOCK)
    assert moved == {o: (0, 0) for o in victim_orders.ORDERS}


def test_dead_blocks_go_first_and_free_and_no_order_beats_the_bound(tmp_path):
    moved, limit = orders(tmp_path, STEP, 2 * BLOCK)
    assert moved["lru"] == (2 * BLOCK, 2 * BLOCK)  # A out and in, C in and out: a step's blocks
    assert moved["lru_dead_first"] == moved["min"] == (BLOCK, BLOCK)  # C's alone
    for o, (fetched, copied) in moved.items():
        assert fetched >= limit["min_bytes_per_step"] and copied >= limit["min_bytes_d2h_per_step"], o
    assert limit["min_bytes_per_step"] > BLOCK * 0.9


def test_no_order_moves_less_than_the_bound_on_random_steps(tmp_path):
    """Steps of launches on 1 to 3 of 4 blocks, read, written whole or both, at a room of 1 to 3
    blocks (a launch larger than the room streams through it): every order moves at least the
    bound's bytes each way."""
    rng = random.Random(41)
    for case in range(60):
        step = [[(b, 0, BLOCK, rng.choice(("r", "w", "rw"))) for b in rng.sample(range(1, 5), rng.randint(1, 3))]
                for _ in range(6)]
        folder = tmp_path / str(case)
        folder.mkdir()
        window = budget.steady_window(recording(folder, step, sizes={b: BLOCK for b in range(1, 5)}), WARMUP)
        for slots in (1, 2, 3):
            limit = budget.traffic_bound(window, slots * BLOCK)
            for o in victim_orders.ORDERS:
                fetched, copied = victim_orders.replay(window, slots * BLOCK, o)
                assert fetched >= limit["min_bytes_per_step"] - 1 and copied >= limit["min_bytes_d2h_per_step"] - 1, \
                    (step, slots, o, fetched, copied, limit)


def test_an_unknown_order_is_refused(tmp_path):
    window = budget.steady_window(recording(tmp_path, STEP), WARMUP)
    with pytest.raises(ValueError, match="allowed: lru, lru_dead_first, min"):
        victim_orders.replay(window, BLOCK, "fifo")


def test_the_docs_table_is_the_committed_result():
    committed = json.loads((ROOT / "bench" / "results" / "victim-orders.json").read_text())
    script = load_script(ROOT / "scripts" / "bench-victim-orders", "bench_victim_orders")
    assert markdown_table(ROOT / "docs" / "benchmarks.md", "| " + " | ".join(script.TABLE_HEADER) + " |") == [
        row for name, w in committed["workloads"].items() for row in script.table_rows(name, w)]
