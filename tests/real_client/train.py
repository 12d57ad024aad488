"""The real client's training loops (issue 26 item 4), run by tests/test_real_client_training.py
with PyTorch's CUDA build on fakecuda, bare and under pump-run: a small GPT-style model
(embedding, SDPA attention, layer norm, GELU, cross-entropy) trained with AdamW foreach and
fused, and a small convolutional one (convolution, batch norm); gradient clipping, an .item()
each step, a checkpoint saved to the host (argv[1], a directory). Prints one JSON line: per
loop, whether it ran, its steps and the checkpoint's tensors (names and shapes). Kernels are
no-ops on fakecuda, so no value is printed or checked."""
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


def train(model, batch, optimizer, logits=lambda out: out):
    for _ in range(STEPS):
        x, y = batch()
        loss = F.cross_entropy(logits(model(x)), y)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        loss.item()
    return model


def gpt(fused):
    model = GPT().cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=None if fused else True, fused=fused or None)

    def batch():
        idx = torch.randint(0, VOCAB, (4, SEQ), device="cuda")
        return idx, idx.view(-1)
    return train(model, batch, opt, lambda out: out.view(-1, VOCAB))


def conv():
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Linear(8, 10)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    return train(model, lambda: (torch.randn(4, 3, 16, 16, device="cuda"), torch.randint(0, 10, (4,), device="cuda")),
                 opt)


out = {}
for name, make in [("gpt_foreach", lambda: gpt(False)), ("gpt_fused", lambda: gpt(True)), ("conv", conv)]:
    try:
        model = make()
        state = {k: v.cpu() for k, v in model.state_dict().items()}
        torch.save(state, f"{sys.argv[1]}/{name}.pt")
        out[name] = {"ok": True, "steps": STEPS, "checkpoint": {k: list(v.shape) for k, v in state.items()}}
    except Exception as e:  # reported, so the test names the loop and the error
        out[name] = {"ok": False, "error": f"{type(e).__name__}: {str(e).splitlines()[0]}"}
torch.cuda.synchronize()
print(json.dumps(out))
