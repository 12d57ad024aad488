"""How the real-client recorder names an operand for fakecuda's replay (tests/real_client/
operator_uses.py, fakecuda/launch_uses.c): by the one argument word of the launch that
points into it, so that a later run follows the pointer its launch is given, wherever its
caching allocator placed the tensor; by allocation where no word, or more than one, does."""
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
