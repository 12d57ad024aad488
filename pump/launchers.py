"""Which run a pump-run belongs to, from the launcher that started it: the pump-runs of one
run on a node (the tasks of a Slurm job step, the workers of a torchrun) are one pump job,
joined in pumpd by their group (protocol.GROUP_RE), named after it, its members told apart
by rank (the shim sends RANK, SLURM_PROCID, ...).

`pump-run torchrun ...` needs none of this (one pump-run, one job); `torchrun ... pump-run`
and `srun pump-run` start one pump-run per rank, and these find each other here."""

import os
import re
from typing import Mapping, Optional

from pump import protocol

_SLURM_STEP = re.compile(r"[0-9]+|batch|extern|interactive")


def run_group(env: Mapping[str, str] = os.environ, parent_pid: Optional[int] = None) -> Optional[str]:
    """The group of this pump-run's run, or None outside a launcher pump knows."""
    job = env.get("SLURM_JOB_ID", "")
    if job.isdigit():
        step = env.get("SLURM_STEP_ID", "")
        return f"slurm-{job}.{step if _SLURM_STEP.fullmatch(step) else 'batch'}"
    run_id = env.get("TORCHELASTIC_RUN_ID")
    if run_id is not None:
        # The run id is "none" unless the user set one: the agent (our parent, the torchrun
        # process, which outlives its workers' restarts) tells two runs on a node apart.
        agent = parent_pid if parent_pid is not None else os.getppid()
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", run_id)[:32] or "none"
        group = f"torchrun-{safe}-{agent}"
        return group if protocol.GROUP_RE.fullmatch(group) else None
    return None
