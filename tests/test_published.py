"""pump's simulator against published measurements (bench/published/measurements.toml): each
comparison computes the model's figure and the measured one from the data file, and its
verdict under the tolerances the file fixed before any comparison was made.  The recorded
ratio and verdict, and docs/published.md's table, must say what the simulator says now: a
change of constant or engine that moves a comparison fails here until both are updated, and
a disagreement stays written down, never hidden."""

import math
import os
import sys

import numpy as np
import pytest

from pump.simulate import constants as K
from pump.simulate import engine, workload
from synthetic_trace import MIB, TraceBuilder

if sys.version_info >= (3, 11):
    import tomllib
else:  # tomli: pyproject.toml's dependency before 3.11, as pump/config.py
    import tomli as tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "bench", "published", "measurements.toml")
DOC = os.path.join(ROOT, "docs", "published.md")
GIB = 1 << 30
MEASUREMENT_FIELDS = ("id", "quantity", "value", "unit", "gpu", "link", "workload", "source", "url", "extraction")
COMPARISON_FIELDS = ("id", "what", "measured", "model", "kind", "ratio", "verdict")
VERDICTS = {"time": ("agrees", "disagrees"), "count": ("agrees", "disagrees"), "bound": ("holds", "violated")}


def _load():
    with open(DATA, "rb") as f:
        return tomllib.load(f)


DATA_FILE = _load()
MEASURED = {m["id"]: m for m in DATA_FILE["measurement"]}
COMPARISONS = {c["id"]: c for c in DATA_FILE["comparison"]}
UNIT_SCALE = {"ms": 1e-3, "bytes": 1, "GiB": GIB, "faults": 1, "GB/s": 1e9}


def _si(measurement_id):
    """A measurement's value in seconds, bytes, counts or bytes/s."""
    m = MEASURED[measurement_id]
    return m["value"] * UNIT_SCALE[m["unit"]]


# Every card measured here sits on PCIe 3.0 x16: the preset on that link is the V100's, and
# the fault path is the one every preset shares.
PRESET = "v100"
FAULT_SECONDS = K.GPU_PRESETS[PRESET].fault_path.service_seconds


# ---- each comparison: (the model's figure, the measured figure), in the same unit ----
def _kernel_from_host_gtx1080():
    stall = _si("pascal-um.migrated-bytes") / K.PAGE_BYTES * FAULT_SECONDS
    return _si("pascal-um.prefetched-kernel") + stall, _si("pascal-um.naive-kernel")


def _fault_throughput_gtx1080ti():
    stall = _si("oversub.fit.first-pass") - _si("oversub.fit.resident-pass")
    return K.PAGE_BYTES / FAULT_SECONDS, _si("oversub.fit.h2d-bytes") / stall


def _bytes_per_fault():
    return K.PAGE_BYTES, _si("pascal-um.migrated-bytes") / _si("pascal-um.faults")


def _fault_stall_covers_copy():
    return FAULT_SECONDS, K.PAGE_BYTES / _si("uvmbench.fault-copy-rate")


def _prefetch_rate(case):
    """The simulator's rate of explicit migrations in one case of its sourced range."""
    return dict(engine.range_models(PRESET))[case].bandwidth, _si("lab5.prefetch-rate")


# cudaOversubscribe's 20 GiB run (its log: "205 arrays :: 20.0195 GB", batch size 100 MB of
# doubles) made 10 passes (nRuns, commit c05f0c3); 4 are simulated, the last one steady.
ARRAY_BYTES, ARRAYS, PASSES, MEASURED_PASSES = 100 * MIB, 205, 4, 10


def _oversubscribed_run(tmp_path_factory):
    """cudaOversubscribe's 20 GiB run as a trace: `out` and 205 arrays of 100 MiB, a step per
    pass, each kernel out += arr (reads arr, reads and writes out), then out set to zero;
    naive Unified Memory on an 11 GiB card, the Gen3 preset."""
    t = TraceBuilder()
    out = t.alloc(ARRAY_BYTES)
    arrays = [t.alloc(ARRAY_BYTES) for _ in range(ARRAYS)]
    for p in range(PASSES):
        t.step(p)
        for a in arrays:
            t.launch(1, [a, out], [(a, ARRAY_BYTES, False), (out, ARRAY_BYTES, True)], ARRAY_BYTES // 8,
                     3 * ARRAY_BYTES)
        t.launch(2, [out], [(out, ARRAY_BYTES, True)], 0, ARRAY_BYTES)
    path = str(tmp_path_factory.mktemp("published") / "oversubscribe.trace")
    return engine.run(workload.load(t.write(path)), "naive", 11 * GIB, engine.gpu_model(PRESET))


@pytest.fixture(scope="module")
def oversubscribed(tmp_path_factory):
    return _oversubscribed_run(tmp_path_factory)


def _oversubscribed_streaming(run):
    return run.step_mean_seconds / (ARRAYS + 1), _si("oversub.over.kernel-mean")


def _oversubscribed_streaming_bytes(run):
    return run.steady_mean("h2d"), _si("oversub.over.h2d-bytes") / MEASURED_PASSES


PLAIN = {
    "kernel-from-host-gtx1080": _kernel_from_host_gtx1080,
    "fault-throughput-gtx1080ti": _fault_throughput_gtx1080ti,
    "bytes-per-fault": _bytes_per_fault,
    "fault-stall-covers-copy": _fault_stall_covers_copy,
    "prefetch-best-case": lambda: _prefetch_rate("best"),
    "prefetch-worst-case": lambda: _prefetch_rate("worst"),
}
SIMULATED = {
    "oversubscribed-streaming": _oversubscribed_streaming,
    "oversubscribed-streaming-bytes": _oversubscribed_streaming_bytes,
}


def _verdict(kind, ratio):
    if kind == "bound":
        return "holds" if ratio >= 1 else "violated"
    factor = DATA_FILE["tolerance"][f"{kind}_factor"]
    return "agrees" if 1 / factor <= ratio <= factor else "disagrees"


def _doc_row(comparison_id):
    rows = [line for line in open(DOC) if line.startswith(f"| `{comparison_id}` |")]
    assert len(rows) == 1, f"docs/published.md: one table row for `{comparison_id}` expected, found {len(rows)}"
    return rows[0]


def _cells(comparison_id):
    """The row's cells: comparison, what, card and link, measured, model, ratio, verdict, why."""
    return [cell.strip() for cell in _doc_row(comparison_id).strip().strip("|").split("|")]


def _check(comparison_id, model, measured):
    c = COMPARISONS[comparison_id]
    ratio = model / measured
    verdict = _verdict(c["kind"], ratio)
    assert abs(ratio - c["ratio"]) < 0.005 + 1e-9, \
        f"{comparison_id}: model / measured is now {ratio:.3f}, the data file records {c['ratio']}"
    assert verdict == c["verdict"], f"{comparison_id}: the model now {verdict}, the data file says {c['verdict']}"
    cells = _cells(comparison_id)
    assert cells[5:7] == [f"{c['ratio']:.2f}", c["verdict"]], \
        f"docs/published.md's row for `{comparison_id}` must show ratio {c['ratio']:.2f} and '{c['verdict']}'"


def test_every_measurement_says_where_it_is_from_and_how_it_was_read():
    for m in DATA_FILE["measurement"]:
        missing = [f for f in MEASUREMENT_FIELDS if not m.get(f)]
        assert not missing, f"{m.get('id')}: missing {missing}"
        values = m["value"] if isinstance(m["value"], list) else [m["value"]]
        assert all(isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in values), m["id"]
        if "plot" in m["extraction"]:
            assert m.get("uncertainty", 0) > 0, f"{m['id']}: read off a plot without its uncertainty"
    assert len(MEASURED) == len(DATA_FILE["measurement"]), "duplicate measurement ids"


def test_tolerances_are_fixed_in_the_data_file():
    tol = DATA_FILE["tolerance"]
    assert tol["time_factor"] > 1 and tol["count_factor"] > 1
    assert tol["count_factor"] <= tol["time_factor"]


def test_every_comparison_is_checked_and_well_formed():
    assert set(COMPARISONS) == set(PLAIN) | set(SIMULATED)
    assert len(COMPARISONS) == len(DATA_FILE["comparison"]), "duplicate comparison ids"
    for c in COMPARISONS.values():
        missing = [f for f in COMPARISON_FIELDS if f not in c]
        assert not missing, f"{c['id']}: missing {missing}"
        assert c["verdict"] in VERDICTS[c["kind"]], c["id"]
        cells = _cells(c["id"])
        assert len(cells) == 8 and cells[7], f"{c['id']}: docs/published.md's row needs 8 cells, the last why"


@pytest.mark.parametrize("comparison_id", sorted(PLAIN))
def test_model_against_measurement(comparison_id):
    _check(comparison_id, *PLAIN[comparison_id]())


@pytest.mark.parametrize("comparison_id", sorted(SIMULATED))
def test_simulated_run_against_measurement(comparison_id, oversubscribed):
    _check(comparison_id, *SIMULATED[comparison_id](oversubscribed))


def test_the_simulated_run_is_the_measured_program(oversubscribed):
    """The trace is cudaOversubscribe's run: every steady pass streams every array through
    the GPU (it cannot hold them), as the measured run did."""
    assert oversubscribed.steady
    per_pass = np.asarray(oversubscribed.per_step["h2d"])[oversubscribed.steady]
    assert np.all(per_pass >= ARRAYS * ARRAY_BYTES)
    assert oversubscribed.driver_evictions > 0


# ---- the host link's range (issue 28 item 4) ----
LINK = [m for m in DATA_FILE["measurement"] if "direction" in m]


def _link_fractions(model, both_at_once):
    """(host->device, device->host) rates of a range case as fractions of its line rate, one
    direction alone or both at once (under nvbandwidth's bidirectional load)."""
    rates = (model.bandwidth, model.d2h_rate)
    if both_at_once:
        rates = K.link_rates_both(*rates, model.full_duplex)
    return tuple(r / model.link_bytes_per_s for r in rates)


def _link_row(m, gpu=K.DEFAULT_GPU):
    """(measured fraction of its line rate, the worst case's, the best case's) on `gpu`."""
    fraction = _si(m["id"]) / K.pcie_bytes_per_s(m["pcie_generation"], 16)
    side = 0 if m["direction"] == "h2d" else 1
    cases = dict(engine.range_models(gpu))
    worst, best = (_link_fractions(cases[case], m["both_at_once"])[side] for case in ("worst", "best"))
    return fraction, worst, best


@pytest.mark.parametrize("gpu", sorted(K.GPU_PRESETS))
@pytest.mark.parametrize("measurement", LINK, ids=[m["id"] for m in LINK])
def test_the_link_range_covers_every_measured_copy_rate(gpu, measurement):
    """Each preset's worst case is at or below every measured host<->device copy rate, and its
    best case at or above, as fractions of the measured link's line rate (the presets share
    the fractions): direction by direction, alone and with the other direction busy."""
    fraction, worst, best = _link_row(measurement, gpu)
    assert worst <= fraction <= best, (measurement["id"], worst, fraction, best)


def test_the_link_table_says_what_the_range_is():
    """docs/published.md's link table: id, quantity, measured, its fraction, worst, best, why."""
    for m in LINK:
        fraction, worst, best = _link_row(m)
        cells = _cells(m["id"])
        assert cells[3:6] == [f"{fraction:.0%}", f"{worst:.0%}", f"{best:.0%}"], (m["id"], cells)
