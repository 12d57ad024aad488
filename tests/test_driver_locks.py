"""No lock of pump's is held across a driver call (issue 27, risk 7).

A driver call can block for milliseconds (a context's set-up is 67 of them), and a driver or a
stacked interposer can call back into pump: a pump lock held across one stalls every thread
that needs the lock, or deadlocks. Each thread counts the pump locks it holds (shim/base/locks.h);
fakecuda asks the count at every entry point and says on stderr when it is not 0, and every
run_program run (tests/conftest.py) fails on that line. These runs cover the places that held
one before: a context's first launch (pump_context_of held context_lock across its 2
cuStreamCreate, 65 cuEventCreate and the context push and pop), the use-event ring
(cuEventCreate x1024, cuStreamWaitEvent, cuEventRecord under use_lock), a dead tensor's discard
(cuEventQuery, cuMemDiscardBatchAsync, cuEventRecord under use_lock), the capacity and budget
readings (cuMemGetInfo under resolve_lock), managed_all's decision (cuDeviceGetCount,
cuDeviceGetAttribute) and release-threshold copy (cuMemPoolGet/SetAttribute), the pool
queries (cuDeviceGetMemPool, cuMemPoolGetAttribute, cuMemPoolDestroy under pool_memory's lock),
and pump's default budget (the pools' kept memory asked under budget.c's resolve_lock: found by
the real client, GPT-2 small under --capacity host, 3 entry points).
Before the change all four runs failed, fakecuda naming 15 entry points called under a pump lock,
among them "fakecuda: cuStreamCreate called while the calling thread holds 1 pump lock".
A device's turn counts as a lock (issue 42, risk 4): with the turn counted and the calls still
made in it, four of the five runs failed (threads, torch_allocator, context_reset, own_budget;
cuMemPrefetchBatchAsync, cuEventRecord, cuStreamWaitEvent, cuThreadExchangeStreamCaptureMode
named); a decision's moves are now handed over in its turn and made outside it."""

import pathlib
import re

import pytest

from conftest import LOCK_HELD_LINE

SHIM = pathlib.Path(__file__).resolve().parent.parent / "shim"
DIRECT = re.compile(r"\bpthread_(mutex_(lock|trylock|unlock)|rwlock_(rd|wr|tryrd|trywr|un)lock)\s*\(")

SMALL_DEVICE = {"FAKECUDA_DEVICE_MEMORY": str(1 << 30)}
CUDA_12_8 = dict(SMALL_DEVICE, FAKECUDA_DRIVER_VERSION="12080")
# pump's default budget read under managed_all: what the process's pools keep is asked of the
# driver (pool_memory.c) beside each reading of the device's memory (budget.c).
OWN_BUDGET = {"FAKECUDA_DEVICE_MEMORY": str(256 << 20), "PUMP_CAPACITY": "host", "PUMP_MANAGED_ALL": "1",
              "PUMP_SOCKET": ""}


def test_the_check_sees_a_driver_call_under_a_lock(run_program, c_build):
    """A stand-in libpump whose threads always hold a lock: the first call is reported."""
    stub = c_build / "plain" / "liblocks_held_stub.so"
    with pytest.raises(AssertionError, match=r"cuInit called while the calling thread holds 1 pump lock") as caught:
        run_program("threads", 1, 1, pump=False, env={"LD_PRELOAD": str(stub)})
    assert LOCK_HELD_LINE in str(caught.value)


def test_the_check_sees_a_wait_for_driver_calls_under_a_lock(run_program, c_build):
    """A stand-in libpump that says a thread waited for another's driver calls holding a lock
    (a drain of pump's worker, a device's turn): said once, at the first entry."""
    stub = c_build / "plain" / "liblocks_held_stub.so"
    with pytest.raises(AssertionError, match=r"1 wait for another thread's driver calls made holding a pump lock"):
        run_program("threads", 1, 1, pump=False, env={"LD_PRELOAD": str(stub), "LOCKS_STUB": "waits"})


@pytest.mark.parametrize("name, args, env, done", [
    ("threads", (4, 50), dict(SMALL_DEVICE, PUMP_BUDGET="50%"), "launches_prefetched"),  # contexts, use events
    ("torch_allocator", (3,), {"PUMP_MANAGED_ALL": "1"}, "bytes_discarded"),              # discards
    ("pool_info", (), dict(CUDA_12_8, PUMP_MANAGED_ALL="1"), "managed_all_allocs"),       # pool queries, destroys
    ("context_reset", ("reset",), {}, "launches_prefetched"),                              # a context set up again
    ("budget", (4, 32, 5, "--neighbour=1:3:124"), OWN_BUDGET, "budget_rereads"),           # pump's default budget
], ids=["threads", "torch_allocator", "pool_info", "context_reset", "own_budget"])
def test_no_driver_call_under_a_pump_lock(run_program, name, args, env, done):
    run = run_program(name, *args, env=env)  # run_program fails on fakecuda's line
    assert run.proc.returncode == 0, run.proc.stderr[-4000:]
    assert run.totals[done] > 0  # the path ran


def test_every_pump_lock_is_counted():
    """A lock taken past locks.h's count would hide the driver calls made under it."""
    direct = [f"{p.name}:{n}: {line.strip()}" for p in sorted(SHIM.glob("*/*.[ch]")) if p.name != "locks.h"
              for n, line in enumerate(p.read_text().splitlines(), 1) if DIRECT.search(line)]
    assert direct == []
