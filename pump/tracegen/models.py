"""The models the trace generator trains, built from their published configurations
in plain torch.nn (no downloads, no torchvision or transformers): ResNet-50, BERT-base
(masked-language-model head), GPT-2 medium (language-model head tied to the token
embedding) and ViT-B/16, each also in a tiny configuration for tests.

Attention is written out (matmul, softmax, dropout, matmul) as the reference
implementations' eager paths do, so its probabilities are stored for backward.
Every model is built on the meta device: parameters have shapes, not memory.
"""

import dataclasses
import math

import torch
from torch import nn
from torch.nn import functional as F

from pump.tracegen import MODEL_NAMES


# --- ResNet-50 (He et al. 2016; torchvision's v1.5: stride on the 3x3 convolution) ---------

@dataclasses.dataclass(frozen=True)
class ResNetConfig:
    layers: tuple = (3, 4, 6, 3)
    width: int = 64
    classes: int = 1000
    image: int = 224
    batch: int = 64


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int):
        super().__init__()
        out = planes * self.expansion
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        self.downsample = None
        if stride != 1 or inplanes != out:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, out, 1, stride=stride, bias=False),
                                            nn.BatchNorm2d(out))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)), inplace=True)
        y = F.relu(self.bn2(self.conv2(y)), inplace=True)
        y = self.bn3(self.conv3(y))
        shortcut = x if self.downsample is None else self.downsample(x)
        return F.relu(y + shortcut, inplace=True)


class ResNet(nn.Module):
    def __init__(self, c: ResNetConfig):
        super().__init__()
        self.conv1 = nn.Conv2d(3, c.width, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(c.width)
        blocks, inplanes = [], c.width
        for stage, count in enumerate(c.layers):
            planes = c.width * 2 ** stage
            for i in range(count):
                blocks.append(Bottleneck(inplanes, planes, 2 if stage and not i else 1))
                inplanes = planes * Bottleneck.expansion
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(inplanes, c.classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x)), inplace=True), 3, stride=2, padding=1)
        x = self.blocks(x)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


# --- the transformers ----------------------------------------------------------------------

class SelfAttention(nn.Module):
    """Multi-head self-attention; ``fused``: one projection makes q, k and v (GPT-2, ViT),
    else three (BERT); ``causal``: a token sees only those before it (GPT-2)."""

    def __init__(self, d: int, heads: int, dropout: float, fused: bool, causal_positions: int = 0):
        super().__init__()
        self.heads = heads
        if fused:
            self.qkv = nn.Linear(d, 3 * d)
        else:
            self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.out = nn.Linear(d, d)
        self.attn_dropout, self.out_dropout = nn.Dropout(dropout), nn.Dropout(dropout)
        if causal_positions:
            future = torch.ones(causal_positions, causal_positions, dtype=torch.bool).triu(1)
            self.register_buffer("future", future, persistent=False)
        else:
            self.future = None

    def forward(self, x):
        b, s, d = x.shape
        if hasattr(self, "qkv"):
            q, k, v = self.qkv(x).split(d, dim=2)
        else:
            q, k, v = self.q(x), self.k(x), self.v(x)
        q, k, v = (t.view(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(d // self.heads)
        if self.future is not None:
            scores = scores.masked_fill(self.future[:s, :s], torch.finfo(scores.dtype).min)
        probs = self.attn_dropout(F.softmax(scores, dim=-1))
        context = torch.matmul(probs, v).transpose(1, 2).reshape(b, s, d)
        return self.out_dropout(self.out(context))


class MLP(nn.Sequential):
    def __init__(self, d: int, hidden: int, dropout: float, gelu: str = "none"):
        super().__init__(nn.Linear(d, hidden), nn.GELU(approximate=gelu), nn.Linear(hidden, d), nn.Dropout(dropout))


class PostNormLayer(nn.Module):
    """BERT's encoder layer: sublayer, residual, then LayerNorm."""

    def __init__(self, d, heads, hidden, dropout):
        super().__init__()
        self.attention = SelfAttention(d, heads, dropout, fused=False)
        self.norm1 = nn.LayerNorm(d, eps=1e-12)
        self.mlp = MLP(d, hidden, dropout)
        self.norm2 = nn.LayerNorm(d, eps=1e-12)

    def forward(self, x):
        x = self.norm1(x + self.attention(x))
        return self.norm2(x + self.mlp(x))


class PreNormLayer(nn.Module):
    """GPT-2's and ViT's block: LayerNorm, sublayer, residual."""

    def __init__(self, d, heads, hidden, dropout, eps, gelu, causal_positions=0):
        super().__init__()
        self.norm1 = nn.LayerNorm(d, eps=eps)
        self.attention = SelfAttention(d, heads, dropout, fused=True, causal_positions=causal_positions)
        self.norm2 = nn.LayerNorm(d, eps=eps)
        self.mlp = MLP(d, hidden, dropout, gelu)

    def forward(self, x):
        x = x + self.attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))


# --- BERT-base (Devlin et al. 2019), masked-language-model pretraining head ---------------

@dataclasses.dataclass(frozen=True)
class BertConfig:
    layers: int = 12
    hidden: int = 768
    heads: int = 12
    intermediate: int = 3072
    vocab: int = 30522
    max_positions: int = 512
    token_types: int = 2
    dropout: float = 0.1
    batch: int = 16
    seq: int = 512


class Bert(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.tokens = nn.Embedding(c.vocab, c.hidden)
        self.positions = nn.Embedding(c.max_positions, c.hidden)
        self.token_types = nn.Embedding(c.token_types, c.hidden)
        self.embed_norm = nn.LayerNorm(c.hidden, eps=1e-12)
        self.embed_dropout = nn.Dropout(c.dropout)
        self.layers = nn.Sequential(*(PostNormLayer(c.hidden, c.heads, c.intermediate, c.dropout)
                                      for _ in range(c.layers)))
        self.head_transform = nn.Sequential(nn.Linear(c.hidden, c.hidden), nn.GELU(),
                                            nn.LayerNorm(c.hidden, eps=1e-12))
        self.head_bias = nn.Parameter(torch.zeros(c.vocab))
        self.register_buffer("position_ids", torch.arange(c.max_positions), persistent=False)
        self.register_buffer("token_type_ids", torch.zeros(c.max_positions, dtype=torch.long), persistent=False)

    def forward(self, ids):
        s = ids.shape[1]
        x = self.tokens(ids) + self.token_types(self.token_type_ids[:s]) + self.positions(self.position_ids[:s])
        x = self.layers(self.embed_dropout(self.embed_norm(x)))
        # The decoder shares the token embedding's weight, as BERT's does.
        return F.linear(self.head_transform(x), self.tokens.weight, self.head_bias)


# --- GPT-2 medium (Radford et al. 2019) -----------------------------------------------------

@dataclasses.dataclass(frozen=True)
class GPT2Config:
    layers: int = 24
    d: int = 1024
    heads: int = 16
    vocab: int = 50257
    max_positions: int = 1024
    dropout: float = 0.1
    batch: int = 4
    seq: int = 1024


class GPT2(nn.Module):
    def __init__(self, c: GPT2Config):
        super().__init__()
        self.tokens = nn.Embedding(c.vocab, c.d)
        self.positions = nn.Embedding(c.max_positions, c.d)
        self.embed_dropout = nn.Dropout(c.dropout)
        self.blocks = nn.Sequential(*(PreNormLayer(c.d, c.heads, 4 * c.d, c.dropout, 1e-5, "tanh", c.max_positions)
                                      for _ in range(c.layers)))
        self.norm = nn.LayerNorm(c.d, eps=1e-5)
        self.register_buffer("position_ids", torch.arange(c.max_positions), persistent=False)

    def forward(self, ids):
        x = self.embed_dropout(self.tokens(ids) + self.positions(self.position_ids[:ids.shape[1]]))
        # The language-model head is the token embedding's weight, as GPT-2's is.
        return F.linear(self.norm(self.blocks(x)), self.tokens.weight)


# --- ViT-B/16 (Dosovitskiy et al. 2021) -----------------------------------------------------

@dataclasses.dataclass(frozen=True)
class ViTConfig:
    image: int = 224
    patch: int = 16
    d: int = 768
    layers: int = 12
    heads: int = 12
    mlp: int = 3072
    classes: int = 1000
    dropout: float = 0.0
    batch: int = 64


class ViT(nn.Module):
    def __init__(self, c: ViTConfig):
        super().__init__()
        self.patches = nn.Conv2d(3, c.d, c.patch, stride=c.patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, c.d))
        self.positions = nn.Parameter(torch.zeros(1, (c.image // c.patch) ** 2 + 1, c.d))
        self.dropout = nn.Dropout(c.dropout)
        self.blocks = nn.Sequential(*(PreNormLayer(c.d, c.heads, c.mlp, c.dropout, 1e-6, "none")
                                      for _ in range(c.layers)))
        self.norm = nn.LayerNorm(c.d, eps=1e-6)
        self.head = nn.Linear(c.d, c.classes)

    def forward(self, images):
        x = self.patches(images).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1)
        x = self.blocks(self.dropout(x + self.positions))
        return self.head(self.norm(x[:, 0]))


# --- what the generator needs of a model ----------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Spec:
    """A model, its configurations (full size and tiny), and how to feed it."""
    build: type                 # the nn.Module class, built from a config
    full: object
    tiny: object
    sequence: bool              # takes token ids (batch, seq), else images (batch, 3, H, W)
    next_token: bool = False    # a causal language model: predicts each token's successor

    def max_seq(self, config) -> int:
        return config.max_positions if self.sequence else 0

    def batch(self, config, batch: int, seq: int):
        """(inputs, labels) as empty tensors on the meta device: shapes and dtypes only."""
        if self.sequence:
            return (torch.empty(batch, seq, dtype=torch.long, device="meta"),
                    torch.empty(batch, seq, dtype=torch.long, device="meta"))
        return (torch.empty(batch, 3, config.image, config.image, device="meta"),
                torch.empty(batch, dtype=torch.long, device="meta"))

    def loss(self, logits, labels):
        """Cross-entropy over every position; a causal language model's labels are shifted
        by one, the last position ignored (-100), as transformers' causal-LM loss does."""
        if self.next_token:
            labels = F.pad(labels, (0, 1), value=-100)[:, 1:].contiguous()
        if logits.dim() == 3:
            return F.cross_entropy(logits.flatten(0, 1), labels.flatten())
        return F.cross_entropy(logits, labels)


MODELS = {
    "resnet50": Spec(ResNet, ResNetConfig(), ResNetConfig(layers=(1, 1, 1, 1), width=8, classes=10, image=64,
                                                          batch=2), sequence=False),
    "bert-base": Spec(Bert, BertConfig(), BertConfig(layers=2, hidden=32, heads=2, intermediate=64, vocab=128,
                                                     max_positions=32, batch=2, seq=16), sequence=True),
    "gpt2-medium": Spec(GPT2, GPT2Config(), GPT2Config(layers=2, d=32, heads=2, vocab=128, max_positions=32,
                                                       batch=2, seq=16), sequence=True, next_token=True),
    "vit-b16": Spec(ViT, ViTConfig(), ViTConfig(image=32, patch=8, d=32, layers=2, heads=2, mlp=64, classes=10,
                                                batch=2), sequence=False),
}
assert tuple(MODELS) == MODEL_NAMES


def build(name: str, config) -> nn.Module:
    """Model ``name`` from ``config``, on the meta device, in training mode."""
    with torch.device("meta"):
        return MODELS[name].build(config).train()
