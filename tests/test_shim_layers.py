"""The shim reads in layers, a folder each: a lower layer never includes a higher one's header.

From the bottom (shim/base, lookup, channel, engine, policy, hooks): base (the shared records,
configuration, logging, counters, which device a call is about), lookup (the range table, the
launch scan, parameter layouts, the device memory pump lets through: what a pointer is), channel
(records to and from pumpd: decides nothing), engine (the driver calls that move memory: no
policy), policy (what moves and when: residency, budget, capacity, managed_all), hooks (the entry
points, which orchestrate). A file's layer is its folder. A lower file reaches a higher one only
through a callback the higher one hands it (ranges.h's observer, layouts.h's announcer), never by
name: with warnings as errors, a call needs the header, so reading the #include lines is enough.

Headers alone miss a circle between files that share one header (shim.h declares what
config.c, log.c, stats.c and driver.c define) or that declare each other's functions
themselves: so the calls are read too, by which file defines each pump_ function a file
names, and neither they nor such declarations may form a circle or reach up a layer. A file
also reaches another through a pump_ global the other defines (the driver table, each device's
residency state) or a static inline function in the other's header: those count as calls.
"""
import pathlib
import re

import pytest

SHIM = pathlib.Path(__file__).resolve().parent.parent / "shim"
LAYERS = ["base", "lookup", "channel", "engine", "policy", "hooks"]
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)


def shim_files(root=SHIM):
    """Every C file and header of the shim, in whatever folder it is."""
    return sorted(p for p in root.rglob("*") if p.suffix in (".c", ".h"))


def layer_ranks(files):
    """Each file's name -> its layer's rank (its folder's), None for a folder that is no layer."""
    return {p.name: LAYERS.index(p.parent.name) if p.parent.name in LAYERS else None for p in files}


RANK = layer_ranks(shim_files())


def includes(path, ranks=None):
    """The shim headers path includes (system and CUDA headers are not the shim's)."""
    ranks = RANK if ranks is None else ranks
    return [name for name in INCLUDE.findall(path.read_text()) if name in ranks]


def layer_of(stem, ranks=None):
    """The layer of a file by its stem (its .c and .h are in one folder)."""
    ranks = RANK if ranks is None else ranks
    found = {rank for name, rank in ranks.items() if name.rsplit(".", 1)[0] == stem}
    return found.pop() if len(found) == 1 else None


def test_every_shim_file_is_in_a_layer_folder():
    files = shim_files()
    assert [p.relative_to(SHIM).as_posix() for p in files if p.parent.name not in LAYERS] == []
    assert sorted(p.name for p in SHIM.iterdir() if p.is_file()) == ["exports.map"]  # the linker's, no source
    names = [p.name for p in files]
    assert sorted(n for n in set(names) if names.count(n) > 1) == []  # one header a name, whatever its folder
    split = sorted({p.stem for p in files if layer_of(p.stem) is None})
    assert split == [], f"a .c and its .h in two layers' folders: {split}"


def upward_includes(files, ranks=None):
    ranks = RANK if ranks is None else ranks
    bad = []
    for path in files:
        own = ranks.get(path.name)
        for name in includes(path, ranks):
            theirs = ranks[name]
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


def test_the_check_sees_a_file_in_the_wrong_layers_folder(tmp_path):
    """The circle the shim once had, the range table calling residency, seen by folder: and the
    range table moved up into policy's folder is no longer below residency."""
    for folder, name, text in [("lookup", "ranges.c", '#include "ranges.h"\n#include "residency.h"\n'),
                               ("lookup", "ranges.h", ""), ("policy", "residency.h", "")]:
        (tmp_path / folder).mkdir(exist_ok=True)
        (tmp_path / folder / name).write_text(text)
    files = shim_files(tmp_path)
    ranks = layer_ranks(files)
    assert upward_includes(files, ranks) == ["ranges.c (lookup) includes residency.h (policy)"]
    (tmp_path / "lookup" / "ranges.c").rename(tmp_path / "policy" / "ranges.c")
    (tmp_path / "lookup" / "ranges.h").rename(tmp_path / "policy" / "ranges.h")
    files = shim_files(tmp_path)
    assert upward_includes(files, layer_ranks(files)) == []


COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.DOTALL)
STRING = re.compile(r'"(?:\\.|[^"\\\n])*"')
# A function defined at file scope, not static: `... pump_name(...) {`.
DEFINITION = re.compile(r"^(?!static\b|typedef\b|extern\b)[A-Za-z_][\w \t*]*?\b(pump_\w+)\s*\([^;{]*?\)\s*\{",
                        re.MULTILINE | re.DOTALL)
# A variable defined at file scope, not static: `... pump_name[...];` or `... pump_name = ...;`.
GLOBAL = re.compile(r"^(?!static\b|typedef\b|extern\b|#)[A-Za-z_][\w \t*]*?\b(pump_\w+)\s*(?:\[[^\]]*\])?\s*(?:=|;)",
                    re.MULTILINE)
# A static inline function defined in a header: `static inline ... pump_name(...) {`.
INLINE = re.compile(r"^static\s+inline\b[\w \t*]*?\b(pump_\w+)\s*\([^;{]*?\)\s*\{", re.MULTILINE | re.DOTALL)
# A function declared at file scope: `... pump_name(...);` (a prototype).
PROTOTYPE = re.compile(r"^(?!static\b|typedef\b|#)[A-Za-z_][\w \t*]*?\b(pump_\w+)\s*\([^;{)]*\)\s*;", re.MULTILINE)


def code_of(path):
    return STRING.sub('""', COMMENT.sub(" ", path.read_text()))


def call_graph(files):
    """Each .c file's stem -> the stems of the other files whose pump_ functions or globals it names
    (a header's static inline functions are its stem's)."""
    sources = [p for p in files if p.suffix == ".c"]
    defined_in = {}
    for path in files:
        code = code_of(path)
        found = DEFINITION.findall(code) + GLOBAL.findall(code) if path.suffix == ".c" else INLINE.findall(code)
        for name in found:
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


def test_the_call_check_sees_globals_and_static_inlines(tmp_path):
    """The circle residency_blocks.c and residency_rank.c had until the device state moved to
    residency_state.c: the blocks called the rank's functions, and the rank read the blocks'
    per-device array and a static inline of their header."""
    (tmp_path / "residency_blocks.h").write_text(
        "static inline bool pump_block_protected(int b)\n{\n    return b != 0;\n}\n")
    (tmp_path / "residency_blocks.c").write_text(
        "PUMP_HIDDEN struct pump_device_state pump_devices[PUMP_DEVICES_MAX];\n"
        "void pump_blocks_leave(void) { pump_rank_leave(0); }\n")
    (tmp_path / "residency_rank.c").write_text(
        "void pump_rank_leave(int b)\n{\n    if (!pump_block_protected(b)) pump_devices[0].x = 0;\n}\n")
    graph = call_graph(sorted(tmp_path.iterdir()))
    assert graph == {"residency_blocks": ["residency_rank"], "residency_rank": ["residency_blocks"]}
    assert circles(graph) == [["residency_blocks", "residency_rank"]]
