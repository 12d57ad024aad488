"""operator_uses.py: what each launch of a real PyTorch program touches, from PyTorch's own view
of each operator's tensors (issue 41 item 4), recorded for fakecuda's FAKECUDA_LAUNCH_USES.

PyTorch's kernels have no body on fakecuda, so they touch nothing and a real client's faults
and bytes would mean nothing. A recording run runs the program under Recorder, a
TorchDispatchMode (autograd's engine thread inherits it, so backward is seen on its own
thread), with FAKECUDA_LAUNCH_LOG set. For each aten operator it reads fakecuda's launch
position on its thread before and after the call: the launches between are the operator's.
Each is given the operator's operands, from its schema (pump/tracegen/operands.py, as the meta
recorder reads them): every tensor argument read (unless the operator only overwrites it),
every argument the schema marks written, every result written; each as the byte span from its
first element to its last in its storage. write() then joins them with the launch log (each
launch's kernel name and the pointers in its arguments) into the file a later run of the same
program, in the same configuration, gives fakecuda; the recording's Python cost stays out of
that run. Addresses differ between runs, so an operand is written as where the launch's own
argument points (the argument word whose value lies inside it, and the operand's start from
that value): a caching allocator may hand a tensor another cached block in the later run, and
the kernel is given that block. An operand no argument points into (an operator's tensor this
kernel of it is not given) is written as fakecuda's allocation and offset: the order
allocations are made in does not change between runs.

What this over- and understates:
- An operator of several kernels (layer norm's backward, SDPA, a cuBLAS GEMM with a split-K
  reduction) charges a tensor to the kernels whose arguments point into it, and a tensor none
  of them points into to every one of them: over (a kernel reaching a tensor through a pointer
  kept in memory, such as a batched GEMM's pointer arrays, leaves it to all of them).
- A _foreach_ or fused optimizer operator whose multi_tensor_apply launches (by their kernels'
  names) number what operands.foreach_launches models (with the build's limits, read from the
  slots fakecuda found in its tensor lists: torch 2.14's CUDA 13 builds' 32 KB of arguments hold
  2240 chunks a launch, 2.11's 4 KB 320) gives each its own chunks, and its other
  launches (_foreach_norm's reduction, a fill) its results only; otherwise each launch gets every
  parameter, which alone can exceed a 50% budget: over (counted, ``foreach_unsplit``).
- A strided tensor counts from its first element to its last, gaps included: over.
- Workspaces PyTorch's libraries take from the caching allocator (cuBLAS, cuDNN) and memory
  not held by a tensor are not seen: under. Launches outside any operator get no line
  (fakecuda counts them as launch_uses_missing).
- A captured launch's operands are not kept: a CUDA graph's replay touches nothing.
- An operand named by allocation (no argument word points into it, or several do) is touched
  where the recording's allocator put it: where the later run's allocator placed that tensor in
  another block, the replay touches a block the kernel was not given."""
import ctypes
import json
import pathlib
import re
import sys

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
from pump.tracegen.operands import (LIMITS_4KB, LIMITS_32KB, foreach_launches, reads_mutated,  # noqa: E402
                                    schema_operands, storage_extent, tensor_inputs)

MULTI_TENSOR = ("_foreach_", "_fused_")
MULTI_TENSOR_KERNEL = "multi_tensor_apply_kernel"  # in the mangled name of each of its launches
REPEAT_SPAN = 64  # bytes between two argument words that hold one pointer passed twice (_operand)
# multi_tensor_apply's metadata type (its first argument, addresses[depth][max tensors] first) and
# depth, in the kernel's mangled name
METADATA = re.compile(r"TensorList(ScalarList)?MetadataI[a-z]?Li(\d+)E")
# multi_tensor_apply's limits per launch are the build's header's, not its CUDA's: torch 2.11 keeps
# to 4 KB of kernel arguments on CUDA 13 too, 2.14 takes 32 KB there (limits_of reads which)
BUILDS = (LIMITS_4KB, LIMITS_32KB)


def limits_of(entries):
    """The limits of the build that made the launch log's entries: those whose slots per list
    fakecuda read in a tensor-list launch ("tensor_list", fakecuda/tensor_lists.c); the 4 KB ones
    when no launch had one (no foreach operator to model)."""
    for listed in (entry["tensor_list"] for entry in entries if "tensor_list" in entry):
        for limits in BUILDS:
            _, tensors, scalar_list = limits
            if listed["tensors"] in (tensors[listed["depth"] - 1], scalar_list[listed["depth"] - 1]):
                return limits
    return LIMITS_4KB


def _on_cuda(t) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == "cuda"


class Recorder(TorchDispatchMode):
    """Records each aten operator's launches and their operands (see the module's docstring)."""

    def __init__(self, driver=None):
        super().__init__()
        self.lib = driver or ctypes.CDLL("libcuda.so.1")
        self.lib.fakecuda_allocation_of.argtypes = [ctypes.c_void_p] + [ctypes.POINTER(ctypes.c_uint64)] * 3
        # Per operator that launched: (thread, first launch, launch after the last, its operands,
        # multi_tensor_apply's launches' operands under each build's limits or None, its results'
        # operands).
        self.operators = []
        self.order = []           # [thread, launch] of every launch recorded, in the order operators ran
        self.step_starts = []     # len(order) at each mark_step()
        self.sizes = {}           # allocation ordinal -> its size, of those operands lie in
        self.bases = {}           # allocation ordinal -> its address in this run
        self.unplaced_bytes = 0   # operand bytes no allocation of fakecuda's holds

    def mark_step(self):
        """The program's step begins here (between operators)."""
        self.step_starts.append(len(self.order))

    def position(self):
        thread, launches = ctypes.c_int(), ctypes.c_uint64()
        self.lib.fakecuda_launch_position(ctypes.byref(thread), ctypes.byref(launches))
        return thread.value, launches.value

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        thread, before = self.position()
        out = func(*args, **kwargs)
        now, after = self.position()
        first = before if thread == now else 0  # -1 before: this call made the thread's first launch
        if now < 0 or after == first or func.namespace != "aten":
            return out
        operands = schema_operands(func, args, kwargs)
        inputs = tensor_inputs(operands, _on_cuda)
        results = [t for t in pytree.tree_leaves(out) if _on_cuda(t)]
        read_mutated = reads_mutated(func)
        written = [(t, 0, None, False, True) for t in results]
        whole = [(t, 0, None, not m or read_mutated, m) for t, m in inputs] + written
        modelled = None
        if func.overloadpacket.__name__.startswith(MULTI_TENSOR):
            new = [t for t in results if not any(t is i for i, _ in inputs)]
            modelled = {limits: [self._operands(uses)
                                 for uses in foreach_launches(operands, new, read_mutated, _on_cuda, limits)]
                        for limits in BUILDS}
        self.operators.append((now, first, after, self._operands(whole), modelled, self._operands(written)))
        self.order += [[now, launch] for launch in range(first, after)]
        return out

    def per_launch(self, names, pointers, limits=LIMITS_4KB):
        """{(thread, launch): operands} given each launch's kernel name and argument pointers
        ({(thread, launch): [(word, value), ...]}) and the build's limits, and the multi-tensor
        operators whose multi_tensor_apply launches did not number the model's."""
        out, unsplit = {}, 0
        for thread, first, after, whole, models, results in self.operators:
            launches = range(first, after)
            given = self._by_pointer(whole, [pointers.get((thread, launch), ()) for launch in launches])
            modelled = None if models is None else models[limits]
            if modelled is not None:
                applied = [i for i, launch in enumerate(launches)
                           if MULTI_TENSOR_KERNEL in names.get((thread, launch), "")]
                if len(applied) == len(modelled):   # the others: a reduction's or a fill's
                    given = [results] * len(launches)
                    for i, operands in zip(applied, modelled):
                        given[i] = operands
                else:
                    unsplit += 1
            out.update(((thread, launch), operands) for launch, operands in zip(launches, given))
        return out, unsplit

    def _by_pointer(self, operands, pointers):
        """Per launch of an operator (pointers: each one's argument words), the operands its
        arguments point into and those no launch of the operator points into: a GEMM's inputs
        to its GEMM kernel, not to the split-K reduction after it, which is given a workspace
        and the output."""
        given = [[] for _ in pointers]
        for operand in operands:
            ordinal, offset, nbytes, _ = operand
            start = self.bases[ordinal] + offset
            into = [i for i, words in enumerate(pointers) if any(start <= value < start + nbytes for _, value in words)]
            for i in into or range(len(pointers)):
                given[i].append(operand)
        return [tuple(g) for g in given]

    def _operands(self, uses):
        """((ordinal, offset, bytes, mode), ...) of (tensor, first, stop, read, written) uses,
        split where a span crosses from one allocation into the next, merged where equal."""
        merged = {}
        for t, first, stop, read, written in uses:
            extent = storage_extent(t, first, stop)
            if extent is None:
                continue
            start = t.untyped_storage().data_ptr() + extent[0]
            for piece in self._pieces(start, extent[1]):
                modes = merged.setdefault(piece, [False, False])
                modes[0] |= read
                modes[1] |= written
        return tuple((*piece, ("r" if r else "") + ("w" if w else "")) for piece, (r, w) in merged.items())

    def _pieces(self, address: int, nbytes: int):
        """(ordinal, offset, bytes) of [address, address + nbytes), one per allocation it spans."""
        ordinal, offset, size = ctypes.c_uint64(), ctypes.c_uint64(), ctypes.c_uint64()
        while nbytes > 0:
            if not self.lib.fakecuda_allocation_of(address, ctypes.byref(ordinal), ctypes.byref(offset),
                                                   ctypes.byref(size)):
                self.unplaced_bytes += nbytes
                return
            self.sizes[ordinal.value] = size.value
            self.bases[ordinal.value] = address - offset.value
            take = min(nbytes, size.value - offset.value)
            yield ordinal.value, offset.value, take
            address, nbytes = address + take, nbytes - take

    def write(self, path, launch_log) -> dict:
        """Writes the FAKECUDA_LAUNCH_USES file for the launches recorded, named from
        ``launch_log`` (FAKECUDA_LAUNCH_LOG's lines), and beside it PATH.order.json: the
        launches in the order their operators ran, [thread, launch] each, where each step
        began in that order, each written launch's operands by allocation ([thread, launch,
        [[ordinal, offset, bytes, mode], ...]]) and the sizes of the allocations named (what a
        bound on the program's traffic needs: bench/real_client_budget.py). Returns what it
        wrote and left out."""
        names, pointers, pointer_params = {}, {}, {}
        entries = [json.loads(line) for line in pathlib.Path(launch_log).read_text().splitlines()]
        limits = limits_of(entries)
        for entry in entries:
            at = (entry["thread"], entry["launch"])
            names[at] = entry["kernel"]
            pointers[at] = [(word, value) for _, word, value, *_ in entry["pointers"]]
            pointer_params[at] = frozenset(offset for offset, size in entry["params"] if size == 8)
        launches, unsplit = self.per_launch(names, pointers, limits)
        written = unnamed = by_argument = operands = 0
        by_allocation = []
        with open(path, "w") as f:
            f.write("fakecuda-launch-uses 1\n")
            for (thread, launch), uses in sorted(launches.items()):
                name = names.get((thread, launch))
                if not name or any(c.isspace() for c in name):
                    unnamed += 1   # not an image kernel's launch (the log has image kernels only)
                    continue
                words = pointers[(thread, launch)]
                slots = metadata_slots(name, words, limits)
                named = [self._operand(use, words, slots, pointer_params[(thread, launch)]) for use in uses]
                by_argument += sum(o.startswith("@") for o in named)
                operands += len(named)
                f.write(f"{thread} {launch} {name} {len(named)}")
                f.writelines(f" {o}" for o in named)
                f.write("\n")
                by_allocation.append([thread, launch, [list(use) for use in uses]])
                written += 1
        pathlib.Path(f"{path}.order.json").write_text(json.dumps(
            {"order": self.order, "step_starts": self.step_starts, "operands": by_allocation,
             "sizes": {str(o): n for o, n in self.sizes.items()}}))
        return {"launches_recorded": len(launches), "launches_written": written, "unnamed": unnamed,
                "foreach_unsplit": unsplit, "unplaced_bytes": self.unplaced_bytes, "launches_logged": len(names),
                "operands": operands, "operands_by_argument": by_argument}

    def _operand(self, use, pointers, slots=frozenset(), pointer_params=frozenset()) -> str:
        """One operand of the file: @WORD:DELTA:BYTES:MODE from the one argument word pointing into
        it, else ORDINAL:OFFSET:BYTES:MODE. Where several words do, the operand is named by its
        allocation: a struct's unused slots (multi_tensor_apply's metadata past its last tensor)
        keep what an earlier launch left there, which the later run's need not repeat. Two
        exceptions, where the words are the kernel's own: one pointer passed several times
        close together (a cuBLAS GEMM is given its output as C and D, words 16 and 48; its
        split-K reduction in words 72, 80 and 88): the same value in words at most REPEAT_SPAN
        bytes apart, followed from the first; and views of one tensor (attention's q, k and v
        inside one projection's output), whose extents each hold the others' pointers: the
        one word whose value is the operand's start. Among several, the words trusted are,
        in turn: those that are a whole 8-byte parameter (``pointer_params``: a pointer the
        kernel takes itself, as cat's output, whose by-value metadata struct after it keeps
        earlier launches' pointers, this one among them), holding one value; the one at the
        operand's start; a multi_tensor_apply launch's own address slots (``slots``:
        metadata_slots; the first, where one tensor is in two of its lists: addcmul_'s grad
        and grad)."""
        ordinal, offset, nbytes, mode = use
        start = self.bases[ordinal] + offset
        inside = sorted((word, value) for word, value in pointers if start <= value < start + nbytes)
        repeated = len({value for _, value in inside}) == 1 and all(
            b - a <= REPEAT_SPAN for (a, _), (b, _) in zip(inside, inside[1:]))
        taken = [(word, value) for word, value in inside if word in pointer_params]
        at_start = [(word, value) for word, value in inside if value == start]
        own = [(word, value) for word, value in inside if word in slots]
        if len(inside) > 1 and not repeated:
            inside = (taken if len({v for _, v in taken}) == 1 else at_start if len(at_start) == 1
                      else own if len({v for _, v in own}) == 1 else [])
        if not inside:
            return f"{ordinal}:{offset}:{nbytes}:{mode}"
        word, value = inside[0]
        return f"@{word}:{start - value}:{nbytes}:{mode}"


def metadata_slots(kernel, pointers, limits) -> frozenset:
    """The argument words that hold a multi_tensor_apply launch's own tensor addresses: its
    metadata (the kernel's first argument) begins with addresses[depth][N], N the build's most
    tensors a launch at that depth (``limits``: operands.LIMITS_*), and the launch fills the
    first n slots of each list; the slots past them keep what an earlier launch left on the
    stack, pointers too, which can continue a list's run: n is the shortest run of pointer words
    from a list's first slot. Empty for another kernel."""
    match = METADATA.search(kernel)
    if not match or MULTI_TENSOR_KERNEL not in kernel:
        return frozenset()
    depth = int(match.group(2))
    _, tensors, scalar_list = limits
    table = scalar_list if match.group(1) else tensors
    most = table[min(depth, len(table)) - 1]
    words = {word for word, _ in pointers}

    def run(first):
        n = 0
        while n < most and first + n * 8 in words:
            n += 1
        return n

    n = min(run(d * most * 8) for d in range(depth))
    return frozenset((d * most + j) * 8 for d in range(depth) for j in range(n))
