"""Reading a measured profile into operator invocations, each with the GPU time of the kernels
it launched: PyTorch's profiler trace (Kineto's Chrome-trace JSON, gzipped or not) or an Nsight
Systems SQLite export.  Both link a kernel to its launch by the CUDA correlation id, and the
launch to the innermost operator around it on the same thread (an operator's kernels are its
own and those of the operators inside it); a Kineto kernel whose `External id` differs from its
correlation names its operator directly, as newer PyTorch writes it.  Only kernels count: a
memcpy or memset is not a launch in a pump trace.
"""

import ast
import bisect
import dataclasses
import gzip
import json
import math
import re
import sqlite3

# Kineto's "Input type" spellings, in bytes per element.
ELEMENT_BYTES = {"float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "long int": 8, "long": 8,
                 "int": 4, "short int": 2, "bool": 1, "unsigned char": 1, "signed char": 1,
                 "c10::complex<float>": 8, "c10::complex<double>": 16}
# NVTX ranges carry shapes without types, and Kineto a TensorList's without its dtype: the
# traces pump generates are fp32.
NVTX_ELEMENT_BYTES = 4
# PyTorch's elementwise kernels (ATen/native/cuda/CUDALoops.cuh) cover a fixed number of
# elements per block, so a grid tells how many elements a launch processed (rounded up to a
# block): elementwise_kernel<NT, VT> takes NT * VT per block; vectorized_ and
# unrolled_elementwise_kernel take thread_work_size() = 4 per thread of the block.
ELEMENTWISE = re.compile(r"\b(?:at::native::)?(?:elementwise_kernel<(\d+), (\d+)|"
                         r"(vectorized|unrolled)_elementwise_kernel<)")
ELEMENTS_PER_THREAD = 4


class ProfileError(ValueError):
    """A profile that cannot be read; str() names the file and what is wrong."""


@dataclasses.dataclass
class Invocation:
    name: str               # the operator as aten names it, without namespace or overload: "addmm"
    input_bytes: int        # of its tensor inputs (record_shapes); None where not recorded
    kernel_ns: float        # the GPU time of its kernels (its own and its operators')
    kernels: int
    elements: int = None    # elements its kernels processed, if all are PyTorch's elementwise ones (grids)


@dataclasses.dataclass
class Profile:
    path: str
    device: str             # the GPU, as the profile names it ("" if it does not)
    invocations: list       # Invocation per operator that launched a kernel
    kernels: int            # in the profile
    linked: int             # of those, attributed to an operator


def op_name(name: str) -> str:
    """'aten::addmm' and 'aten.addmm.default' alike as 'addmm'."""
    if "::" in name:
        return name.split("::", 1)[1]
    parts = name.split(".")
    return parts[1] if len(parts) == 3 else parts[-1]


def _bytes(dims, types) -> int:
    """Input bytes from record_shapes' dims and types (types None: NVTX's fp32); None if unknown."""
    total = 0
    for i, d in enumerate(dims):
        kind = types[i] if types else "float"
        # A scalar (NVTX shows it as [], untyped) is no tensor.
        if kind in ("Scalar", "", "ScalarList", "GenericList", "None") or d == [] and (not types or kind not in ELEMENT_BYTES):
            continue
        if kind == "TensorList" and all(isinstance(t, list) for t in d):    # its dtype unrecorded: fp32
            total += sum(math.prod(t) for t in d) * NVTX_ELEMENT_BYTES
            continue
        if not isinstance(d, list) or not all(isinstance(n, int) for n in d) or kind not in ELEMENT_BYTES:
            return None
        total += math.prod(d) * (ELEMENT_BYTES[kind] if types else NVTX_ELEMENT_BYTES)
    return total


def kernel_elements(name: str, grid, block):
    """The elements a PyTorch elementwise kernel's launch covers (its grid's blocks, each of a fixed
    number of elements), or None for any other kernel or an unrecorded grid."""
    m = ELEMENTWISE.search(name or "")
    if not m or not isinstance(grid, list) or not isinstance(block, list) or len(grid) != 3 or len(block) != 3:
        return None
    if grid[1:] != [1, 1] or not all(isinstance(n, int) and n > 0 for n in (*grid, *block)):
        return None
    per_block = int(m.group(1)) * int(m.group(2)) if m.group(1) else block[0] * ELEMENTS_PER_THREAD
    return grid[0] * per_block


def attribute(path, device, ops, launches, kernels, direct=None) -> Profile:
    """ops: [(thread, start, end, name, input_bytes)]; launches: {correlation: (thread, time)};
    kernels: [(correlation, external id, duration ns[, elements or None])]; direct: {external id: op index}."""
    parent, by_thread = [None] * len(ops), {}
    for i in sorted(range(len(ops)), key=lambda i: (ops[i][0], ops[i][1], -ops[i][2])):
        by_thread.setdefault(ops[i][0], []).append(i)
    for thread, order in by_thread.items():
        stack = []
        for i in order:
            while stack and ops[stack[-1]][2] < ops[i][1]:
                stack.pop()
            parent[i] = stack[-1] if stack else None
            stack.append(i)
    starts = {t: [ops[i][1] for i in order] for t, order in by_thread.items()}
    kernel_ns, count, elements = [0.0] * len(ops), [0] * len(ops), [0] * len(ops)
    linked = 0
    for correlation, external, duration, *covered in kernels:
        op = direct.get(external) if direct and external != correlation else None
        if op is None and correlation in launches:
            thread, time = launches[correlation]
            # The last op begun by then, else the innermost of its enclosing ops still open.
            j = bisect.bisect_right(starts.get(thread, []), time) - 1
            op = by_thread[thread][j] if j >= 0 else None
            while op is not None and ops[op][2] < time:
                op = parent[op]
        if op is None:
            continue
        linked += 1
        covered = covered[0] if covered else None
        while op is not None:
            kernel_ns[op] += duration
            count[op] += 1
            elements[op] = None if covered is None or elements[op] is None else elements[op] + covered
            op = parent[op]
    invocations = [Invocation(op_name(ops[i][3]), ops[i][4], kernel_ns[i], count[i], elements[i])
                   for i in range(len(ops)) if count[i]]
    return Profile(path, device, invocations, len(kernels), linked)


def read_kineto(path) -> Profile:
    try:
        with open(path, "rb") as f:
            raw = f.read()
        doc = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
        events = doc["traceEvents"]
    except (OSError, ValueError, KeyError, TypeError, EOFError) as exc:
        raise ProfileError(f"{path}: not a PyTorch profiler trace (Chrome-trace JSON with traceEvents, "
                           f"gzipped or not): {exc}") from None
    ops, launches, kernels, direct = [], {}, [], {}
    for e in events:
        cat, args = e.get("cat"), e.get("args") or {}
        if e.get("ph") != "X" or "ts" not in e:
            continue
        thread, start = (e.get("pid"), e.get("tid")), float(e["ts"])
        if cat == "cpu_op":
            direct[args.get("External id")] = len(ops)
            dims = args.get("Input Dims")
            ops.append((thread, start, start + float(e.get("dur", 0)), e["name"],
                        _bytes(dims, args.get("Input type") or []) if dims is not None else None))
        elif cat in ("cuda_runtime", "cuda_driver") and "correlation" in args:
            launches[args["correlation"]] = (thread, start)
        elif cat == "kernel":
            kernels.append((args.get("correlation"), args.get("External id"), float(e.get("dur", 0)) * 1e3,
                            kernel_elements(e.get("name"), args.get("grid"), args.get("block"))))
    devices = doc.get("deviceProperties") or [{}]
    return attribute(path, devices[0].get("name", ""), ops, launches, kernels, direct)


NVTX_SIZES = re.compile(r"sizes = (\[.*?\]\])")


def read_nsys(path) -> Profile:
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        strings = dict(db.execute("SELECT id, value FROM StringIds"))
        kernels = [(c, None, float(end - start)) for c, start, end in
                   db.execute("SELECT correlationId, start, end FROM CUPTI_ACTIVITY_KIND_KERNEL")]
        launches = {c: (tid, start) for c, tid, start in
                    db.execute("SELECT correlationId, globalTid, start FROM CUPTI_ACTIVITY_KIND_RUNTIME")}
        ranges = db.execute("SELECT globalTid, start, end, text, textId FROM NVTX_EVENTS "
                            "WHERE end IS NOT NULL").fetchall()
        has_gpus = db.execute("SELECT 1 FROM sqlite_master WHERE name = 'TARGET_INFO_GPU'").fetchone()
        gpus = db.execute("SELECT name FROM TARGET_INFO_GPU ORDER BY id").fetchall() if has_gpus else []
        db.close()
    except sqlite3.Error as exc:
        raise ProfileError(f"{path}: not an Nsight Systems SQLite export (nsys export --type sqlite) with "
                           f"CUPTI_ACTIVITY_KIND_KERNEL, CUPTI_ACTIVITY_KIND_RUNTIME and NVTX_EVENTS: {exc}") from None
    ops = []
    for tid, start, end, text, text_id in ranges:
        text = text if text is not None else strings.get(text_id, "")
        sizes = NVTX_SIZES.search(text)   # torch.autograd.profiler.emit_nvtx(record_shapes=True)
        try:
            dims = ast.literal_eval(sizes.group(1)) if sizes else None
        except (ValueError, SyntaxError):
            dims = None
        ops.append((tid, start, end, text.split(",", 1)[0], _bytes(dims, None) if dims is not None else None))
    return attribute(path, gpus[0][0] if gpus else "", ops, launches, kernels)


def read(path) -> Profile:
    """The profile at ``path``, by its first bytes: SQLite, else JSON (gzipped or not)."""
    try:
        with open(path, "rb") as f:
            magic = f.read(16)
    except OSError as exc:
        raise ProfileError(f"{path}: cannot read: {exc.strerror}") from None
    return read_nsys(path) if magic.startswith(b"SQLite format 3") else read_kineto(path)
