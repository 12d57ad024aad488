"""The real client's training loops (issue 26 item 4), run by tests/test_real_client_training.py
and tests/test_real_client_allocators.py with PyTorch's CUDA build on fakecuda, bare and under
pump-run: a small GPT-style model (embedding, SDPA attention, layer norm, GELU, cross-entropy)
trained with AdamW foreach and fused, a small convolutional one (convolution, batch norm; cuDNN
in benchmark mode, which sizes its workspace from the allocator's cacheInfo), and the GPT-style
step captured in a CUDA graph and replayed (torch.cuda.graphs), and the GPT one at width 512
(wide: tensors of whole 2 MiB blocks); gradient clipping, an .item()
each step, a checkpoint saved to the host (argv[1], a directory). argv[2], if given, names the
loops to run (comma-separated). Then PyTorch's memory answers (mem_get_info, memory_stats and
what is built on them) are checked against what this script knows it holds.

Prints one JSON line: per loop, whether it ran, its steps and the checkpoint's tensors (names
and shapes); "memory": the answers that did not hold. Kernels are no-ops on fakecuda, so no
value is printed or checked."""
import json
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

STEPS, VOCAB, SEQ = 3, 64, 16


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, d=32, heads=4):
        super().__init__()
        self.tok, self.pos = nn.Embedding(VOCAB, d), nn.Embedding(SEQ, d)
        self.blocks = nn.Sequential(Block(d, heads), Block(d, heads))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, VOCAB)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        return self.head(self.ln(self.blocks(x)))


def train(model, batch, optimizer, logits=lambda out: out, steps=STEPS):
    for _ in range(steps):
        x, y = batch()
        loss = F.cross_entropy(logits(model(x)), y)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        loss.item()
    return model


def gpt_job(fused, d=32, heads=4):
    """The GPT loop's model, batch, optimizer and logits (train's arguments)."""
    model = GPT(d, heads).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=None if fused else True, fused=fused or None)

    def batch():
        idx = torch.randint(0, VOCAB, (4, SEQ), device="cuda")
        return idx, idx.view(-1)
    return model, batch, opt, lambda out: out.view(-1, VOCAB)


def gpt(fused):
    return train(*gpt_job(fused))


def conv():
    torch.backends.cudnn.benchmark = True
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Linear(8, 10)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    return train(model, lambda: (torch.randn(4, 3, 16, 16, device="cuda"), torch.randint(0, 10, (4,), device="cuda")),
                 opt)


def graph():
    """The GPT-style step captured once in a CUDA graph, after warm-up on a side stream, and
    replayed each step on new data copied into its static inputs (PyTorch's recipe)."""
    model = GPT().cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True, capturable=True)
    x = torch.randint(0, VOCAB, (4, SEQ), device="cuda")
    y = x.view(-1).clone()

    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x).view(-1, VOCAB), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        loss = step()
    for _ in range(STEPS):
        x.copy_(torch.randint(0, VOCAB, (4, SEQ), device="cuda"))
        y.copy_(x.view(-1))
        g.replay()
        loss.item()
    return model


def compiled():
    """A small model through torch.compile (Inductor's Triton kernels, compiled by Triton's own
    ptxas for the persona's sm_90, forward and backward), trained as the others."""
    model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.LayerNorm(64), nn.Linear(64, 10)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    step = torch.compile(model)
    train(step, lambda: (torch.randn(8, 32, device="cuda"), torch.randint(0, 10, (8,), device="cuda")), opt)
    return model


def memory_answers():
    """What PyTorch answers about memory against what this script knows: a tensor of a whole
    number of blocks counted exactly while it lives and gone when freed, peaks reset, free
    memory within the total. Returns the answers that did not hold."""
    bad = []
    free, total = torch.cuda.mem_get_info()
    if not 0 < free <= total <= torch.cuda.get_device_properties(0).total_memory:
        bad.append(f"mem_get_info: free {free}, total {total}")
    keys = ("allocated_bytes.all.current", "active_bytes.all.current", "requested_bytes.all.current",
            "allocation.all.current", "active.all.current")
    size = 3 << 20
    before = torch.cuda.memory_stats()
    x = torch.empty(size, dtype=torch.uint8, device="cuda")
    during = torch.cuda.memory_stats()
    del x
    after = torch.cuda.memory_stats()
    for key in keys:
        want = size if "bytes" in key else 1
        if during[key] - before[key] != want or after[key] != before[key]:
            bad.append(f"{key}: {before[key]} before, {during[key]} with {want} more, {after[key]} after")
    if during["reserved_bytes.all.current"] < during["allocated_bytes.all.current"]:
        bad.append(f"reserved {during['reserved_bytes.all.current']} < allocated {during['allocated_bytes.all.current']}")
    if torch.cuda.memory_allocated() != after["allocated_bytes.all.current"]:
        bad.append(f"memory_allocated() {torch.cuda.memory_allocated()} is not memory_stats'")
    torch.cuda.reset_peak_memory_stats()
    if torch.cuda.max_memory_allocated() != torch.cuda.memory_allocated():
        bad.append("the peak after reset_peak_memory_stats is not the current figure")
    torch.cuda.memory_summary()  # raises where the allocator has no stats
    return bad


def wide():
    """The GPT loop at width 512: its MLP's weights and their gradients are 4 MiB each, whole 2 MiB
    blocks that a budget can evict and, freed (zero_grad drops the gradients), discard."""
    return train(*gpt_job(False, 512, 8))


LOOPS = {"gpt_foreach": lambda: gpt(False), "gpt_fused": lambda: gpt(True), "conv": conv, "graph": graph,
         "compiled": compiled, "wide": wide}


def main():
    chosen = sys.argv[2].split(",") if len(sys.argv) > 2 else ["gpt_foreach", "gpt_fused", "conv"]
    out = {}
    for name, make in ((n, LOOPS[n]) for n in chosen):
        try:
            model = make()
            state = {k: v.cpu() for k, v in model.state_dict().items()}
            torch.save(state, f"{sys.argv[1]}/{name}.pt")
            out[name] = {"ok": True, "steps": STEPS, "checkpoint": {k: list(v.shape) for k, v in state.items()}}
        except Exception as e:  # reported, so the test names the loop and the error
            out[name] = {"ok": False, "error": f"{type(e).__name__}: {str(e).splitlines()[0]}"}
    torch.cuda.synchronize()
    try:
        out["memory"] = {"ok": True, "violations": memory_answers()}
    except Exception as e:
        out["memory"] = {"ok": False, "error": f"{type(e).__name__}: {str(e).splitlines()[0]}"}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
