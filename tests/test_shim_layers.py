"""The shim reads in layers: a lower layer never includes a higher one's header.

From the bottom: base (the shared records, configuration, logging, counters, which device a
call is about), lookup (the range table, the launch scan, parameter layouts, the device
memory pump lets through: what a pointer is), channel (records to
and from pumpd: decides nothing), engine (the driver calls that move memory: no policy),
policy (what moves and when: residency, budget, capacity, managed_all), hooks (the entry
points, which orchestrate). A lower file reaches a higher one only through a callback the
higher one hands it (ranges.h's observer, layouts.h's announcer), never by name: with
warnings as errors, a call needs the header, so reading the #include lines is enough.
"""
import pathlib
import re

import pytest

SHIM = pathlib.Path(__file__).resolve().parent.parent / "shim"
LAYERS = ["base", "lookup", "channel", "engine", "policy", "hooks"]
LAYER_OF = {
    "base": ["shim", "pump_stats", "pump_channel", "pump_torch_trace", "capture_mode", "config", "log",
             "stats", "devices"],
    "lookup": ["ranges", "scan", "layouts", "device_memory", "handles", "tensor_maps"],
    "channel": ["channel"],
    "engine": ["prefetch", "context_cache", "stream_users"],
    "policy": ["residency", "budget", "capacity", "managed_all", "pool_memory"],  # residency_blocks.c, _moves.c too
    "hooks": ["hooks", "hooks_common", "hooks_context", "hooks_graph", "hooks_launch", "hooks_memory",
              "hooks_stream", "hooks_sync", "hooks_pool", "hooks_tensor_maps", "dlsym", "procaddr", "driver",
              "lifecycle", "torch_trace", "torch_allocator"],
}
RANK = {stem: LAYERS.index(layer) for layer, stems in LAYER_OF.items() for stem in stems}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)


def shim_files():
    return sorted(p for p in SHIM.iterdir() if p.suffix in (".c", ".h"))


def includes(path):
    """The shim headers path includes (system and CUDA headers are not the shim's)."""
    return [name for name in INCLUDE.findall(path.read_text()) if (path.parent / name).exists()]


def layer_of(stem):
    """A file's layer; residency_blocks.c and the like go with their family's."""
    for candidate in (stem, stem.rsplit("_", 1)[0]):
        if candidate in RANK:
            return RANK[candidate]
    return None


def test_every_shim_file_has_a_layer():
    unplaced = [p.name for p in shim_files() if layer_of(p.stem) is None]
    assert not unplaced, f"place these in LAYER_OF (tests/test_shim_layers.py): {unplaced}"


def upward_includes(files):
    bad = []
    for path in files:
        own = layer_of(path.stem)
        for name in includes(path):
            theirs = layer_of(pathlib.Path(name).stem)
            if theirs is not None and own is not None and theirs > own:
                bad.append(f"{path.name} ({LAYERS[own]}) includes {name} ({LAYERS[theirs]})")
    return bad


def test_no_lower_layer_includes_a_higher_one():
    assert upward_includes(shim_files()) == []


def test_includes_form_no_circle():
    graph = {p.name: includes(p) for p in shim_files()}
    state = {}

    def visit(node, trail):
        if state.get(node) == "done":
            return
        if state.get(node) == "open":
            pytest.fail(f"include circle: {' -> '.join(trail + [node])}")
        state[node] = "open"
        for nxt in graph.get(node, []):
            if nxt != node:
                visit(nxt, trail + [node])
        state[node] = "done"

    for node in graph:
        visit(node, [])


def test_the_check_sees_an_upward_include(tmp_path):
    """The check itself fails on the circle the shim once had: the range table calling residency."""
    ranges = tmp_path / "ranges.c"
    ranges.write_text('#include "ranges.h"\n#include "residency.h"\n')
    (tmp_path / "ranges.h").write_text("")
    (tmp_path / "residency.h").write_text("")
    assert upward_includes([ranges]) == ["ranges.c (lookup) includes residency.h (policy)"]
