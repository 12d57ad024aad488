"""pump simulate --profile FILE: kernel times measured on a real GPU (a profile of the same model,
profile_read.py) put in place of the model's roofline, scaled to the simulated GPU.

A trace made on the meta device has operators, not kernels (each launch is one aten operator:
its function name is the operator's, e.g. aten.addmm.default; a _foreach_ operator's launches,
one after the other, are one operator), and each GPU picks its own kernels, so the match is per
operator:
  - by operator and input bytes: the profile's invocations of the same operator whose tensor
    inputs (record_shapes) add up to the bytes the launch reads (its EXTENT ranges not written,
    and those written too for an in-place operator, whose name ends in "_");
  - by operator alone where the profile has no shapes or none of that size;
  - else unmatched: the launch keeps the model's time (workload.kernel_seconds).
A matched operator takes the median of its matches' kernel time, shared among its launches by
their bytes.  The match rate is the share of launches matched by shapes (by operator alone
when the profile has no shapes); under MIN_MATCH_RATE the profile is refused: as a profile of
forward passes where the trace has training steps (no backward operator in it), else as one
of another model.  A profile without shapes is checked for its batch: its elementwise kernels'
grids say how many elements each covered (profile_read.kernel_elements); where they cover
another number than the trace's launches of the same operators write (median over operators,
outside BATCH_TOLERANCE), it is refused as a profile at another batch size.

Scaling rule: a measured time t on the profile's GPU becomes t * roof(target) / roof(source),
roof being workload.kernel_seconds of the launch's FLOPs and bytes: an operator memory-bound on
both GPUs scales by the ratio of their memory bandwidths, a compute-bound one by the ratio of
their FLOPs peaks (for its kind of operator), one that changes sides by the ratio of its
roofline times.  It assumes the kernel reaches the same fraction of its roof on both GPUs.
Error band: per launch, from the fastest to the slowest of its matches, each scaled by the
smaller and the larger of the two ratios (bandwidth, FLOPs): where the roofline misjudges which
roof bounds a kernel, the truth lies between them.
"""

import dataclasses
import re

import numpy as np

from pump import channel
from pump.simulate import constants as K, workload as wl
from pump.simulate.profile_read import ProfileError, op_name, read

MIN_MATCH_RATE = 0.5
# Grids cover whole blocks (up to 512 elements more than a launch's), so a profile at the
# trace's batch reads about 1x; half or twice the batch reads 0.5x or 2x.
BATCH_TOLERANCE = (0.8, 1.25)
# A profile's device name -> the preset of its GPU (the first whose words all appear in it).
DEVICE_PRESETS = ((("H200",), "h200"), (("H100", "PCIe"), "h100-pcie"), (("H100",), "h100-sxm"),
                  (("A100", "80GB"), "a100-80gb"), (("A100",), "a100-40gb"), (("L4",), "l4"), (("V100",), "v100"))


@dataclasses.dataclass
class Measured:
    source: str              # the profile's GPU preset
    seconds: np.ndarray      # per launch on the target GPU; NaN: unmatched
    low: np.ndarray
    high: np.ndarray
    by_shape: int            # launches matched by operator and input bytes
    by_name: int             # by operator alone
    rate: float              # the match rate (see the module's docstring)

    def summary(self, w, gpu) -> dict:
        """Kernel time per step on ``gpu``: measured where matched, the model elsewhere, with the band."""
        model = wl.kernel_seconds(w.flops, w.traffic, w.kind, gpu)
        steps = max(1, len(w.steps))
        total = [float(np.where(np.isnan(x), model, x).sum()) / steps for x in (self.seconds, self.low, self.high)]
        return {"source_gpu": self.source, "launches": len(self.seconds), "matched_by_shape": self.by_shape,
                "matched_by_operator": self.by_name, "match_rate": round(self.rate, 4),
                "kernel_ms_per_step": total[0] * 1e3, "band_ms": [total[1] * 1e3, total[2] * 1e3],
                "model_ms_per_step": float(model.sum()) / steps * 1e3}


def source_preset(device: str, given: str = None) -> str:
    if given:
        if given not in K.GPU_PRESETS:
            raise ValueError(f"--profile-gpu {given!r}: allowed: {', '.join(K.GPU_PRESETS)}")
        return given
    for words, preset in DEVICE_PRESETS:
        if all(word in device for word in words):
            return preset
    raise ValueError(f"the profile's GPU ({device or 'not named in it'}) is none of the presets: name it with "
                     f"--profile-gpu ({', '.join(K.GPU_PRESETS)})")


def trace_operators(path):
    """The trace's operators, in launch order: [(name, input bytes, [launch indices], bytes written)]."""
    _, records = wl._records_of_busiest_process(path)
    batch = channel.decode(records)
    operators = []
    for i, f in enumerate(batch.launch_function.tolist()):
        name = batch.functions.get(f, "")
        short = op_name(name)
        extents = batch.extents.get(i) or ()
        nbytes = sum(n for _, n, written in extents if not written or short.endswith("_"))
        written = sum(n for _, n, w in extents if w)
        if operators and short.startswith("_foreach_") and operators[-1][0] == short and operators[-1][3] == name:
            operators[-1][1] += nbytes
            operators[-1][2].append(i)
            operators[-1][4] += written
        else:
            operators.append([short, nbytes, [i], name, written])
    return [(name, nbytes, launches, written) for name, nbytes, launches, _, written in operators]


def batch_ratio(profile, operators):
    """(elements the profile's elementwise kernels covered / elements the trace's launches of the
    same operators wrote, the operators compared), medians over operators; (None, []) where none
    compares.  The trace's tensors are fp32 (tracegen), 4 bytes an element."""
    covered, written = {}, {}
    for inv in profile.invocations:
        if inv.elements:
            covered.setdefault(inv.name, []).append(inv.elements)
    for name, _, _, nbytes in operators:
        if name in covered and nbytes:
            written.setdefault(name, []).append(nbytes / 4)
    names = sorted(written)
    if not names:
        return None, []
    return float(np.median([np.median(covered[n]) / np.median(written[n]) for n in names])), names


def _refusal(profile, w, rate: float, how: str, operators) -> str:
    """Why a profile matching too few launches does not fit the trace, as best the two tell."""
    n = w.launches
    head = (f"{profile.path}: {rate:.0%} of {w.path}'s {n} launches match its operators {how} "
            f"(at least {MIN_MATCH_RATE:.0%} needed)")
    backward = lambda names: any("backward" in name for name in names)  # noqa: E731
    if backward(name for name, *_ in operators) and not backward(inv.name for inv in profile.invocations):
        return (head + ": the profile holds forward passes only (no backward operator) and the trace training "
                "steps; if it is a profile of the same model, generate the trace with pump trace generate --inference")
    return head + ": a profile of another model, or another batch?"


def _check_batch(profile, w, operators):
    """ValueError if a profile without shapes was taken at another batch size than the trace's."""
    ratio, names = batch_ratio(profile, operators)
    if ratio is None or BATCH_TOLERANCE[0] <= ratio <= BATCH_TOLERANCE[1]:
        return
    batch = re.search(r"\bbatch (\d+)", w.name)
    at = f"about batch {round(int(batch.group(1)) * ratio)}" if batch else f"{ratio:.2g}x the trace's batch"
    trace_batch = f" (the trace: {batch.group(0)})" if batch else ""
    raise ValueError(f"{profile.path}: recorded without shapes, and its elementwise kernels' grids "
                     f"({', '.join(names)}) cover {ratio:.2f}x the elements {w.path}'s launches of those operators "
                     f"write: a profile at {at}{trace_batch}; generate the trace at the profile's batch")


def match(w, profile, target, source: str) -> Measured:
    """Measured times of ``w``'s launches from ``profile`` on preset ``target``; ValueError if too few match."""
    shaped = any(inv.input_bytes is not None for inv in profile.invocations)
    exact, by_name = {}, {}
    for inv in profile.invocations:
        by_name.setdefault(inv.name, []).append(inv.kernel_ns)
        if inv.input_bytes is not None:
            exact.setdefault((inv.name, inv.input_bytes), []).append(inv.kernel_ns)
    n = w.launches
    measured, fastest, slowest = (np.full(n, np.nan) for _ in range(3))
    counts = {"shape": 0, "name": 0}
    operators = trace_operators(w.path)
    if sum(len(launches) for _, _, launches, _ in operators) != n:
        raise ValueError(f"{w.path}: its launches could not be read twice alike")
    for name, nbytes, launches, _ in operators:
        times, how = exact.get((name, nbytes)), "shape"
        if times is None:
            times, how = by_name.get(name), "name"
        if times is None:
            continue
        counts[how] += len(launches)
        share = w.traffic[launches] / w.traffic[launches].sum() if w.traffic[launches].sum() else \
            np.full(len(launches), 1 / len(launches))
        for value, out in ((np.median(times), measured), (min(times), fastest), (max(times), slowest)):
            out[launches] = value * 1e-9 * share
    rate = (counts["shape"] if shaped else counts["name"] + counts["shape"]) / n
    if rate < MIN_MATCH_RATE:
        raise ValueError(_refusal(profile, w, rate, "by operator and shapes" if shaped else "by operator", operators))
    if not shaped:
        _check_batch(profile, w, operators)
    src = K.GPU_PRESETS[source]
    ratio = wl.kernel_seconds(w.flops, w.traffic, w.kind, target) / \
        np.maximum(wl.kernel_seconds(w.flops, w.traffic, w.kind, src), 1e-30)
    bandwidth = src.memory_bytes_per_s / target.memory_bytes_per_s
    peak = np.where(w.kind == "conv", src.conv_flops() / target.conv_flops(), src.fp32_flops / target.fp32_flops)
    ratio = np.where((w.flops > 0) | (w.traffic > 0), ratio, bandwidth)
    return Measured(source, measured * ratio, fastest * np.minimum(bandwidth, peak),
                    slowest * np.maximum(bandwidth, peak), counts["shape"], counts["name"], rate)


def apply(w, path: str, target, source_gpu: str = None) -> dict:
    """Read the profile at ``path``, set ``w``'s measured overrides for ``target`` (a GpuPreset)
    and return the summary; ValueError (ProfileError) says what is wrong."""
    profile = read(path)
    if not profile.invocations:
        raise ProfileError(f"{path}: no kernel in it is linked to an operator ({profile.kernels} kernels): "
                           "profile with torch.profiler (activities CPU and CUDA) or nsys with NVTX ranges")
    measured = match(w, profile, target, source_preset(profile.device, source_gpu))
    w.override_seconds = measured.seconds
    doc = measured.summary(w, target)
    doc.update(file=path, device=profile.device, kernels=profile.kernels, kernels_linked=profile.linked)
    return doc


def text(doc: dict) -> str:
    return (f"profile {doc['file']} ({doc['device'] or doc['source_gpu']}, scaled from {doc['source_gpu']}): "
            f"{doc['match_rate']:.0%} of {doc['launches']} launches matched ({doc['matched_by_shape']} by operator "
            f"and shapes, {doc['matched_by_operator']} by operator alone); kernel time {doc['kernel_ms_per_step']:.4g} "
            f"ms per step (band {doc['band_ms'][0]:.4g}-{doc['band_ms'][1]:.4g} ms; the model alone: "
            f"{doc['model_ms_per_step']:.4g} ms)")
