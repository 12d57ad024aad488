"""How the real-client recorder names an operand for fakecuda's replay (tests/real_client/
operator_uses.py, fakecuda/launch_uses.c): by the one argument word of the launch that
points into it, so that a later run follows the pointer its launch is given, wherever its
caching allocator placed the tensor; by allocation where no word, or more than one that cannot
be told apart, does; and which of an operator's kernels each operand is charged to."""
import sys
import types

from test_real_client import ROOT

sys.path.insert(0, str(ROOT / "tests" / "real_client"))
from operator_uses import Recorder  # noqa: E402

MIB = 1 << 20


def recorder():
    r = Recorder(driver=types.SimpleNamespace(fakecuda_allocation_of=types.SimpleNamespace()))
    r.bases = {7: 0x7F0000000000, 8: 0x7F0000400000}  # allocations 7 and 8, as the recording run placed them
    return r


def test_an_operand_one_argument_points_into_follows_that_argument():
    r = recorder()
    # the launch's word 16 holds the tensor's first element, word 24 a pointer into allocation 8
    pointers = [(16, 0x7F0000000000 + 4096), (24, 0x7F0000400000)]
    assert r._operand((7, 4096, MIB, "r"), pointers) == f"@16:0:{MIB}:r"
    # a pointer 512 bytes into the operand: its start is 512 bytes before the pointer
    assert r._operand((7, 4096 - 512, MIB, "rw"), pointers) == f"@16:-512:{MIB}:rw"


def test_an_operand_no_argument_points_into_is_named_by_its_allocation():
    r = recorder()
    pointers = [(16, 0x7F0000000000 + 4096)]
    assert r._operand((8, 0, MIB, "w"), pointers) == f"8:0:{MIB}:w"
    # a pointer just past the operand's end is not into it
    assert r._operand((7, 0, 4096, "r"), pointers) == "7:0:4096:r"


def test_an_operand_two_arguments_point_into_is_named_by_its_allocation():
    """A struct's unused slots (multi_tensor_apply's metadata past its last tensor) keep an
    earlier launch's pointers, which a later run need not repeat: no word is trusted then."""
    r = recorder()
    pointers = [(16, 0x7F0000000000), (1232, 0x7F0000000000)]
    assert r._operand((7, 0, MIB, "r"), pointers) == f"7:0:{MIB}:r"


def test_an_operators_kernels_are_each_given_the_operands_their_arguments_point_into():
    """A cuBLAS GEMM with a split-K reduction: the GEMM kernel is given A and B, the reduction
    a workspace the recorder does not see and C. Each is charged what it points into; a tensor
    neither points into (reached through memory) stays with both."""
    r = recorder()
    r.bases[9] = 0x7F0000800000
    a, b, c = (7, 0, MIB, "r"), (8, 0, MIB, "r"), (9, 0, MIB, "w")
    hidden = (7, 2 * MIB, MIB, "r")
    r.operators = [(0, 10, 12, (a, b, c, hidden), None, (c,))]
    names = {(0, 10): "gemm", (0, 11): "splitKreduce"}
    pointers = {(0, 10): [(0, 0x7F0000000000), (8, 0x7F0000400000)], (0, 11): [(0, 0x7F0000800000 + 64)]}
    launches, unsplit = r.per_launch(names, pointers)
    assert unsplit == 0
    assert launches == {(0, 10): (a, b, hidden), (0, 11): (c, hidden)}
    # one kernel: every operand is its own, pointed into or not
    r.operators = [(0, 12, 13, (a, c), None, (c,))]
    assert r.per_launch({(0, 12): "gemm"}, {(0, 12): [(0, 0x7F0000000000)]})[0] == {(0, 12): (a, c)}


def test_one_pointer_passed_in_nearby_words_follows_the_first():
    """cuBLAS's split-K reduction is given its output in words 72, 80 and 88, a GEMM as C and D
    in words 16 and 48: one pointer passed several times, not a struct's stale slots, so the
    later run's first of them is followed."""
    r = recorder()
    out = 0x7F0000000000 + MIB
    pointers = [(64, 0x7F0000400000), (72, out), (80, out), (88, out)]
    assert r._operand((7, MIB, MIB, "w"), pointers) == f"@72:0:{MIB}:w"
    assert r._operand((7, MIB, MIB, "w"), [(48, out), (16, out)]) == f"@16:0:{MIB}:w"
    # the same value in words far apart (a struct's stale slot), or two values inside the
    # operand neither of which is its start: by allocation
    assert r._operand((7, MIB, MIB, "w"), [(72, out), (1232, out)]) == f"7:{MIB}:{MIB}:w"
    assert r._operand((7, MIB, MIB, "w"), [(72, out + 64), (80, out + 128)]) == f"7:{MIB}:{MIB}:w"


def test_views_of_one_tensor_follow_the_word_at_their_start():
    """Attention's q, k and v inside one projection's output: each view's extent holds the
    pointers of the views after it; each follows the word that points at its own start."""
    r = recorder()
    q, k = 0x7F0000000000, 0x7F0000000000 + 3072
    pointers = [(0, q), (8, k), (16, k + 3072)]
    assert r._operand((7, 0, 3 * MIB, "r"), pointers) == f"@0:0:{3 * MIB}:r"
    assert r._operand((7, 3072, 3 * MIB, "r"), pointers) == f"@8:0:{3 * MIB}:r"


def test_a_pointer_the_kernel_takes_itself_is_trusted_over_a_structs_slots():
    """cat's output (CatArrayBatchedCopy's first parameter, GPT-2 small's backward): the by-value
    metadata struct after it keeps earlier launches' pointers, this output's among them (words
    1784 and 2856 in the recording), so three words held its start and it was named by
    allocation, and the replay wrote it where the recording's allocator had put it. The word
    that is a whole 8-byte parameter is the kernel's own."""
    r = recorder()
    out = 0x7F0000000000
    pointers = [(0, out), (8, out + 2 * MIB), (1784, out), (2856, out)]
    assert r._operand((7, 0, MIB, "w"), pointers) == f"7:0:{MIB}:w"              # without the layout
    assert r._operand((7, 0, MIB, "w"), pointers, pointer_params=frozenset({0})) == f"@0:0:{MIB}:w"
    # two pointer parameters into one operand at other places: not told apart
    assert r._operand((7, 0, 4 * MIB, "w"), pointers, pointer_params=frozenset({0, 8})) == f"7:0:{4 * MIB}:w"


def test_a_multi_tensor_launch_trusts_its_own_address_slots():
    """A _foreach_ launch over 3 tensors at depth 2 (a build of 32 KB arguments: 448 slots a
    list): its slots are words 0..16 and 3584..3600. Stale slots elsewhere (word 1696, past the
    first list's tensors; word 23216) that hold the same pointers do not make them ambiguous."""
    from operator_uses import LIMITS_32KB, metadata_slots
    kernel = ("_ZN2at6native50_GLOBAL__N__637ba612_17_ForeachUnaryOp_cu_77fe623d25multi_tensor_apply_kernel"
              "INS1_18TensorListMetadataILi2EEENS1_14UnaryOpFunctorIfLi2ELi1ELi1EEEJNS0_4SqrtIfEEEEEvT_T0_DpT1_")
    t = [0x7F0000000000 + i * MIB for i in range(6)]
    pointers = [(0, t[0]), (8, t[1]), (16, t[2]), (24, t[4]), (1696, t[3]), (3584, t[3]), (3592, t[4]),
                (3600, t[5]), (23216, t[0])]
    # word 24: a stale slot right after the first list's tensors, continuing its run
    slots = metadata_slots(kernel, pointers, LIMITS_32KB)
    assert slots == {0, 8, 16, 3584, 3592, 3600}
    r = recorder()
    assert r._operand((7, 0, MIB, "r"), pointers, slots) == f"@0:0:{MIB}:r"
    assert r._operand((7, 3 * MIB, MIB, "w"), pointers, slots) == f"@3584:0:{MIB}:w"
    assert r._operand((7, 4 * MIB, MIB, "w"), pointers, slots) == f"@3592:0:{MIB}:w"
    # one tensor in two lists (addcmul_'s grad, grad): both its slots hold it; the first is followed
    # (at depth 3: 336 slots a list, lists at words 0, 2688 and 5376)
    twice = [(0, t[0]), (8, t[1]), (16, t[2]), (24, t[4]), (2688, t[3]), (2696, t[4]), (2704, t[5]),
             (5376, t[3]), (5384, t[4]), (5392, t[5])]
    deeper = metadata_slots(kernel.replace("ILi2EE", "ILi3EE"), twice, LIMITS_32KB)
    assert r._operand((7, 4 * MIB, MIB, "r"), twice, deeper) == f"@2696:0:{MIB}:r"
    assert r._operand((7, 0, MIB, "r"), pointers) == f"7:0:{MIB}:r"  # without the slots: ambiguous
    assert metadata_slots("sm80_xmma_gemm", pointers, LIMITS_32KB) == frozenset()


def test_a_foreach_operators_launches_are_modelled_with_the_limits_of_the_build_that_ran():
    """torch 2.11 keeps multi_tensor_apply to 4 KB of kernel arguments on CUDA 13 too (110
    tensors a launch at depth 1), 2.14 takes 32 KB there (770): the recorder reads which from
    the slots per list fakecuda found in the run's tensor-list launches, not from the CUDA
    version, and gives each launch its own chunks of the model with those limits."""
    from operator_uses import LIMITS_4KB, LIMITS_32KB, limits_of

    def listed(depth, tensors):
        return {"kernel": "multi_tensor_apply_kernel", "tensor_list": {"depth": depth, "tensors": tensors, "reads": []}}
    assert limits_of([{"kernel": "gemm"}, listed(2, 64)]) is LIMITS_4KB      # 2.11.0+cu130's sqrt
    assert limits_of([listed(1, 96)]) is LIMITS_4KB                           # its scalar list
    assert limits_of([listed(3, 336), {"kernel": "gemm"}]) is LIMITS_32KB    # 2.14.1+cu130's addcmul_
    assert limits_of([listed(1, 672)]) is LIMITS_32KB
    assert limits_of([{"kernel": "gemm"}]) is LIMITS_4KB  # no foreach launch: nothing to model
    r = recorder()
    a, b = (7, 0, MIB, "rw"), (8, 0, MIB, "rw")
    models = {LIMITS_4KB: [(a,), (b,)], LIMITS_32KB: [(a, b)]}
    r.operators = [(0, 20, 22, (a, b), models, ())]
    names = {(0, 20): "multi_tensor_apply_kernel", (0, 21): "multi_tensor_apply_kernel"}
    pointers = {(0, 20): [(0, 0x7F0000000000)], (0, 21): [(0, 0x7F0000400000)]}
    assert r.per_launch(names, pointers, LIMITS_4KB) == ({(0, 20): (a,), (0, 21): (b,)}, 0)
    # the other build's model makes one launch of the two: not followed, and counted (foreach_unsplit)
    assert r.per_launch(names, pointers, LIMITS_32KB)[1] == 1
