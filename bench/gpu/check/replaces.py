"""Which figure a probe measured replaces which constant or assumption of fakecuda or the
simulator, and the line gpu-check prints for it ("replaces X: measured Y (now Z)").
docs/gpu-check.md says how each is folded back."""

import re

from common import REPO

MODEL_H = REPO / "fakecuda" / "fakecuda_model.h"


def model_constant(name: str):
    """A #define of fakecuda_model.h as an integer (its 'u' suffix dropped), or None."""
    m = re.search(rf"^#define\s+{name}\s+(\d+)u?\b", MODEL_H.read_text(), re.M)
    return int(m.group(1)) if m else None


# host_calls' calls and the constant each one's median replaces (None: fakecuda charges nothing).
HOST_CALLS = {"cuLaunchKernel": "FAKECUDA_LAUNCH_HOST_NS", "cuEventRecord": "FAKECUDA_EVENT_RECORD_HOST_NS",
              "cuStreamWaitEvent": "FAKECUDA_STREAM_WAIT_EVENT_HOST_NS", "cuEventQuery": "FAKECUDA_QUERY_HOST_NS",
              "cuStreamIsCapturing": "FAKECUDA_CAPTURE_QUERY_HOST_NS", "cuCtxGetCurrent": "FAKECUDA_CONTEXT_QUERY_HOST_NS",
              "cuPointerGetAttribute": "FAKECUDA_POINTER_QUERY_HOST_NS", "cuThreadExchangeStreamCaptureMode": None}


def worst_line_fractions():
    """pump/simulate's worst-case rate each way as a fraction of the line rate, and PCIe's rate."""
    from pump.simulate import constants
    return ({"h2d": ("H2D_WORST_FRACTION", constants.H2D_WORST_FRACTION),
             "d2h": ("D2H_WORST_FRACTION", constants.D2H_WORST_FRACTION)}, constants.pcie_bytes_per_s)


def lines(probes: dict) -> list:
    """[{"replaces", "measured", "now", "how"}] for every probe result that measures one."""
    out = []
    cases = (probes.get("prefetch_cost") or {}).get("result", {}).get("cases", {})
    cost, moved = cases.get("resident", {}), cases.get("from host", {})
    if "fixed_us" in cost and "per_block_pass_us" in cost:
        out.append({"replaces": "FAKECUDA_IOCTL_NS (fakecuda/fakecuda_model.h)",
                    "measured": round(cost["fixed_us"] * 1e3), "now": model_constant("FAKECUDA_IOCTL_NS"),
                    "how": "fixed part of one resident cuMemPrefetchAsync call's host time (prefetch_cost)"})
        out.append({"replaces": "FAKECUDA_BLOCK_PASS_NS (fakecuda/fakecuda_model.h)",
                    "measured": round(cost["per_block_pass_us"] * 1e3), "now": model_constant("FAKECUDA_BLOCK_PASS_NS"),
                    "how": "host time per 2 MiB block per pass of a resident cuMemPrefetchAsync call (prefetch_cost)"})
    if "per_moved_block_us" in moved:
        out.append({"replaces": "FAKECUDA_MIGRATE_BLOCK_NS (fakecuda/fakecuda_model.h)",
                    "measured": round(moved["per_moved_block_us"] * 1e3),
                    "now": model_constant("FAKECUDA_MIGRATE_BLOCK_NS"),
                    "how": "host time per 2 MiB block a cuMemPrefetchAsync moves to the GPU, beyond the resident "
                           "call's (prefetch_cost)"})
    timed = (probes.get("host_calls") or {}).get("result", {}).get("ns_per_call", {})
    for call, constant in HOST_CALLS.items():
        figure = timed.get(call, {})
        if "median" in figure:
            out.append({"replaces": f"{constant} (fakecuda/fakecuda_model.h)" if constant else
                        f"fakecuda's free {call} (not charged)",
                        "measured": round(figure["median"]), "now": model_constant(constant) if constant else 0,
                        "how": f"median ns of {call} in rounds of back-to-back calls (host_calls)"})
    bw = (probes.get("prefetch_bandwidth") or {}).get("result", {})
    link = ((probes.get("software") or {}).get("result") or {}).get("nvml", {})
    if "h2d_bytes_per_s" in bw:
        fractions, pcie = worst_line_fractions()
        gen, width = link.get("pcie_link_generation_max"), link.get("pcie_link_width_max")
        for way, (name, now) in fractions.items():
            rate = bw[f"{way}_bytes_per_s"]
            if isinstance(gen, int) and isinstance(width, int):
                measured = round(rate / pcie(gen, width), 3)
                how = f"{way} prefetch rate over PCIe Gen{gen} x{width}'s line rate (prefetch_bandwidth)"
            else:
                measured, how = None, "no PCIe link figures from NVML to divide by"
            out.append({"replaces": f"{name} (pump/simulate/constants.py, the worst case's {way} rate)",
                        "measured": measured, "now": round(now, 3), "how": how,
                        "GB_per_s": round(rate / 1e9, 2)})
    if "d2h_fault_bytes_per_s" in bw:
        out.append({"replaces": "FAKECUDA_D2H_BYTES_PER_US (fakecuda/fakecuda_model.h, not measured)",
                    "measured": round(bw["d2h_fault_bytes_per_s"] / 1e6), "now": model_constant("FAKECUDA_D2H_BYTES_PER_US"),
                    "how": "the host reading GPU-resident managed memory, in bytes/us: the driver's own path back, "
                           "its faults included (prefetch_bandwidth)"})
    evict = (probes.get("driver_evict") or {}).get("result", {})
    if "driver_evict_bytes_per_s" in evict:
        out.append({"replaces": "FAKECUDA_EVICT_D2H_BYTES_PER_US (fakecuda/fakecuda_model.h), and the simulator's "
                                "line rate for the driver's evictions on a GPU preset (pump/simulate/bound.py)",
                    "measured": round(evict["driver_evict_bytes_per_s"] / 1e6),
                    "now": model_constant("FAKECUDA_EVICT_D2H_BYTES_PER_US"),
                    "how": f"bytes/us a plain allocation's evictions of resident managed memory made room at, "
                           f"{evict['driver_over_prefetch']:.2f}x a prefetch to the host in the same run (driver_evict)"})
    moves = (probes.get("concurrent_moves") or {}).get("result", {})
    if "overlap" in moves:
        out.append({"replaces": "pump's one worker thread a device (shim/engine/prefetch_worker.c), and fakecuda's "
                                "prefetches taking turns with their copies (fakecuda/cost.c, fc_charge_copies)",
                    "measured": round(moves["overlap"], 2), "now": 0,
                    "how": f"overlap of a prefetch to the GPU and one to the host made by two threads at once, "
                           f"{moves['bytes_each'] >> 20} MiB each: 0 they take turns, 1 the shorter hides under the "
                           f"longer (concurrent_moves)"})
    managed = (probes.get("managed") or {}).get("result", {})
    if "pool_prefetchable" in managed:
        out.append({"replaces": "fakecuda's answer to prefetch and discard of managed-pool ranges (issue 27 risk 1)",
                    "measured": managed["pool_prefetchable"], "now": "see fakecuda/README.md",
                    "how": "cuMemPrefetchAsync, cuMemPrefetchBatchAsync and cuMemDiscardBatchAsync on "
                           "cuMemAllocFromPoolAsync memory of the managed default pool (managed)"})
    kinds = (probes.get("handle_kind") or {}).get("result", {})
    if "launches_by_origin" in kinds:
        out.append({"replaces": "fakecuda's cuFuncGetParamInfo on a CUkernel cast (issue 27 risk 3)",
                    "measured": {"accepted": kinds["cuFuncGetParamInfo_accepted_a_CUkernel"],
                                 "launches_by_origin": kinds["launches_by_origin"]},
                    "now": "see fakecuda/README.md",
                    "how": "cuFuncGetParamInfo asked on each launched CUkernel handle (handle_kind)"})
    return out


def say(log, replaced: list) -> None:
    for r in replaced:
        log(f"replaces {r['replaces']}: measured {r['measured']} (now {r['now']}); {r['how']}")
