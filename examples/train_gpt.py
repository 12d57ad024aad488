#!/usr/bin/env python3
"""Train a GPT-2-style transformer on random tokens: pump's main example of a training job.

    python examples/train_gpt.py                       # the tiny preset, on the GPU if there is one
    pump-run python examples/train_gpt.py              # the same job under pump, unchanged
    python examples/train_gpt.py --preset gpt2 --steps 20 --json

A decoder-only transformer (GPT-2's layout: learned positions, pre-LayerNorm blocks of
causal self-attention and a 4x GELU MLP, the output layer tied to the token embedding)
built from a preset and overrides, trained with AdamW on a fixed pool of random token
batches (so the loss falls as the model memorises them).  Nothing is downloaded.

Runs are reproducible bit for bit on one machine: fixed seeds, the weights initialised on
the CPU, torch.use_deterministic_algorithms(True), CUBLAS_WORKSPACE_CONFIG=:4096:8 (set
before CUDA starts, unless the user set it), cudnn.benchmark off, attention written out
with matmuls (the fused kernels' backward passes are not all deterministic) and the loss
as log_softmax + gather (both deterministic on CUDA).  A run under pump-run gives the same
losses and checksum as one without it.

--json prints one object per timed step, {"step", "loss", "loss_hex", "ms"} (loss_hex is
float.hex of the loss, for bit-identical comparison), then one final object {"steps",
"checksum_hex" (SHA-256 of every parameter's bytes after training), "params", "device",
"peak_bytes" (torch.cuda.max_memory_allocated on a GPU, else null), "preset", "config",
"warmup", "filler_bytes"}.  --warmup steps train too but are neither printed nor timed.

--filler-bytes N (on a GPU) first takes N bytes of plain device memory that Unified Memory
cannot evict, before any tensor reaches the GPU, and holds them to the end
(examples/device_filler.py): under pump-run the job's managed memory then has that much less of
the card, which is real oversubscription (the GPU suite's case f).  Where the driver refuses
the filler the job says why and exits with status 4, without training.

Without a GPU (--device auto), the text output ends with what pump does on its CPU model
of the driver (examples/no_gpu_demo.py; --no-demo skips it).  Without PyTorch (a plain
`pip install .`), the job cannot train: it says so and shows that alone.
"""
import argparse
import contextlib
import dataclasses
import hashlib
import json
import math
import os
import sys
import time

# cuBLAS needs this before CUDA initialises to be deterministic; a user's own value stays.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import device_filler  # noqa: E402  (beside this file: Python puts the script's directory on sys.path)
import no_gpu_demo  # noqa: E402

try:
    import torch  # noqa: E402  (after the environment is set)
    import torch.nn as nn  # noqa: E402
except ModuleNotFoundError as missing:
    if __name__ != "__main__" or missing.name != "torch":
        raise
    print("PyTorch is not installed, so this job cannot train here (pip install '.[models]' brings "
          "PyTorch; on a GPU, a CUDA build of it: pytorch.org).", flush=True)
    sys.exit(0 if "--no-demo" not in sys.argv[1:] and no_gpu_demo.show() else 1)


@dataclasses.dataclass(frozen=True)
class GPTConfig:
    layers: int
    d_model: int
    heads: int
    seq: int      # tokens per sequence (the context length)
    batch: int    # sequences per step
    vocab: int


PRESETS = {
    "tiny": GPTConfig(layers=4, d_model=192, heads=6, seq=64, batch=8, vocab=4096),  # ~2.6M parameters
    "gpt2": GPTConfig(layers=12, d_model=768, heads=12, seq=1024, batch=8, vocab=50257),  # 124M
    "gpt2-medium": GPTConfig(layers=24, d_model=1024, heads=16, seq=1024, batch=8, vocab=50257),  # 350M
}
DATA_BATCHES = 4     # the pool of random batches the steps cycle through
LEARNING_RATE = 3e-4
EXIT_NO_FILLER = 4   # --filler-bytes: the driver would not give the filler


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.heads = cfg.heads
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.register_buffer("mask", torch.ones(cfg.seq, cfg.seq, dtype=torch.bool).tril(), persistent=False)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(~self.mask[:t, :t], float("-inf")).softmax(dim=-1)
        return self.proj((att @ v).transpose(1, 2).contiguous().view(b, t, c))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(cfg.d_model), nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.mlp = nn.Sequential(nn.Linear(cfg.d_model, 4 * cfg.d_model), nn.GELU(),
                                 nn.Linear(4 * cfg.d_model, cfg.d_model))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.tokens = nn.Embedding(cfg.vocab, cfg.d_model)
        self.positions = nn.Embedding(cfg.seq, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)
        self.head.weight = self.tokens.weight  # tied, as in GPT-2
        # GPT-2's initialisation; residual projections scaled down by the depth.
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * cfg.layers) if name.endswith(("proj.weight", "mlp.2.weight")) else 0.02
                nn.init.normal_(p, mean=0.0, std=std)

    def forward(self, idx):
        t = idx.size(1)
        x = self.tokens(idx) + self.positions(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def cross_entropy(logits, targets):
    """Mean negative log-likelihood, through ops that are deterministic on CUDA."""
    logp = logits.view(-1, logits.size(-1)).log_softmax(dim=-1)
    return -logp.gather(1, targets.reshape(-1, 1)).mean()


def parameter_checksum(model) -> str:
    digest = hashlib.sha256()
    for name, p in model.named_parameters():
        digest.update(name.encode())
        digest.update(p.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", choices=PRESETS, default="tiny",
                    help="model and batch size (default tiny: a CPU step well under a second)")
    for field in dataclasses.fields(GPTConfig):
        ap.add_argument("--" + field.name.replace("_", "-"), type=int, metavar="N",
                        help=f"override the preset's {field.name}")
    ap.add_argument("--steps", type=int, default=10, metavar="N", help="timed training steps (default 10)")
    ap.add_argument("--warmup", type=int, default=0, metavar="N",
                    help="untimed, unprinted training steps before them (default 0)")
    ap.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                    help="auto (default): cuda if PyTorch sees a GPU, else cpu")
    ap.add_argument("--seed", type=int, default=0, help="seed of the weights and the data (default 0)")
    ap.add_argument("--json", action="store_true", help="JSON lines instead of text (see the module docstring)")
    ap.add_argument("--filler-bytes", type=int, default=0, metavar="N",
                    help="on a GPU, first hold N bytes of device memory that Unified Memory cannot evict, to the "
                         "end (default 0: none; see the module docstring)")
    ap.add_argument("--no-demo", action="store_true",
                    help="without a GPU (--device auto), skip showing pump on its CPU model of the driver "
                         "(examples/no_gpu_demo.py) after training")
    args = ap.parse_args(argv)
    overrides = {f.name: getattr(args, f.name) for f in dataclasses.fields(GPTConfig)
                 if getattr(args, f.name) is not None}
    cfg = dataclasses.replace(PRESETS[args.preset], **overrides)
    bad = [name for name, value in dataclasses.asdict(cfg).items() if value < 1]
    if bad:
        ap.error(f"{', '.join('--' + b.replace('_', '-') for b in bad)}: allowed: an integer >= 1")
    if cfg.d_model % cfg.heads:
        ap.error(f"--d-model {cfg.d_model} is not a multiple of --heads {cfg.heads}; allowed: d_model = heads x head size")
    if args.steps < 1 or args.warmup < 0:
        ap.error("allowed: --steps N >= 1 and --warmup N >= 0")
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: PyTorch sees no GPU here; allowed: --device cpu or auto")
    if args.filler_bytes < 0:
        ap.error(f"--filler-bytes {args.filler_bytes}: allowed: N >= 0")
    if args.filler_bytes and not (args.device != "cpu" and torch.cuda.is_available()):
        ap.error("--filler-bytes: there is no GPU to fill here; allowed: --device cuda on a GPU")
    return args, cfg


def main(argv=None):
    args, cfg = parse_args(argv)
    on_gpu = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
    holder = device_filler.DeviceFiller(args.filler_bytes, device.index) if args.filler_bytes else None
    try:
        with holder or contextlib.nullcontext():  # taken before any tensor reaches the GPU
            train(args, cfg, device, holder.nbytes if holder else 0)
    except device_filler.FillerFailed as exc:
        print(f"train_gpt.py: --filler-bytes {args.filler_bytes}: {exc}", file=sys.stderr)
        return EXIT_NO_FILLER
    return 0


def train(args, cfg, device, filler_bytes):
    """Trains and prints the steps and the final record (module docstring)."""
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    torch.manual_seed(args.seed)  # the CPU's and every GPU's generators

    model = GPT(cfg).to(device)  # initialised on the CPU: the same weights on any device
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
    data = torch.Generator().manual_seed(args.seed + 1)
    batches = [torch.randint(cfg.vocab, (cfg.batch, cfg.seq + 1), generator=data) for _ in range(DATA_BATCHES)]
    params = sum(p.numel() for p in model.parameters())
    if not args.json:
        print(f"{args.preset}: {params / 1e6:.1f}M parameters, {cfg}, on {device}", flush=True)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def train_step(step):
        tokens = batches[step % DATA_BATCHES].to(device)
        loss = cross_entropy(model(tokens[:, :-1]), tokens[:, 1:])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss.item()  # waits for the step (the loss is on the device)

    for step in range(args.warmup):
        train_step(step)
    for step in range(args.steps):
        sync()
        t0 = time.perf_counter()
        loss = train_step(args.warmup + step)
        sync()
        ms = (time.perf_counter() - t0) * 1e3
        if args.json:
            print(json.dumps({"step": step, "loss": loss, "loss_hex": loss.hex(), "ms": round(ms, 3)}), flush=True)
        else:
            print(f"step {step}: loss {loss:.4f}, {ms:.1f} ms", flush=True)

    checksum = parameter_checksum(model)
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    if args.json:
        print(json.dumps({"steps": args.steps, "checksum_hex": checksum, "params": params, "device": str(device),
                          "peak_bytes": peak, "preset": args.preset, "config": dataclasses.asdict(cfg),
                          "warmup": args.warmup, "filler_bytes": filler_bytes}), flush=True)
    else:
        peak_text = f", peak {peak / 2**20:.0f} MiB allocated" if peak is not None else ""
        print(f"checksum {checksum[:16]} after {args.steps} steps{peak_text}")
        if args.device == "auto" and device.type == "cpu" and not args.no_demo:
            print("\nNo GPU here, so the job trained on the CPU and pump had nothing to do.", flush=True)
            no_gpu_demo.show()


if __name__ == "__main__":
    sys.exit(main())
