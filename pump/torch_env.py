"""What pump-run sets for PyTorch: its allocator settings under managed_all, merged into the
user's, never overwritten; and pump's start-up hook where a job asks for pump's allocator.

Under ``--managed-all`` the shim turns the program's device allocations into managed
memory, but PyTorch's expandable segments are virtual-memory-management allocations
(cuMemCreate/cuMemMap), which cannot be managed.  pump-run therefore asks PyTorch for
``expandable_segments:False``, unless the user chose expandable segments themselves: a
user's own choice wins, and when it is ``True`` pump-run says once that those
allocations stay device memory.

Which variable PyTorch reads (checked in torch 2.13, c10/core/AllocatorConfig.cpp, where
expandable_segments is parsed): the first of PYTORCH_CUDA_ALLOC_CONF,
PYTORCH_HIP_ALLOC_CONF, PYTORCH_ALLOC_CONF that is *set* (an empty value counts, and
then hides the others).  Its syntax: comma-separated ``key:value`` items, whitespace
ignored, list values in brackets (``roundup_power2_divisions:[256:4,>:1]``), the
booleans exactly ``True`` or ``False``; a key given twice: the last one counts.
"""

from __future__ import annotations

import os
import pathlib
from typing import Dict, List, Mapping, Optional, Tuple

# In the order PyTorch looks for them; the first one set is the only one read.
ALLOC_CONF_VARIABLES = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
# Created when the user set none: PyTorch's current name, and the lowest in precedence,
# so a variable the program sets for itself before PyTorch starts still wins.  (PyTorch
# before 2.8 does not read it, and its default is what pump asks for anyway.)
NEW_ALLOC_CONF_VARIABLE = "PYTORCH_ALLOC_CONF"
EXPANDABLE = "expandable_segments"
PUMP_CHOICE = f"{EXPANDABLE}:False"


def split_items(conf: str) -> List[str]:
    """The top-level ``key:value`` items of an allocator configuration, split at the
    commas outside brackets, whitespace removed as PyTorch's tokenizer does; empty items
    (a trailing comma) dropped."""
    items, current, depth = [], [], 0
    for ch in conf:
        if ch.isspace():
            continue
        if ch == "," and depth == 0:
            items.append("".join(current))
            current = []
            continue
        depth += {"[": 1, "]": -1}.get(ch, 0)
        current.append(ch)
    items.append("".join(current))
    return [item for item in items if item]


def user_expandable_segments(conf: str) -> Optional[str]:
    """The value the configuration gives expandable_segments (its last one), or None
    when it does not set it."""
    value = None
    for item in split_items(conf):
        key, colon, rest = item.partition(":")
        if key == EXPANDABLE and colon:
            value = rest
    return value


def merge_alloc_conf(conf: Optional[str]) -> str:
    """The user's configuration (None: unset) with pump's choice added where the user made
    none; the user's text is kept as written."""
    if conf is not None and user_expandable_segments(conf) is not None:
        return conf
    kept = (conf or "").rstrip()
    if not kept:
        return PUMP_CHOICE
    return kept + PUMP_CHOICE if kept.endswith(",") else f"{kept},{PUMP_CHOICE}"


def alloc_conf_variable(env: Mapping[str, str]) -> str:
    """The variable PyTorch will read in this environment (NEW_ALLOC_CONF_VARIABLE if none is set)."""
    return next((name for name in ALLOC_CONF_VARIABLES if name in env), NEW_ALLOC_CONF_VARIABLE)


def managed_all_allocator_env(env: Mapping[str, str]) -> Tuple[Dict[str, str], Optional[str]]:
    """(the variables to set, a notice or None) for a managed_all job started with env."""
    name = alloc_conf_variable(env)
    conf = env.get(name)
    if conf is not None and user_expandable_segments(conf) == "True":
        return {}, (f"{name} sets {EXPANDABLE}:True: PyTorch's expandable segments are "
                    "virtual-memory-management allocations, which cannot be managed: they stay "
                    "device memory, bounded by the GPU and not by the job's capacity (remove "
                    f"{EXPANDABLE}:True to make them managed)")
    return {name: merge_alloc_conf(conf)}, None


# pump's sitecustomize (pump/boot/): when torch is imported, installs pump's allocator or
# follows PyTorch's caching allocator.
BOOT_DIR = pathlib.Path(__file__).resolve().parent / "boot"


def boot_env(env: Mapping[str, str]) -> Dict[str, str]:
    """PYTHONPATH with pump's start-up hook first, for `[memory] torch_allocator = "pump"`
    and for following the caching allocator under managed_all (the hook reads
    PUMP_TORCH_ALLOCATOR and PUMP_MANAGED_ALL, which pump-run sets from the same settings)."""
    rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(BOOT_DIR)]
    return {"PYTHONPATH": os.pathsep.join([str(BOOT_DIR), *rest])}
