"""The shim reads in layers: a lower layer never includes a higher one's header.

From the bottom: base (the shared records, configuration, logging, counters, which device a
call is about), lookup (the range table, the launch scan, parameter layouts, the device
memory pump lets through: what a pointer is), channel (records to
and from pumpd: decides nothing), engine (the driver calls that move memory: no policy),
policy (what moves and when: residency, budget, capacity, managed_all), hooks (the entry
points, which orchestrate). A lower file reaches a higher one only through a callback the
higher one hands it (ranges.h's observer, layouts.h's announcer), never by name: with
warnings as errors, a call needs the header, so reading the #include lines is enough.

Headers alone miss a circle between files that share one header (shim.h declares what
config.c, log.c, stats.c and driver.c define) or that declare each other's functions
themselves: so the calls are read too, by which file defines each pump_ function a file
names, and neither they nor such declarations may form a circle or reach up a layer.
"""
import pathlib
import re

import pytest

SHIM = pathlib.Path(__file__).resolve().parent.parent / "shim"
LAYERS = ["base", "lookup", "channel", "engine", "policy", "hooks"]
LAYER_OF = {
    "base": ["shim", "cuda_compat", "pump_stats", "pump_channel", "pump_torch_trace", "capture_mode", "config", "log",
             "stats", "devices", "real_dlsym", "locks", "captures", "host_room"],
    "lookup": ["ranges", "scan", "layouts", "device_memory", "handles", "tensor_maps"],
    "channel": ["channel"],
    "engine": ["prefetch", "context_cache", "stream_users", "link_rate", "kernel_time", "timing_events", "discard_marks"],
    "policy": ["residency", "budget", "capacity", "managed_all", "pool_memory", "placement"],  # residency_blocks.c, _moves.c too
    "hooks": ["hooks", "hooks_common", "hooks_capture", "hooks_context", "hooks_graph", "hooks_launch", "hooks_memory",
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


COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.DOTALL)
STRING = re.compile(r'"(?:\\.|[^"\\\n])*"')
# A function defined at file scope, not static: `... pump_name(...) {`.
DEFINITION = re.compile(r"^(?!static\b|typedef\b|extern\b)[A-Za-z_][\w \t*]*?\b(pump_\w+)\s*\([^;{]*?\)\s*\{",
                        re.MULTILINE | re.DOTALL)
# A function declared at file scope: `... pump_name(...);` (a prototype).
PROTOTYPE = re.compile(r"^(?!static\b|typedef\b|#)[A-Za-z_][\w \t*]*?\b(pump_\w+)\s*\([^;{)]*\)\s*;", re.MULTILINE)


def code_of(path):
    return STRING.sub('""', COMMENT.sub(" ", path.read_text()))


def call_graph(files):
    """Each .c file's stem -> the stems of the other .c files whose pump_ functions it names."""
    sources = [p for p in files if p.suffix == ".c"]
    defined_in = {}
    for path in sources:
        for name in DEFINITION.findall(code_of(path)):
            defined_in.setdefault(name, path.stem)
    return {path.stem: sorted({defined_in[w] for w in set(re.findall(r"\bpump_\w+\b", code_of(path)))
                               if defined_in.get(w, path.stem) != path.stem})
            for path in sources}


def circles(graph):
    """The strongly connected groups of more than one file (Tarjan), each sorted."""
    index, low, stack, found = {}, {}, [], []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, []):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while not group or group[-1] != node:
                group.append(stack.pop())
            if len(group) > 1:
                found.append(sorted(group))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def upward_calls(graph):
    return [f"{a} ({LAYERS[layer_of(a)]}) calls {b} ({LAYERS[layer_of(b)]})"
            for a, targets in graph.items() for b in targets
            if layer_of(a) is not None and layer_of(b) is not None and layer_of(b) > layer_of(a)]


def test_calls_form_no_circle():
    assert circles(call_graph(shim_files())) == []


def test_no_lower_layer_calls_a_higher_one():
    assert upward_calls(call_graph(shim_files())) == []


def test_no_file_declares_a_function_another_defines():
    """A prototype belongs in the defining file's header, where the include checks see it."""
    files = shim_files()
    graph_names = {}
    for path in files:
        if path.suffix == ".c":
            for name in DEFINITION.findall(code_of(path)):
                graph_names[name] = path.name
    bad = [f"{path.name} declares {name} ({graph_names[name]}'s)" for path in files if path.suffix == ".c"
           for name in PROTOTYPE.findall(code_of(path)) if graph_names.get(name, path.name) != path.name]
    assert bad == []


def test_the_call_check_sees_the_bootstrap_circle(tmp_path):
    """The circle the shim had until issue 27: the dlsym interposer asked driver.c for its hooks,
    driver.c asked dlsym.c for the real dlsym and stats.c to open the record, and stats.c asked
    driver.c whether CUDA was used."""
    (tmp_path / "dlsym.c").write_text(
        "void *pump_real_dlsym(void) { return 0; }\nint decide(void) { return pump_hook_find(\"x\"); }\n")
    (tmp_path / "driver.c").write_text(
        "void *pump_real_dlsym(void);\nint pump_hook_find(const char *n) { return pump_real_dlsym() != 0; }\n"
        "bool pump_driver_was_used(void) { pump_stats_open(); return true; }\n")
    (tmp_path / "stats.c").write_text(
        "void pump_stats_open(void) {}\n/* pump_hook_find in a comment is no call */\n"
        "void pump_stats_at_exit(void)\n{\n    if (pump_driver_was_used()) return;\n}\n")
    files = sorted(tmp_path.iterdir())
    graph = call_graph(files)
    assert graph == {"dlsym": ["driver"], "driver": ["dlsym", "stats"], "stats": ["driver"]}
    assert circles(graph) == [["dlsym", "driver", "stats"]]
    assert upward_calls(graph) == ["stats (base) calls driver (hooks)"]
