"""What `pump config check` warns about: values that are valid but can hardly be meant.

A config error stops a job; these do not (the file is accepted and `check` exits 0), but
each would make a job fail or run worse than without pump, so `check` says so on
stderr, one line each, naming the file, the key and why."""

from typing import List

from pump.config import DaemonConfig, JobConfig, parse_size

MiB = 1 << 20
# Below this a capacity refuses a real job's first allocations (CUDA contexts and
# framework pools allocate in MiB), and a budget holds less than one 2 MiB block.
CAPACITY_MIN = MiB
BUDGET_MIN = 2 * MiB


def _bytes(value):
    """A size setting's bytes, or None for a percentage, "host" or unset."""
    if value is None or value == "host" or str(value).endswith("%"):
        return None
    return parse_size(str(value))


def job_warnings(path: str, cfg: JobConfig) -> List[str]:
    warnings = []
    capacity, budget = _bytes(cfg.capacity), _bytes(cfg.budget)
    if capacity is not None and capacity < CAPACITY_MIN:
        warnings.append(f"{path}: warning: [memory] capacity {cfg.capacity!r} is under 1 MiB: a real job's "
                        "first managed allocations would be refused (sizes are bytes unless they say "
                        "KiB, MiB, GiB...)")
    if budget is not None and budget < BUDGET_MIN:
        warnings.append(f"{path}: warning: [memory] budget {cfg.budget!r} is under one 2 MiB block: nothing "
                        "could stay on the GPU, every launch would fault")
    if capacity is not None and budget is not None and budget > capacity:
        warnings.append(f"{path}: warning: [memory] budget {cfg.budget!r} is above capacity "
                        f"{cfg.capacity!r}: the job cannot allocate that much, so the budget never applies")
    for field in ("min_budget", "max_budget"):
        value = _bytes(getattr(cfg, field))
        if value is not None and capacity is not None and value > capacity:
            warnings.append(f"{path}: warning: [memory] {field} {getattr(cfg, field)!r} is above capacity "
                            f"{cfg.capacity!r}: more than the job can allocate")
    return warnings


def daemon_warnings(path: str, cfg: DaemonConfig) -> List[str]:
    default, pool = _bytes(cfg.default_budget), _bytes(cfg.gpu_pool)
    warnings = []
    if default is not None and default < BUDGET_MIN:
        warnings.append(f"{path}: warning: [budgets] default_budget {cfg.default_budget!r} is under one 2 MiB "
                        "block: jobs without a budget of their own would keep nothing on the GPU")
    if default is not None and pool is not None and default > pool:
        warnings.append(f"{path}: warning: [budgets] default_budget {cfg.default_budget!r} is above gpu_pool "
                        f"{cfg.gpu_pool!r}: no job could be given it")
    return warnings
