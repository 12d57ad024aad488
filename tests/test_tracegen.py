"""pump trace generate: the caching-allocator model against PyTorch's rules, the
multi_tensor_apply launch split, and generated traces of the tiny models read back
with pump.trace and pump.channel (every launch complete, its ranges inside live
blocks, steps marked, freed blocks reused), and the command line's errors."""

import collections

import pytest

pytest.importorskip("torch")

from hypothesis import given, settings, strategies as st  # noqa: E402

from pump import channel, cli, trace  # noqa: E402
from pump.tracegen import MODEL_NAMES, allocator, generate, models, operands  # noqa: E402

MiB = 1 << 20
K = channel.KIND


# --- the allocator model -------------------------------------------------------------------

def test_requests_round_up_to_512_bytes():
    assert [allocator.round_request(n) for n in (1, 511, 512, 513, 1025)] == [512, 512, 512, 1024, 1536]


@pytest.mark.parametrize("nbytes,segment", [
    (1, 2 * MiB), (MiB, 2 * MiB),                       # small pool: 2 MiB segments
    (MiB + 1, 20 * MiB), (10 * MiB - 512, 20 * MiB),    # large, under 10 MiB: 20 MiB segments
    (10 * MiB - 1, 10 * MiB),                           # (the size after rounding to 512 decides)
    (10 * MiB, 10 * MiB), (10 * MiB + 1, 12 * MiB),     # from 10 MiB: rounded up to 2 MiB
    (33 * MiB, 34 * MiB),
])
def test_segment_sizes(nbytes, segment):
    a = allocator.CachingAllocator()
    address, _, made = a.malloc(nbytes)
    assert made == (address, segment) and address % (2 * MiB) == 0


def test_small_blocks_are_packed_into_one_segment():
    a = allocator.CachingAllocator()
    first, size, made = a.malloc(1000)
    second, _, again = a.malloc(1000)
    assert (size, made[1], again, second) == (1024, 2 * MiB, None, first + 1024)


def test_small_and_large_pools_do_not_share_segments():
    a = allocator.CachingAllocator()
    small = a.malloc(MiB)[0]
    large, _, made = a.malloc(MiB + 512)
    assert made is not None and large != small + MiB


def test_large_split_only_leaves_more_than_1_mib():
    a = allocator.CachingAllocator()
    # 19 MiB gets a 20 MiB segment; the 1 MiB left is not split off: the block is all of it.
    assert a.malloc(19 * MiB)[1] == 20 * MiB
    # 10 MiB + 1 gets 12 MiB; what is left (2 MiB - 512) is split off and serves the next
    # request whole: splitting it would leave less than 1 MiB.
    address, size, _ = a.malloc(10 * MiB + 1)
    assert size == 10 * MiB + 512
    assert a.malloc(MiB + 512) == (address + size, 2 * MiB - 512, None)


def test_small_split_leaves_512_bytes():
    a = allocator.CachingAllocator()
    base = a.malloc(MiB)[0]
    assert a.malloc(MiB - 512)[:2] == (base + MiB, MiB - 512)
    assert a.malloc(1) == (base + 2 * MiB - 512, 512, None)       # the last 512 bytes
    assert a.malloc(1)[2] is not None                              # the segment is full


def test_best_fit_by_size_then_address():
    a = allocator.CachingAllocator()
    blocks = [a.malloc(n)[0] for n in (3 * MiB, 2 * MiB, 2 * MiB, 2 * MiB, 2 * MiB, 2 * MiB)]
    for i in (4, 0, 2):           # free 3 MiB and two 2 MiB blocks, none touching another free one
        a.free(blocks[i])
    assert a.malloc(2 * MiB)[:2] == (blocks[2], 2 * MiB)   # the smallest that fits, the lower address
    assert a.malloc(2 * MiB)[:2] == (blocks[4], 2 * MiB)
    # Then the 3 MiB block, whole (1 MiB would be left: not split), before the segment's free tail.
    assert a.malloc(2 * MiB)[:3] == (blocks[0], 3 * MiB, None)


def test_freed_neighbours_merge_and_serve_a_larger_request():
    a = allocator.CachingAllocator()
    x, y, z = (a.malloc(4 * MiB)[0] for _ in range(3))
    segments = dict(a.segments)
    for address in (x, z, y):    # y last: it merges with both sides
        assert a.free(address) == 4 * MiB
    assert a.malloc(12 * MiB)[:2] == (x, 12 * MiB) and a.segments == segments


def test_free_of_an_unknown_block_is_an_error():
    a = allocator.CachingAllocator()
    address = a.malloc(100)[0]
    with pytest.raises(ValueError, match="not a block the allocator handed out"):
        a.free(address + 512)
    a.free(address)
    with pytest.raises(ValueError):
        a.free(address)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.sampled_from([1, 700, 4096, MiB - 1, MiB, MiB + 1, 3 * MiB,
                                                           11 * MiB, 25 * MiB]),
                          st.integers(0, 1000)), max_size=120))
def test_random_programs_keep_the_pools_consistent(ops):
    a = allocator.CachingAllocator()
    live = {}
    for do_free, nbytes, pick in ops:
        if do_free and live:
            address = sorted(live)[pick % len(live)]
            assert a.free(address) == live.pop(address)
        else:
            address, size, _ = a.malloc(nbytes)
            assert size >= nbytes and address not in live
            live[address] = size
    # Every segment is tiled exactly by its blocks; no two free blocks are neighbours;
    # the pools hold exactly the free blocks; handed-out blocks do not overlap.
    free = set()
    for base, size in a.segments.items():
        assert base % allocator.SEGMENT_ALIGNMENT == 0
        block, end = a.blocks[base], base
        while block is not None:
            assert block.address == end and block.segment == base
            assert block.allocated == (block.address in live)
            if not block.allocated:
                assert block.next is None or block.next.allocated
                free.add((block.small, block.size, block.address))
            end += block.size
            block = block.next
        assert end == base + size
    assert free == {(small, s, addr) for small, pool in a.free_blocks.items() for s, addr in pool}
    assert a.allocated_bytes == sum(live.values())


# --- multi_tensor_apply's launches ---------------------------------------------------------

def test_foreach_launches_split_at_the_block_and_tensor_limits():
    chunk, blocks = operands.FOREACH_CHUNK, operands.FOREACH_MAX_BLOCKS
    launches = operands.multi_tensor_chunks([10, chunk * blocks + 5, 0, 3], 36)
    # Tensor 0 takes a block, tensor 1 the other 319, then its last 2 chunks go on with tensor 3.
    assert launches == [[(0, 0, 1), (1, 0, 319)], [(1, 319, 321), (3, 0, 1)]]
    assert [len(x) for x in operands.multi_tensor_chunks([1] * 40, 36)] == [36, 4]


def test_a_cuda_13_builds_foreach_launches_hold_7_times_the_chunks():
    """32 KB of kernel arguments (MultiTensorApply.cuh from CUDA 13): 2240 chunks and 770 tensors
    of one list a launch, where the 4 KB build takes 320 and 110 (GPT-2 small's 148 parameters, about
    1,900 chunks: one launch there, against 7 in the other build)."""
    max_blocks, max_tensors, _ = operands.LIMITS_32KB
    assert (max_blocks, max_tensors[0]) == (7 * operands.FOREACH_MAX_BLOCKS, 7 * operands.FOREACH_MAX_TENSORS[0])
    numels = [768 * 3072] * 24 + [768 * 768] * 48 + [50257 * 768] + [1024] * 75
    assert len(operands.multi_tensor_chunks(numels, max_tensors[0], max_blocks)) == 1
    assert len(operands.multi_tensor_chunks(numels, operands.FOREACH_MAX_TENSORS[0])) == 7


# --- generated traces ----------------------------------------------------------------------

def _generate(tmp_path, model, **kw):
    path = tmp_path / f"{model}.trace"
    summary = generate.generate(str(path), lambda: generate.builtin(model, "tiny"), **kw)
    header, blocks = trace.read(str(path))
    assert [pid for pid, _ in blocks] == [0]
    return summary, header, blocks[0][1]


def _replay(records, batch):
    """Walk the records in order: each launch's ranges must lie inside blocks handed out
    and not yet taken back, inside the segments its bases name. Returns the addresses
    handed out again after being freed."""
    segments, live, freed, reused = {}, {}, set(), set()
    launch = -1
    for r in records:
        kind, a = int(r["kind"]), [int(v) for v in r["arg"]]
        if kind == K["alloc"]:
            assert a[0] % (2 * MiB) == 0 and a[2] == 1
            segments[a[0]] = a[1]
        elif kind == K["block_alloc"]:
            assert any(b <= a[0] and a[0] + a[1] <= b + s for b, s in segments.items())
            if a[0] in freed:
                reused.add(a[0])
            live[a[0]] = a[1]
        elif kind == K["block_free"]:
            assert live.pop(a[0]) == a[1]
            freed.add(a[0])
        elif kind == K["launch"]:
            launch += 1
            bases = set(int(b) for b in batch.launch_bases(launch))
            assert len(bases) == len(batch.launch_bases(launch)) == int(r["count"])
            extents = batch.extents[launch]
            assert extents and launch in batch.costs
            for address, nbytes, _ in extents:
                assert any(b <= address and address + nbytes <= b + s for b, s in live.items()), \
                    f"launch {launch} ({batch.functions[int(batch.launch_function[launch])]}) touches a dead range"
                assert any(b <= address and address + nbytes <= b + segments[b] for b in bases)
    assert launch + 1 == len(batch.launch_function)
    return reused


@pytest.mark.parametrize("model", MODEL_NAMES)
def test_tiny_trace_reads_back_complete(tmp_path, model):
    summary, header, records = _generate(tmp_path, model, steps=3, last_batch=1, eval_every=2)
    assert header["name"].startswith(f"{model} tiny")
    batch = channel.decode(records)
    assert batch.invalid == 0
    assert list(records["seq"]) == list(range(1, len(records) + 1))
    assert (records["time_ns"][1:] > records["time_ns"][:-1]).all()
    assert [s for _, s in batch.steps] == [0, 1, 2]
    assert [at for at, _ in batch.steps] == sorted(at for at, _ in batch.steps)
    assert summary.launches == len(batch.launch_function) == len(batch.costs)
    assert _replay(records, batch), "no freed block was handed out again"
    assert summary.footprint_bytes == sum(size for _, size in batch.allocs)
    names = collections.Counter(batch.functions[int(f)] for f in batch.launch_function)
    assert not [n for n in names if n.split(".")[1] in ("view", "t", "transpose", "expand", "detach",
                                                        "_unsafe_view", "split", "empty")]
    assert any(n.startswith("aten._foreach_") for n in names)
    flops = {n: 0 for n in names}
    for i, f in enumerate(batch.launch_function):
        flops[batch.functions[int(f)]] += batch.costs[i][0]
        assert batch.costs[i][1] >= sum(nbytes for _, nbytes, _ in batch.extents[i])
    assert all(flops[n] > 0 for n in names if n.split(".")[1] in ("mm", "addmm", "bmm", "convolution"))
    assert summary.step_flops > 0


def test_parameters_are_placed_before_the_first_step(tmp_path):
    _, _, records = _generate(tmp_path, "gpt2-medium", steps=1)
    batch = channel.decode(records)
    net = models.build("gpt2-medium", models.MODELS["gpt2-medium"].tiny)
    # The token embedding is also the head: one storage. Buffers are placed too.
    tensors = {t.untyped_storage()._cdata: t for t in [*net.parameters(), *net.buffers()]}
    expected = sorted(allocator.round_request(t.untyped_storage().nbytes()) for t in tensors.values())
    before = sorted(size for at, _, size in batch.block_allocs[:len(expected)])
    assert before == expected
    assert batch.steps[0][0] == 0 and all(at == 0 for at, _, _ in batch.block_allocs[:len(expected)])


def test_dropout_is_cudas_fused_kernel(tmp_path):
    _, _, records = _generate(tmp_path, "gpt2-medium", steps=1)
    batch = channel.decode(records)
    names = {batch.functions[int(f)] for f in batch.launch_function}
    assert {"aten.native_dropout.default", "aten.native_dropout_backward.default"} <= names
    assert not any("bernoulli" in n for n in names)


def test_evaluation_adds_forward_launches_only(tmp_path):
    def names(**kw):
        _, _, records = _generate(tmp_path, "bert-base", steps=2, **kw)
        batch = channel.decode(records)
        return collections.Counter(batch.functions[int(f)] for f in batch.launch_function)
    extra = names(eval_every=1) - names()
    assert extra and not [n for n in extra if "backward" in n or "dropout" in n or "foreach" in n]


def test_inference_records_forward_passes_only(tmp_path):
    def names(**kw):
        summary, header, records = _generate(tmp_path, "bert-base", steps=2, **kw)
        batch = channel.decode(records)
        return summary, header, collections.Counter(batch.functions[int(f)] for f in batch.launch_function)
    summary, header, forward = names(inference=True)
    _, _, training = names()
    assert header["name"].endswith(" inference") and summary.inference and summary.launches == sum(forward.values())
    # Forward alone, in eval mode: no backward, optimizer, loss or dropout; every operator one training runs.
    assert not [n for n in forward if "backward" in n or "foreach" in n or "dropout" in n or "nll_loss" in n]
    assert set(forward) < set(training)
    assert "2 forward passes, inference" in summary.line("x") and "per pass" in summary.line("x")


def test_the_summary_line_picks_units_that_show_the_figures(tmp_path):
    summary, _, _ = _generate(tmp_path, "resnet50", steps=1)
    line = summary.line("x")
    # A tiny model was "0.00 GiB ... 0.0 GFLOP" before.
    assert "0.00 GiB" not in line and "0.0 GFLOP" not in line
    assert f"peak footprint {summary.footprint_bytes / 2**20:.3g} MiB" in line
    assert f"{summary.step_flops / 1e6:.3g} MFLOP per step" in line and "(batch 2, 1 step)" in line


def test_last_batch_is_smaller(tmp_path):
    _, _, records = _generate(tmp_path, "resnet50", steps=2, last_batch=1)
    batch = channel.decode(records)
    first_of_step = [at for at, _ in batch.steps]
    reads = [batch.extents[i][0][1] for i in first_of_step]   # the first convolution reads the images
    assert reads[1] * 2 == reads[0]


def test_generation_is_deterministic(tmp_path):
    a = _generate(tmp_path, "vit-b16", steps=2)[2]
    b = _generate(tmp_path, "vit-b16", steps=2)[2]
    assert (a["arg"] == b["arg"]).all() and (a["kind"] == b["kind"]).all()


# --- the command line ----------------------------------------------------------------------

def _cli(capsys, *args):
    try:
        rc = cli.main(["trace", "generate", *args])
    except SystemExit as exc:
        rc = exc.code
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_writes_a_trace_and_one_summary_line(tmp_path, capsys):
    path = tmp_path / "g.trace"
    rc, out, err = _cli(capsys, "gpt2-medium", "--size", "tiny", "--steps", "2", "-o", str(path))
    # Not a terminal: a progress line per step on stderr.
    assert (rc, err) == (0, "trace generate: step 1/2: gpt2-medium tiny\ntrace generate: step 2/2: gpt2-medium tiny\n")
    assert len(out.splitlines()) == 1 and "launches" in out and "MFLOP per step" in out and str(path) in out
    assert channel.decode(trace.read(str(path))[1][0][1]).steps[-1][1] == 1


@pytest.mark.parametrize("args,message", [
    (["gpt3", "-o", "x"], "argument MODEL: invalid choice: 'gpt3' (choose from 'resnet50', 'bert-base', "
                          "'gpt2-medium', 'vit-b16')"),
    (["resnet50", "--seq", "8", "-o", "x"], "resnet50 takes images, not sequences "
                                           "(sequence models: bert-base, gpt2-medium)"),
    (["bert-base", "--size", "tiny", "--seq", "64", "-o", "x"], "--seq 64: from 1 to 32"),
    (["vit-b16", "--batch", "4", "--last-batch", "4", "-o", "x"], "--last-batch 4: from 1 to 3"),
    (["vit-b16", "--steps", "0", "-o", "x"], "--steps 0: at least 1"),
    (["vit-b16", "--eval-every", "0", "-o", "x"], "--eval-every 0: at least 1"),
    (["vit-b16", "--eval-every", "1", "--inference", "-o", "x"], "with --inference every step is one"),
    (["vit-b16", "--size", "huge", "-o", "x"], "invalid choice: 'huge'"),
    (["vit-b16"], "the following arguments are required: -o/--output"),
])
def test_cli_errors_are_one_line(capsys, args, message):
    rc, out, err = _cli(capsys, *args)
    assert (rc, out) == (2, "")
    assert len(err.splitlines()) == 1 and err.startswith("pump: ") and message in err


def test_cli_unwritable_output(tmp_path, capsys):
    rc, _, err = _cli(capsys, "resnet50", "--size", "tiny", "--steps", "1", "-o", str(tmp_path / "no" / "t"))
    assert rc == 2 and "cannot write" in err and "No such file or directory" in err


# --- your own model: --model MODULE:CALLABLE -----------------------------------------------

USER_MODELS = '''
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from pump.tracegen import models


def mlp():
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)), torch.empty(8, 16)


class Checkpointed(nn.Module):
    def __init__(self, recompute):
        super().__init__()
        self.recompute = recompute
        self.inner = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16))

    def forward(self, x):
        return checkpoint(self.inner, x, use_reentrant=False) if self.recompute else self.inner(x)


def plain():
    return Checkpointed(False), torch.empty(8, 16)


def checkpointed():
    return Checkpointed(True), torch.empty(8, 16)


class Autocast(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(16, 4)

    def forward(self, x):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return self.linear(x)


def autocast():
    return Autocast(), torch.empty(8, 16)


class Item(nn.Linear):
    def forward(self, x):
        return super().forward(x) * x.sum().item()


def item():
    return Item(16, 4), torch.empty(8, 16)


if not hasattr(torch.ops.pumptest, "double"):     # defined once per process, however often imported
    torch.library.define("pumptest::double", "(Tensor x) -> Tensor")
    torch.library.impl("pumptest::double", "cpu")(lambda x: x * 2)


class Custom(nn.Linear):
    def forward(self, x):
        return torch.ops.pumptest.double(super().forward(x))


def custom():
    return Custom(16, 4), torch.empty(8, 16)


class Constant(nn.Linear):
    def __init__(self):
        super().__init__(16, 4)
        self.scale = torch.empty(4)      # neither a parameter nor a buffer: placed when first read

    def forward(self, x):
        return super().forward(x) * self.scale


def constant():
    return Constant(), torch.empty(8, 16)


def raises():
    raise RuntimeError("no weights here")


def three():
    return nn.Linear(2, 2), torch.empty(1, 2), None, None, None


def on_cpu():
    return nn.Linear(2, 2, device="cpu"), torch.empty(1, 2)


class Wrapped(nn.Module):
    """vit-b16 tiny with its loss inside, as a user would hand it over."""
    def __init__(self):
        super().__init__()
        self.net = models.MODELS["vit-b16"].build(models.MODELS["vit-b16"].tiny).train()

    def forward(self, images, labels):
        return models.MODELS["vit-b16"].loss(self.net(images), labels)


def vit():
    spec = models.MODELS["vit-b16"]
    return Wrapped(), spec.batch(spec.tiny, spec.tiny.batch, 0)
'''


@pytest.fixture
def user_models(tmp_path, monkeypatch):
    (tmp_path / "pump_user_models.py").write_text(USER_MODELS)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _launch_names(path):
    batch = channel.decode(trace.read(str(path))[1][0][1])
    return [batch.functions[int(f)] for f in batch.launch_function]


def test_user_model_from_a_file(user_models, capsys):
    rc, out, err = _cli(capsys, "--model", "pump_user_models.py:mlp", "--steps", "2", "-o", "t")
    assert rc == 0 and err.splitlines() == ["trace generate: step 1/2: pump_user_models.py:mlp",
                                            "trace generate: step 2/2: pump_user_models.py:mlp"]
    assert out.startswith("pump_user_models.py:mlp (batch 8, 2 steps): ")
    names = collections.Counter(_launch_names(user_models / "t"))
    # Per step: two addmm forward; backward's mm for the weights and the input of the second layer.
    assert names["aten.addmm.default"] == 4 and names["aten.mm.default"] >= 6
    assert any(n.startswith("aten._foreach_") for n in names)     # AdamW, foreach as on CUDA


def test_user_model_goes_through_the_built_in_models_path(user_models, tmp_path):
    builtin = tmp_path / "builtin.trace"
    generate.generate(str(builtin), lambda: generate.builtin("vit-b16", "tiny"), steps=2, last_batch=1)
    rc = cli.main(["trace", "generate", "--model", "pump_user_models:vit", "--steps", "2", "--last-batch", "1",
                   "-o", "user.trace"])
    a, b = (trace.read(str(p))[1][0][1] for p in (builtin, tmp_path / "user.trace"))
    assert rc == 0 and (a["kind"] == b["kind"]).all() and (a["arg"] == b["arg"]).all()


def test_a_tensor_the_model_holds_is_placed_when_first_read(user_models, capsys):
    assert _cli(capsys, "--model", "pump_user_models:constant", "--steps", "2", "-o", "t")[0] == 0
    records = trace.read(str(user_models / "t"))[1][0][1]
    batch = channel.decode(records)
    first_mul = _launch_names(user_models / "t").index("aten.mul.Tensor")
    # The weight, bias and scale, each a 512-byte block, before the first multiply reads it.
    placed = [size for at, _, size in batch.block_allocs if at <= first_mul]
    assert placed.count(512) >= 3 and first_mul < batch.steps[1][0]
    assert _replay(records, batch)


def test_activation_checkpointing_is_traced_with_its_recomputation(user_models, capsys):
    assert _cli(capsys, "--model", "pump_user_models:plain", "--steps", "1", "-o", "plain")[0] == 0
    assert _cli(capsys, "--model", "pump_user_models:checkpointed", "--steps", "1", "-o", "ckpt")[0] == 0
    plain, ckpt = (collections.Counter(_launch_names(user_models / p)) for p in ("plain", "ckpt"))
    # Backward runs the forward's first addmm and relu again.
    assert ckpt - plain == collections.Counter({"aten.addmm.default": 1, "aten.relu.default": 1})


@pytest.mark.parametrize("spec,message", [
    ("pump_user_models:autocast", "autocast cannot be traced: it does not apply to meta tensors"),
    ("pump_user_models:item", "operator aten._local_scalar_dense.default has no meta kernel (Tensor.item() or a "
                              "Python number taken from a tensor): "),
    ("pump_user_models:custom", "operator pumptest.double.default has no meta kernel"),
    ("pump_user_models:raises", "--model pump_user_models:raises raised RuntimeError: no weights here"),
    ("pump_user_models:three", "returned a tuple; expected (model, batch), (model, batch, optimizer) or "
                               "(model, batch, optimizer, loss_fn)"),
    ("pump_user_models:on_cpu", "weight is on cpu, not meta"),
    ("pump_user_models:missing", "pump_user_models has no 'missing'"),
    ("pump_user_models", "expected MODULE:CALLABLE"),
    ("no_such_module_here:f", "no module 'no_such_module_here'"),
    ("nowhere.py:f", "no file nowhere.py"),
])
def test_user_model_errors_are_one_line(user_models, capsys, spec, message):
    rc, out, err = _cli(capsys, "--model", spec, "--steps", "1", "-o", "t")
    last = err.splitlines()[-1]
    assert (rc, out) == (2, "") and last.startswith("pump: trace generate: ") and message in last
    assert all(line.startswith("trace generate: step") for line in err.splitlines()[:-1])
    if "meta kernel" in message:
        assert "torch.library.register_fake" in last
    assert not (user_models / "t").exists()


def test_user_model_refuses_built_in_settings(user_models, capsys):
    rc, _, err = _cli(capsys, "--model", "pump_user_models:mlp", "--batch", "4", "-o", "t")
    assert rc == 2 and "--size, --batch and --seq are for the built-in models" in err
    rc, _, err = _cli(capsys, "resnet50", "--model", "pump_user_models:mlp", "-o", "t")
    assert rc == 2 and "give MODEL or --model MODULE:CALLABLE, one of them" in err
