"""The fuzz targets' seed inputs, written from the input formats their C files
describe (fuzz_attach.c, fuzz_plan.c): a correct daemon's answer and plan,
and one broken thing at a time. libFuzzer starts from these; the replay
programs run them under the sanitizers with any compiler.

    python tests/fuzz/seeds.py DIRECTORY   writes DIRECTORY/attach and DIRECTORY/plan
"""

import pathlib
import struct
import sys

MiB = 1 << 20
BUFFER_BYTES = 5 * MiB // 2  # fuzz_job.h


def u8(*values):
    return bytes(values)


def u16(v):
    return struct.pack("<H", v)


def u32(v):
    return struct.pack("<I", v)


def u64(v):
    return struct.pack("<Q", v)


# ---- fuzz_attach.c ----

# A descriptor's input: its kind byte (added to its position: 0 is a ring
# first, a plan second), then the memfd's flags, sizes and seals.
RING = u8(0, 0, 0, 0)  # kind, flags, capacity choice, seals
PLAN = u8(0, 0, 0)  # kind, flags, seals
TWO = u8(0)  # the count byte: (0 + 2) % 4 descriptors


def _reply(flags=0, payload=b"", descriptors=TWO + RING + PLAN, extra_header=b""):
    """send_reply's input: flags, payload length and bytes, header fields the
    flags ask for, then the descriptor count byte and each descriptor's."""
    return u8(flags, len(payload)) + payload + extra_header + descriptors


def attach_seeds():
    launches = u8(0, 1, 2, 3)
    return {
        "valid": _reply() + launches,
        "error_reply": _reply(flags=8, payload=b"job limit reached"),
        "length_past_payload": _reply(flags=16, payload=b"{}", extra_header=u32(4096)),
        "bad_magic": _reply(flags=1, extra_header=u32(0x12345678)),
        "one_descriptor": _reply(descriptors=u8(3) + RING),
        "three_descriptors": _reply(descriptors=u8(1) + RING + PLAN + u8(0)) + launches,
        "ring_unsealed": _reply(descriptors=TWO + u8(0, 0, 0, 1) + PLAN),
        "ring_capacity_odd": _reply(descriptors=TWO + u8(0, 1, 0) + u32(1000) + u8(0) + PLAN),
        "plan_short": _reply(descriptors=TWO + RING + u8(0, 1) + u16(0xF000) + u8(0)),
        "pipe_for_plan": _reply(descriptors=TWO + RING + u8(1)),
    }


# ---- fuzz_plan.c ----

def _trigger(x, y_offset, first, need, prefetch, evict, how=0):
    """set_trigger's input: the launch, how (128: first is 32 bits), first, counts."""
    return u8(x, y_offset, how) + (u32(first) if how & 128 else u8(first)) + u8(0, need, prefetch, evict)


def _range(at, buffer, offset, size, how=4 | 32):
    return u16(at) + u8(how | buffer) + u32(offset) + u32(size)


def _plan(flags=4 | 32, triggers=(), ranges=(), trigger_count=None):
    data = u8(flags, len(triggers)) + b"".join(triggers)
    if flags & 128:
        data += u32(trigger_count)
    return data + u8(len(ranges)) + b"".join(ranges)


def _launch(x, y_offset=0):
    return u8(0, x, y_offset)


def plan_seeds():
    ring = u8(0, 0)
    triggers = (_trigger(0, 0, 0, 1, 1, 1), _trigger(2, 0, 4, 1, 2, 0))
    ranges = (_range(0, 0, 0, 2 * MiB), _range(1, 2, 0, BUFFER_BYTES), _range(2, 1, MiB, MiB),
              _range(4, 2, 0, MiB), _range(5, 3, 2 * MiB, MiB), _range(6, 0, 0, BUFFER_BYTES))
    plan = _plan(triggers=triggers, ranges=ranges)
    work = _launch(0) + _launch(2) + _launch(0) + u8(5, 2) + _launch(2) + _launch(1, 1)
    scribble = u8(1, 0) + u64(1 << 63) + _launch(0) + u8(1, 1) + u64(7) + _launch(2)
    return {
        "no_plan": ring + _plan(triggers=()) + u8(1) + work,
        "valid": ring + plan + u8(0) + work,
        "budget_one_buffer": ring + _plan(flags=8 | 32, triggers=triggers, ranges=ranges) + u8(0) + work,
        "ring_scribbled": ring + plan + u8(0) + scribble,
        "generation_odd": ring + plan + u8(0) + u8(2) + u64(3) + work,
        "trigger_rewritten": ring + plan + u8(0) + u8(3) + _trigger(0, 0, 60, 5, 5, 5) + work,
        "ranges_outside": ring + _plan(triggers=triggers, ranges=(_range(0, 0, BUFFER_BYTES, 4 * MiB),
                                                                   _range(1, 1, 4095, 7 * MiB, how=0))) + u8(0) + work,
        "ring_small_capacity": u8(1) + u32(512) + plan + u8(0) + work,
        "ring_size_short": u8(2, 0) + u32(4096) + plan + u8(0) + work,
        "counts_past_the_end": ring + _plan(triggers=(_trigger(0, 0, 65535, 1, 1, 1, how=128),),
                                            ranges=ranges) + u8(0) + work,
    }


def write(directory):
    directory = pathlib.Path(directory)
    for target, seeds in (("attach", attach_seeds()), ("plan", plan_seeds())):
        (directory / target).mkdir(parents=True, exist_ok=True)
        for name, data in seeds.items():
            (directory / target / name).write_bytes(data)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__.strip().splitlines()[-1].strip())
    write(sys.argv[1])
