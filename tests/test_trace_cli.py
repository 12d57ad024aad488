"""`pump trace stats`: what a trace holds as a table in human units (and as JSON with
--json, tested with the daemon's traces in test_daemon.py)."""

import subprocess
import sys

from helpers import clean_env
from pump import trace
from synthetic_trace import MIB, TraceBuilder


def stats_text(path):
    proc = subprocess.run([sys.executable, "-m", "pump.cli", "trace", "stats", str(path)], capture_output=True,
                          text=True, env=clean_env(), timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


def test_stats_is_a_table_in_human_units(tmp_path):
    t = TraceBuilder()
    weights, acts = t.alloc(96 * MIB), t.alloc(1536 * MIB)
    for s in range(3):
        t.step(s)
        for i in range(700):
            t.launch(0x100 + i % 2, [weights, acts], flops=2e9)
    lines = stats_text(t.write(str(tmp_path / "job.trace"), per_block=100000))
    table = dict(line.split(None, 1) if not line.startswith("managed") else ("managed peak", line[14:])
                 for line in lines[:9])
    assert table["launches"] == "2,100 of 2 functions"
    assert table["managed peak"] == "1.6 GiB"
    assert table["steps"] == "3"
    assert table["FLOPs"] == "4.20 TFLOP"
    assert table["records"] == "4,205 (cost 2,100, launch 2,100, step 3, alloc 2)"
    assert table["ends"] == "whole"   # (a trace cut short says where it ends: test_trace_safety.py)
    assert table["iteration"] == "2 launches; 100% of them with the launch key they had an iteration before " \
                                 "(lookahead needs most); 100% on the same allocations in the iteration's order"
    assert lines[10].split() == ["launches", "function", "(the", "busiest)"]
    assert [line.split()[0] for line in lines[11:13]] == ["1,050", "1,050"]


def test_stats_without_costs_or_steps_says_so(tmp_path):
    t = TraceBuilder()
    buf = t.alloc(MIB)
    t.launch(0x100, [buf])
    lines = stats_text(t.write(str(tmp_path / "bare.trace")))
    assert "FLOPs         none recorded (a trace from pump-run has none)" in lines
    assert "steps         none marked" in lines


def test_stats_say_whether_launch_keys_repeat_from_step_to_step(tmp_path):
    """The same kernels every step, on tensors that the allocator places elsewhere each step
    (a key names the allocations a launch's arguments point into): the iteration is found from
    the kernels, and the keys that repeat are counted, so that a trace shows why lookahead
    learned nothing."""
    t = TraceBuilder()
    buffers = [t.alloc(2 * MIB) for _ in range(10)]
    for s in range(6):
        t.step(s)
        for i in range(10):  # kernel i takes buffer (i + s) % 8 in step s: moved each step ...
            t.launch(0x100 + i, [buffers[(i + s) % 8] if i < 5 else buffers[i]])  # ... for half of them
    lines = stats_text(t.write(str(tmp_path / "moving.trace")))
    assert "iteration     10 launches; 50% of them with the launch key they had an iteration before " \
           "(lookahead needs most); 50% on the same allocations in the iteration's order" in lines
    t = TraceBuilder()
    buf = t.alloc(MIB)
    for i in range(5):
        t.launch(0x100 + i, [buf])
    assert "iteration     none: the kernels do not repeat" in stats_text(t.write(str(tmp_path / "once.trace")))


def test_stats_take_the_iteration_as_long_as_the_keys_need(tmp_path):
    """bench/gpu/chain.py's shape: two kernels alternate, on one pair of buffers then the next:
    the kernels repeat every 2 launches, the keys every 4; the iteration is 4 launches."""
    t = TraceBuilder()
    pairs = [t.alloc(2 * MIB) for _ in range(2)]
    for s in range(5):
        for buf in pairs:
            t.launch(0x100, [buf])
            t.launch(0x101, [buf])
    lines = stats_text(t.write(str(tmp_path / "chain.trace")))
    assert "iteration     4 launches; 100% of them with the launch key they had an iteration before " \
           "(lookahead needs most); 100% on the same allocations in the iteration's order" in lines


def test_one_key_that_did_not_repeat_does_not_make_the_iteration_a_multiple(tmp_path):
    """A 200-launch step, twelve times, whose last step gives one launch another buffer (a
    tensor placed elsewhere once): the iteration is still the step, 99.5% of its keys repeated;
    a multiple of it would dilute the one miss and win by that alone (11 steps: 99.95%)."""
    t = TraceBuilder()
    bufs = [t.alloc(2 * MIB) for _ in range(200)]
    other = t.alloc(2 * MIB)
    for s in range(12):
        for i in range(200):
            t.launch(0x100 + i, [other if (s == 11 and i == 7) else bufs[i]])
    (said,) = [line for line in stats_text(t.write(str(tmp_path / "miss.trace"))) if line.startswith("iteration")]
    assert said.startswith("iteration     200 launches; 100% of them with the launch key they had an iteration "
                           "before"), said   # 199 of 200, shown rounded


def test_stats_say_how_many_launches_repeat_in_allocation_order(tmp_path):
    """PyTorch's caching allocator's way (the real client's tiny GPT: 16% of launch keys
    repeat, 98% in allocation order): every step allocates the same sizes in the same order,
    but at addresses that differ from step to step. A weight allocated once keeps its address.
    Named by their place in the step's allocations, every launch repeats; by address, only the
    one on the weight; and an allocation of another size at that place does not count."""
    t = TraceBuilder()
    weight = t.alloc(2 * MIB)
    for s in range(6):
        t.step(s)
        shift = s * 8 * MIB   # the allocator places the step's tensors elsewhere each step
        acts = []
        for i in range(3):
            base = (1 << 41) + shift + i * 2 * MIB
            size = MIB if (s == 5 and i == 2) else 2 * MIB   # the last step's third: another size
            t._record("alloc", 0, base, size, 1)
            acts.append((base, size))
        t.launch(0x100, [weight, acts[0][0]])
        t.launch(0x101, [acts[0][0], acts[1][0]])
        t.launch(0x102, [acts[2][0]])
        for base, size in acts:
            t.free(base, size)
    doc = trace.stats(t.write(str(tmp_path / "order.trace")))["iteration"]
    assert doc["launches"] == 3 and doc["keys_repeated"] == 0
    assert doc["order_repeated"] == 2   # 0x102's allocation changed size


def test_an_allocation_made_every_other_step_shifts_no_other_sizes_names(tmp_path):
    """The H200's GPT-2 under the caching allocator (bench/results/gpu-20261127-nvidia-h200, case
    c): a steady step's 959 allocations come in the same sizes and order, one more every other
    step, at addresses that differ from step to step (7% of launch keys repeat). Named by their
    size and place among the step's allocations of that size, 97% of the launches repeat, and the
    iteration found is the step, not two. Numbered in the step's order, every launch after the
    extra allocation would differ."""
    t = TraceBuilder()
    weight = t.alloc(2 * MIB)
    for s in range(8):
        t.step(s)
        acts = []
        for i in range(4):
            if i == 2 and s % 2:
                t._record("alloc", 0, (1 << 42) + s * 64 * MIB, 4096, 1)   # the extra one, freed at once
                t.free((1 << 42) + s * 64 * MIB, 4096)
            base = (1 << 41) + ((s * 5 + i * 3) % 8) * 2 * MIB   # placed elsewhere each step
            t._record("alloc", 0, base, 2 * MIB, 1)
            acts.append(base)
        for i in range(3):
            t.launch(0x100 + i, [weight, acts[i], acts[i + 1]])
        for base in acts:
            t.free(base, 2 * MIB)
    doc = trace.stats(t.write(str(tmp_path / "extra.trace")))["iteration"]
    assert doc["launches"] == 3 and doc["order_repeated"] == 3 and doc["keys_repeated"] < 3, doc
