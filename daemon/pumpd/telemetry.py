"""pumpd's telemetry: GPUs through NVML (``pynvml``, from the ``nvidia-ml-py``
package), host memory and job process trees through psutil.

Every call here blocks (NVML calls can take long on a busy or failing GPU):
pumpd runs them in a thread executor with a timeout, never on its event loop.
Telemetry is advisory: when NVML is missing or failing, ``sample()`` still
answers (no GPUs, and ``"nvml"`` says why), and one field NVML cannot give is
``None``, never an exception.
"""

from __future__ import annotations

import importlib
import logging
import threading
import time

import psutil

log = logging.getLogger("pumpd")

# nvmlDeviceGetPcieThroughput answers in "KB/s"; NVML's KB is 1024 bytes.
_KIB = 1024
# How long shutdown() waits for a sample() stuck inside NVML before giving up.
_SHUTDOWN_WAIT_S = 5.0


def _uuid_key(uuid: str) -> str:
    """UUIDs compare case-insensitively, with or without NVML's "GPU-" prefix."""
    u = uuid.strip().lower()
    return u[4:] if u.startswith("gpu-") else u


def nvml_indices(uuids, gpus) -> dict:
    """``{uuid: NVML index}`` for each of ``uuids`` that one of ``gpus`` (``sample()``'s
    list, or any dicts with "uuid" and "index") has; the others are left out (a MIG
    instance, NVML unavailable)."""
    by_key = {_uuid_key(g["uuid"]): g["index"] for g in gpus if g.get("uuid")}
    return {u: by_key[_uuid_key(u)] for u in uuids if _uuid_key(u) in by_key}


class Telemetry:
    """GPU and host telemetry for pumpd.

    ``nvml=False`` never touches NVML (``"nvml": "disabled"``). Otherwise NVML is
    initialised on first use. If pynvml cannot be imported, GPUs stay off for
    good; if ``nvmlInit`` fails (driver not loaded yet, no permission on
    /dev/nvidia*), it is tried again at most every ``retry_s`` seconds. Either
    reason is logged once, never again.

    The methods are safe to call from several threads (an executor whose earlier
    call timed out may still be inside NVML when the next one starts).
    """

    def __init__(self, nvml: bool = True, retry_s: float = 60.0):
        self._enabled = nvml
        self._retry_s = retry_s
        self._lock = threading.Lock()
        self._pynvml = None          # the module, once nvmlInit succeeded
        self._status = "ok" if nvml else "disabled"
        self._import_failed = False
        self._next_try = 0.0
        self._logged = set()

    # -- NVML state ---------------------------------------------------------

    def _log_once(self, key, level, msg, *args):
        if key not in self._logged:
            self._logged.add(key)
            log.log(level, msg, *args)

    def _unavailable(self, reason, key, level):
        self._status = reason
        self._log_once(key, level, "GPU telemetry unavailable: %s", reason)

    def _nvml(self):
        """The initialised pynvml module, or None (with self._status saying why).
        Call with self._lock held."""
        if not self._enabled:
            return None
        if self._pynvml is not None:
            return self._pynvml
        if self._import_failed or time.monotonic() < self._next_try:
            return None
        try:
            mod = importlib.import_module("pynvml")
        except Exception as e:  # ImportError, or a broken install raising anything
            self._import_failed = True
            self._unavailable(f"pynvml not importable ({e}); install nvidia-ml-py",
                              "unavailable", logging.INFO)
            return None
        try:
            mod.nvmlInit()
        except Exception as e:  # pynvml.NVMLError_*: no library, no driver, no permission
            self._next_try = time.monotonic() + self._retry_s
            self._unavailable(f"nvmlInit failed: {e}", "unavailable", logging.WARNING)
            return None
        if "unavailable" in self._logged:
            log.info("GPU telemetry: NVML is available now")
        self._pynvml = mod
        self._status = "ok"
        return mod

    def _query(self, field, fn, *args):
        """One NVML query; any failure (NVMLError_NotSupported, _NoPermission,
        _GpuIsLost, ...) gives None. Each kind of failure of a field is logged
        once at debug level."""
        try:
            return fn(*args)
        except Exception as e:
            self._log_once(("field", field, type(e).__name__), logging.DEBUG,
                           "NVML %s failed: %s", field, e)
            return None

    def _device_count(self, mod):
        try:
            count = mod.nvmlDeviceGetCount()
        except Exception as e:
            self._unavailable(f"nvmlDeviceGetCount failed: {e}", "count", logging.WARNING)
            return 0
        self._status = "ok"
        return count

    # -- public -------------------------------------------------------------

    def sample(self) -> dict:
        """One reading of every GPU and of host memory (blocking).

        ``{"gpus": [{"uuid", "index", "name", "memory_used", "memory_total",
        "pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s", "utilization_gpu"}, ...],
        "host": {"memory_total", "memory_available"}, "nvml": "ok" | reason}``.
        ``index`` is the NVML index (not the CUDA ordinal: see cuda_to_nvml);
        sizes are bytes, ``utilization_gpu`` a percentage; a field NVML cannot
        give is None.
        """
        gpus = []
        with self._lock:
            mod = self._nvml()
            if mod is not None:
                for i in range(self._device_count(mod)):
                    gpus.append(self._gpu(mod, i))
            status = self._status
        vm = psutil.virtual_memory()
        return {"gpus": gpus,
                "host": {"memory_total": vm.total, "memory_available": vm.available},
                "nvml": status}

    def _gpu(self, mod, index):
        gpu = {"uuid": None, "index": index, "name": None, "memory_used": None,
               "memory_total": None, "pcie_tx_bytes_per_s": None,
               "pcie_rx_bytes_per_s": None, "utilization_gpu": None}
        h = self._query("handle", mod.nvmlDeviceGetHandleByIndex, index)
        if h is None:
            return gpu
        gpu["uuid"] = _text(self._query("uuid", mod.nvmlDeviceGetUUID, h))
        gpu["name"] = _text(self._query("name", mod.nvmlDeviceGetName, h))
        mem = self._query("memory", mod.nvmlDeviceGetMemoryInfo, h)
        if mem is not None:
            gpu["memory_used"], gpu["memory_total"] = mem.used, mem.total
        for key, counter in (("pcie_tx_bytes_per_s", "NVML_PCIE_UTIL_TX_BYTES"),
                             ("pcie_rx_bytes_per_s", "NVML_PCIE_UTIL_RX_BYTES")):
            kb = self._query(key, mod.nvmlDeviceGetPcieThroughput, h, getattr(mod, counter))
            gpu[key] = None if kb is None else kb * _KIB
        util = self._query("utilization", mod.nvmlDeviceGetUtilizationRates, h)
        if util is not None:
            gpu["utilization_gpu"] = util.gpu
        return gpu

    def cuda_to_nvml(self, uuids_by_cuda_ordinal: list[str]) -> dict[int, int]:
        """Map CUDA device ordinals to NVML indices by UUID (blocking).

        ``uuids_by_cuda_ordinal[k]`` is the UUID of the job's CUDA device ``k``
        (``pump.channel.uuid_from_cuda_bytes`` of what ``cuDeviceGetUuid`` gave,
        as a DEVICE record carries it). The two
        numberings differ: CUDA orders devices fastest first by default
        (``CUDA_DEVICE_ORDER=FASTEST_FIRST``, NVML by PCI bus id) and
        ``CUDA_VISIBLE_DEVICES`` both hides devices and reorders them (with
        ``CUDA_VISIBLE_DEVICES=2,0`` CUDA's device 0 is NVML's 2), and each job
        may set it differently. Only UUIDs identify a GPU across processes.
        Ordinals whose UUID NVML does not list (a MIG instance, NVML
        unavailable) are left out of the result.
        """
        with self._lock:
            mod = self._nvml()
            if mod is None:
                return {}
            gpus = []
            for i in range(self._device_count(mod)):
                h = self._query("handle", mod.nvmlDeviceGetHandleByIndex, i)
                gpus.append({"index": i, "uuid": None if h is None else
                             _text(self._query("uuid", mod.nvmlDeviceGetUUID, h))})
        index_of = nvml_indices(uuids_by_cuda_ordinal, gpus)
        return {ordinal: index_of[u] for ordinal, u in enumerate(uuids_by_cuda_ordinal) if u in index_of}

    @staticmethod
    def process_tree(pid: int) -> dict:
        """The process ``pid`` and all its descendants (blocking):
        ``{"pids": [...], "rss_bytes": sum of RSS, "cpu_seconds": sum of user +
        system}``. The CPU time of descendants that already exited and were
        waited for is included (through their parents' children_user/system), so
        the total does not drop when a data-loader worker exits. Processes that
        vanish or deny access while being read are skipped; an unknown ``pid``
        gives an empty tree."""
        return Telemetry.process_trees([pid])[pid]

    @staticmethod
    def process_trees(roots) -> dict:
        """process_tree() of each pid in `roots` (an iterable; each read once), from one pass
        over the process table: root -> its tree. One psutil children(recursive=True) per job read every process's /proc entry
        once per job: at 1,024 jobs a liveness pass took longer than its interval (issue 45)."""
        children = {}
        for p in psutil.process_iter(["ppid"]):
            ppid = p.info.get("ppid")
            if ppid is not None:
                children.setdefault(ppid, []).append(p)
        trees, measured = {}, {}  # measured: pid -> (rss, cpu seconds), or None: each process read once
        for root in set(roots):
            tree = {"pids": [], "rss_bytes": 0, "cpu_seconds": 0.0}
            try:
                procs, todo = [], [psutil.Process(root)]
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                trees[root] = tree
                continue
            seen = set()
            while todo:
                proc = todo.pop()
                if proc.pid in seen:
                    continue
                seen.add(proc.pid)
                procs.append(proc)
                todo.extend(children.get(proc.pid, ()))
            for proc in procs:
                if proc.pid not in measured:  # a process in several trees (a job inside another's)
                    try:
                        with proc.oneshot():
                            rss, t = proc.memory_info().rss, proc.cpu_times()
                        measured[proc.pid] = rss, t.user + t.system + t.children_user + t.children_system
                    except (psutil.NoSuchProcess, psutil.AccessDenied):
                        measured[proc.pid] = None
                if measured[proc.pid] is None:
                    continue
                tree["pids"].append(proc.pid)
                tree["rss_bytes"] += measured[proc.pid][0]
                tree["cpu_seconds"] += measured[proc.pid][1]
            trees[root] = tree
        return trees

    def shutdown(self) -> None:
        """nvmlShutdown if NVML was initialised. Gives up (and leaves NVML to the
        process's exit) if a sample has been stuck inside NVML for seconds."""
        if not self._lock.acquire(timeout=_SHUTDOWN_WAIT_S):
            log.warning("GPU telemetry: a sample is stuck in NVML; not calling nvmlShutdown")
            return
        try:
            mod, self._pynvml = self._pynvml, None
            if mod is not None:
                try:
                    mod.nvmlShutdown()
                except Exception as e:
                    log.debug("nvmlShutdown failed: %s", e)
        finally:
            self._lock.release()


def _text(v):
    """pynvml returns str (nvidia-ml-py >= 11.515) or bytes (older)."""
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    return v
