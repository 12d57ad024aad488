"""Training jobs built from libraries the project did not write (issue 43 item 4), for
tests/test_real_client_outside.py: PyTorch's CUDA build on fakecuda, bare and under pump-run.

  resnet_amp     torchvision's resnet18 (10 classes, no weights), channels_last, mixed precision
                 (torch.autocast float16 with a GradScaler), SGD with momentum
  hf_gpt2        a transformers GPT2LMHeadModel from a small GPT2Config (no weights fetched),
                 AdamW, gradient accumulation over two micro-batches, a shorter last batch, an
                 evaluation pass under no_grad every other step, and a checkpoint as
                 transformers saves one (save_pretrained: safetensors) with the optimizer's state

argv[1]: a directory for checkpoints; argv[2], if given, the jobs to run (comma-separated).
Prints one JSON line: per job whether it ran, its optimizer steps and its checkpoint (tensor
names and shapes). Kernels are no-ops on fakecuda, so no value is printed or checked."""
import json
import os
import sys

import torch
import torch.nn.functional as F

STEPS = 3


def resnet_amp(out):
    import torchvision
    torch.backends.cudnn.benchmark = True
    model = torchvision.models.resnet18(num_classes=10).cuda().to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scaler = torch.amp.GradScaler("cuda")
    for _ in range(STEPS):
        x = torch.randn(4, 3, 32, 32, device="cuda").to(memory_format=torch.channels_last)
        y = torch.randint(0, 10, (4,), device="cuda")
        with torch.autocast("cuda", dtype=torch.float16):
            loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        loss.item()
    state = {k: v.cpu() for k, v in model.state_dict().items()}
    torch.save(state, os.path.join(out, "resnet_amp.pt"))
    return state


def gpt2_config():
    from transformers import GPT2Config
    return GPT2Config(n_layer=2, n_head=4, n_embd=64, vocab_size=128, n_positions=64, bos_token_id=0,
                      eos_token_id=0)


def hf_gpt2(out):
    from transformers import GPT2LMHeadModel
    model = GPT2LMHeadModel(gpt2_config()).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    micro, batches = 2, [4] * (STEPS - 1) + [3]  # the last batch shorter, as a data loader's
    for step, batch in enumerate(batches):
        model.train()
        opt.zero_grad(set_to_none=True)
        for _ in range(micro):
            idx = torch.randint(0, 128, (batch, 32), device="cuda")
            (model(input_ids=idx, labels=idx).loss / micro).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 2 == 1:
            model.eval()
            with torch.no_grad():
                model(input_ids=torch.randint(0, 128, (2, 32), device="cuda")).logits.sum().item()
    folder = os.path.join(out, "hf_gpt2")
    model.save_pretrained(folder)
    torch.save(opt.state_dict(), os.path.join(folder, "optimizer.pt"))
    return model.state_dict()


JOBS = {"resnet_amp": resnet_amp, "hf_gpt2": hf_gpt2}


def main():
    chosen = sys.argv[2].split(",") if len(sys.argv) > 2 else list(JOBS)
    out = {}
    for name in chosen:
        try:
            state = JOBS[name](sys.argv[1])
            out[name] = {"ok": True, "steps": STEPS, "checkpoint": {k: list(v.shape) for k, v in state.items()}}
        except Exception as e:  # reported, so the test names the job and the error
            out[name] = {"ok": False, "error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
    torch.cuda.synchronize()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
