"""pump trace generate: traces of real models' training steps, made without a GPU.

The models (models.py) run on the meta device, so tensors have shapes but no memory;
a dispatch mode (record.py) sees every operator, gives each new storage an address
from a model of PyTorch's CUDA caching allocator (allocator.py), and records per
kernel the segments and exact byte ranges it reads and writes, its FLOPs and bytes
(events.py encodes them as the shim's records).  generate.py runs the training loop, the
same for the built-in models and a user's own (user.py: pump trace generate --model).

This module imports no torch: the command line lists the models without it.
"""

MODEL_NAMES = ("resnet50", "bert-base", "gpt2-medium", "vit-b16")
SIZES = ("full", "tiny")
