"""Jobs of the real-client benchmark beyond train.py's small ones (issue 41 item 5), each built from
a published architecture's configuration, without its weights, and trained as train.train does
(cross-entropy, backward, gradient clipping, AdamW foreach, an .item() each step).

  gpt2-small   OpenAI's GPT-2 small (openai-community/gpt2's config.json: n_layer 12, n_head 12,
               n_embd 768, vocab_size 50257, n_positions 1024; embeddings tied to the head;
               its tanh GELU), 124M parameters, at batch 4 and 256 tokens: tensors of whole
               2 MiB blocks (a 768x3072 weight is 9 MiB), logits of 196 MiB.
Each job function returns train.train's (model, batch, optimizer, logits)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

import train

GPT2_SMALL = {"n_layer": 12, "n_head": 12, "n_embd": 768, "vocab_size": 50257, "n_positions": 1024}


class Block(train.Block):
    """train.Block (pre-norm attention and MLP) with GPT-2's tanh approximation of GELU."""

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT2(nn.Module):
    def __init__(self, n_layer, n_head, n_embd, vocab_size, n_positions):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab_size, n_embd), nn.Embedding(n_positions, n_embd)
        self.blocks = nn.Sequential(*(Block(n_embd, n_head) for _ in range(n_layer)))
        self.ln = nn.LayerNorm(n_embd)
        self.head = nn.Linear(n_embd, vocab_size, bias=False)
        self.head.weight = self.tok.weight

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        return self.head(self.ln(self.blocks(x)))


def gpt2_small_job(batch=4, seq=256):
    config = GPT2_SMALL
    model = GPT2(**config).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)

    def make_batch():
        idx = torch.randint(0, config["vocab_size"], (batch, seq), device="cuda")
        return idx, idx.view(-1)
    return model, make_batch, opt, lambda out: out.view(-1, config["vocab_size"])
