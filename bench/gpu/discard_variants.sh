#!/usr/bin/env bash
# Whether case c stays bit-identical on a real GPU with the caching allocator's dead tensors
# discarded, and what discarding saves: the question the H100 and H200 runs left (launch-discards
# computed another loss, launch-poison did not: bench/results/gpu-20261127-nvidia-h200/
# discard-question), answered in bench/results/gpu-20261127-nvidia-h200/discard-variants (the
# driver's discard is not ordered before the work queued behind it; pump now waits for the
# freeing stream to drain first).
#
#     bash bench/gpu/discard_variants.sh OUT_DIR
#
# Run on the GPU machine, pump installed (docs/gpu-check.md). Refuses a GPU with less than 40 GiB
# free: the job is the GPU suite's case c (examples/train_gpt.py, GPT-2 b8 s512, 7.7 GB at peak)
# under its emulated 3.6 GiB budget, 1 warm-up and 2 timed steps, one process per variant:
#   ideal                 the job alone (its losses and parameters' checksum are the reference)
#   launch                pump's launch rule, dead tensors kept (PUMP_TORCH_DISCARDS=0)
#   discards              PUMP_TORCH_DISCARDS=1: discarded once the freeing stream has drained
#   discards-blocking     the same with CUDA_LAUNCH_BLOCKING=1 (every kernel done before the next
#                         call: the way the first of those runs showed the order mattered)
#   poison                PUMP_TORCH_DISCARDS=poison: the same decisions, NaN written instead
# then bench/gpu/probes/discard_late.py and discard_writes.py (OUT_DIR/<probe>.json). Each
# variant's output and pump's counters go to OUT_DIR/variants.tar.gz (<variant>.txt,
# <variant>.json); OUT_DIR/summary.txt has one line per variant: whether its losses and
# parameters' checksum are the ideal run's, its step times and pump's bytes.
set -u
out=${1:?usage: discard_variants.sh OUT_DIR}
mkdir -p "$out"
cd "$(dirname "$0")/../.."
free_mib=$(nvidia-smi --query-gpu=memory.free --format=csv,noheader,nounits -i 0 | head -1)
if [ "${free_mib:-0}" -lt 40960 ]; then
    echo "discard_variants.sh: the GPU has ${free_mib:-?} MiB free, fewer than the 40 GiB this needs: refused" >&2
    exit 3
fi
pump_run="$(dirname "$(command -v python3)")/pump-run"
job=(python3 examples/train_gpt.py --preset gpt2 --batch 8 --seq 512 --device cuda --json --warmup 1 --steps 2)
budget=(--policy launch --capacity "$((free_mib * 1024 * 1024 * 9 / 10))" --budget 3846176768)

run() {  # run NAME ENV... -- : the variant, under a 150 s limit
    local name=$1
    shift
    local began=$SECONDS
    if [ "$name" = ideal ]; then
        timeout 150 "${job[@]}" >"$out/$name.txt" 2>&1
    else
        timeout 150 env "$@" "$pump_run" "${budget[@]}" --stats "$out/$name.json" -- "${job[@]}" >"$out/$name.txt" 2>&1
    fi
    echo "$name: rc $? in $((SECONDS - began)) s" >>"$out/rc.txt"
}

variants=(ideal launch discards discards-blocking poison)
run ideal
run launch PUMP_TORCH_DISCARDS=0
run discards PUMP_TORCH_DISCARDS=1
run discards-blocking PUMP_TORCH_DISCARDS=1 CUDA_LAUNCH_BLOCKING=1
run poison PUMP_TORCH_DISCARDS=poison
for probe in discard_late discard_writes; do
    timeout 90 python3 "bench/gpu/probes/$probe.py" --mib 64 --rounds 5 >"$out/$probe.json" 2>&1
    echo "$probe: rc $?" >>"$out/rc.txt"
done

python3 - "$out" "${variants[@]}" <<'EOF'
import json, pathlib, sys
out, names = pathlib.Path(sys.argv[1]), sys.argv[2:]
def read(name):
    lines = [json.loads(l) for l in (out / f"{name}.txt").read_text().splitlines() if l.startswith("{")]
    return ([l["loss_hex"] for l in lines if "loss_hex" in l], next((l["checksum_hex"] for l in lines if "checksum_hex" in l), None),
            [l["ms"] for l in lines if "ms" in l])
def moved(name):
    try:
        totals = json.loads((out / f"{name}.json").read_text())["totals"]
    except (OSError, ValueError, KeyError):
        return ""
    return " pump GB: prefetched %.1f evicted %.1f discarded %.1f" % tuple(
        totals.get(k, 0) / 1e9 for k in ("prefetch_bytes", "bytes_evicted", "bytes_discarded"))
ideal = read("ideal")[:2]
with open(out / "summary.txt", "w") as f:
    for name in names:
        try:
            losses, checksum, ms = read(name)
        except (OSError, ValueError) as e:
            print(f"{name}: unreadable ({e})", file=f)
            continue
        same = "bit-identical" if (losses, checksum) == ideal and checksum else "DIFFERS"
        print(f"{name}: {same} losses {' '.join(losses)} checksum {(checksum or '-')[:16]} ms {' '.join(f'{m:.0f}' for m in ms)}"
              + moved(name), file=f)
print((out / "summary.txt").read_text())
EOF
cat "$out/rc.txt"
cd "$out" && files=$(ls ./*.txt ./*.json | grep -Ev '^\./(summary\.txt|discard_late\.json|discard_writes\.json)$') &&
    tar -czf variants.tar.gz $files && rm -f $files
