"""What an aten operator's kernels read and write, from its schema: the tensors of its
arguments and results, each read, written or both, and for a _foreach_ operator which of them
each of CUDA's multi_tensor_apply launches takes.  Shared by the meta-device recorder
(record.py, which places storages itself) and the real client's (tests/real_client/
operator_uses.py, which reads PyTorch's own addresses); it imports torch and nothing of pump's
that needs more than the standard library, so that a job's interpreter can load it alone.
"""
from torch.utils import _pytree as pytree

ALLOCATION_ONLY = {"empty", "empty_like", "empty_strided", "empty_permuted", "new_empty", "new_empty_strided"}
# In-place operators that overwrite their mutated argument without reading it.
WRITE_ONLY = {"zero_", "fill_", "copy_", "normal_", "uniform_", "bernoulli_", "random_", "exponential_",
              "_foreach_zero_", "_foreach_copy_"}
# multi_tensor_apply (ATen/native/cuda/MultiTensorApply.cuh): per launch, at most this
# many tensors (by the number of tensor lists, 1..5) and 320 blocks of 65536 elements, in a
# build whose kernel arguments are limited to 4 KB (before CUDA 13).
FOREACH_CHUNK = 65536
FOREACH_MAX_BLOCKS = 320
FOREACH_MAX_TENSORS = (110, 64, 48, 36, 30)
FOREACH_MAX_TENSORS_SCALAR_LIST = (96, 64, 48, 36, 30)
# The same in a CUDA 13 build of torch 2.14 and later (its header: CUDART_VERSION >= 13000, 32 KB
# of kernel arguments; pytorch/pytorch#134373): 2240 blocks a launch. torch 2.11 keeps the 4 KB
# limits on CUDA 13 too.
LIMITS_4KB = (FOREACH_MAX_BLOCKS, FOREACH_MAX_TENSORS, FOREACH_MAX_TENSORS_SCALAR_LIST)
LIMITS_32KB = (2240, (770, 448, 336, 252, 210), (672, 448, 336, 252, 210))


def schema_operands(func, args, kwargs):
    """[(argument value, schema argument)] of one call of ``func``."""
    return [(args[i] if i < len(args) else kwargs.get(arg.name), arg) for i, arg in enumerate(func._schema.arguments)]


def tensor_inputs(operands, on_device):
    """[(tensor, mutated)]: every tensor among the arguments for which ``on_device`` holds, and
    whether the schema marks its argument written."""
    return [(t, arg.alias_info is not None and arg.alias_info.is_write)
            for value, arg in operands for t in pytree.tree_leaves(value) if on_device(t)]


def reads_mutated(func) -> bool:
    """Whether ``func`` reads the arguments it mutates (not if it only overwrites them)."""
    return func.overloadpacket.__name__ not in WRITE_ONLY


def foreach_launches(operands, new, read_mutated: bool, on_device, limits=LIMITS_4KB):
    """A _foreach_ operator's launches, as multi_tensor_apply makes them: per launch, a list of
    (tensor, first element, element after the last or None for all of it, read, written).
    ``new``: the operator's new result tensors (one more list, written); ``limits``: the build's
    (LIMITS_4KB or LIMITS_32KB)."""
    max_blocks, max_tensors_table, scalar_list_table = limits
    lists, single = [], []   # (tensors, read, written); tensors read by every launch
    scalar_list = False
    for value, arg in operands:
        kind = str(arg.type)
        written = arg.alias_info is not None and arg.alias_info.is_write
        if kind.startswith("List[Tensor]") or kind == "Tensor[]":
            if value and on_device(value[0]):
                lists.append((value, not written or read_mutated, written))
        elif on_device(value):
            single.append(value)
        scalar_list |= kind in ("List[number]", "Scalar[]")
    if new:
        lists.append((new, False, True))
    if not lists:
        return []
    table = scalar_list_table if scalar_list else max_tensors_table
    max_tensors = table[min(len(lists), len(table)) - 1]
    shared = [(t, 0, None, True, False) for t in single]
    launches = []
    for launch in multi_tensor_chunks([t.numel() for t in lists[0][0]], max_tensors, max_blocks):
        uses = list(shared)
        for index, first, stop in launch:
            for tensors, read, written in lists:
                t = tensors[index]
                if t.is_contiguous():
                    uses.append((t, first * FOREACH_CHUNK, min(stop * FOREACH_CHUNK, t.numel()), read, written))
                else:
                    uses.append((t, 0, None, read, written))
        launches.append(uses)
    return launches


def storage_extent(t, first: int = 0, stop=None):
    """(byte offset in its storage, bytes) of elements [first, stop) of ``t`` (all of it by
    default: a strided tensor's span from its first element to its last), or None if empty."""
    if t.numel() == 0:
        return None
    size = t.element_size()
    if stop is None:
        span = 1 + sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride()))
        return t.storage_offset() * size, span * size
    return (t.storage_offset() + first) * size, (stop - first) * size


def multi_tensor_chunks(numels, max_tensors: int, max_blocks: int = FOREACH_MAX_BLOCKS):
    """multi_tensor_apply's launches over tensors of ``numels`` elements: per launch, a list
    of (tensor index, first chunk, chunk after the last)."""
    nonempty = [i for i, n in enumerate(numels) if n]
    launches, pending, blocks = [], [], 0
    for i in nonempty:
        chunks = -(-numels[i] // FOREACH_CHUNK)
        pending.append([i, 0, 0])
        for chunk in range(chunks):
            pending[-1][2] = chunk + 1
            blocks += 1
            tensor_done = chunk == chunks - 1
            if (len(pending) == max_tensors and tensor_done) or blocks == max_blocks or \
                    (i == nonempty[-1] and tensor_done):
                launches.append([tuple(p) for p in pending])
                blocks = 0
                pending = [] if tensor_done else [[i, chunk + 1, chunk + 1]]
    return launches
