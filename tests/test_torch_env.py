"""pump.torch_env: pump-run's PyTorch allocator settings are merged into the user's.

The rules about which variable PyTorch reads and how it parses it are checked against the
installed PyTorch itself (its allocator settings are read on a CPU-only build too)."""

import json
import subprocess
import sys

import pytest

from pump import torch_env
from pump.torch_env import alloc_conf_variable, managed_all_allocator_env, merge_alloc_conf, split_items

import helpers

OURS = "expandable_segments:False"


@pytest.mark.parametrize("conf,items", [
    ("", []),
    ("a:1", ["a:1"]),
    (" a : 1 , b:2 ", ["a:1", "b:2"]),
    ("a:1,", ["a:1"]),
    ("roundup_power2_divisions:[256:4, 512:2,>:1],expandable_segments:True",
     ["roundup_power2_divisions:[256:4,512:2,>:1]", "expandable_segments:True"]),
])
def test_split_items(conf, items):
    assert split_items(conf) == items


@pytest.mark.parametrize("conf,merged", [
    (None, OURS),
    ("", OURS),
    ("   ", OURS),
    ("max_split_size_mb:128", "max_split_size_mb:128," + OURS),
    ("max_split_size_mb:128,", "max_split_size_mb:128," + OURS),
    ("max_split_size_mb:128 , ", "max_split_size_mb:128 ," + OURS),
    ("roundup_power2_divisions:[256:4,>:1]", "roundup_power2_divisions:[256:4,>:1]," + OURS),
    ("backend:cudaMallocAsync", "backend:cudaMallocAsync," + OURS),
    # the user's choice, whatever it is, is kept as written
    ("expandable_segments:True", "expandable_segments:True"),
    ("expandable_segments:False", "expandable_segments:False"),
    ("max_split_size_mb:64, expandable_segments : True", "max_split_size_mb:64, expandable_segments : True"),
    ("expandable_segments:true", "expandable_segments:true"),  # PyTorch's own error to report
])
def test_merge_alloc_conf(conf, merged):
    assert merge_alloc_conf(conf) == merged


def test_a_key_inside_a_list_is_not_the_users_choice():
    # "expandable_segments" as a list element is not a top-level key
    assert torch_env.user_expandable_segments("roundup_power2_divisions:[expandable_segments:True]") is None


def test_the_last_expandable_segments_counts():
    assert torch_env.user_expandable_segments("expandable_segments:True,expandable_segments:False") == "False"
    assert torch_env.user_expandable_segments("expandable_segments:False,expandable_segments:True") == "True"


@pytest.mark.parametrize("env,name", [
    ({}, "PYTORCH_ALLOC_CONF"),
    ({"PYTORCH_ALLOC_CONF": "a:1"}, "PYTORCH_ALLOC_CONF"),
    ({"PYTORCH_CUDA_ALLOC_CONF": "a:1", "PYTORCH_ALLOC_CONF": "b:1"}, "PYTORCH_CUDA_ALLOC_CONF"),
    ({"PYTORCH_CUDA_ALLOC_CONF": "", "PYTORCH_ALLOC_CONF": "b:1"}, "PYTORCH_CUDA_ALLOC_CONF"),
    ({"PYTORCH_HIP_ALLOC_CONF": "a:1", "PYTORCH_ALLOC_CONF": "b:1"}, "PYTORCH_HIP_ALLOC_CONF"),
    ({"PYTORCH_CUDA_ALLOC_CONF": "a:1", "PYTORCH_HIP_ALLOC_CONF": "b:1"}, "PYTORCH_CUDA_ALLOC_CONF"),
])
def test_alloc_conf_variable(env, name):
    assert alloc_conf_variable(env) == name


def test_managed_all_allocator_env():
    assert managed_all_allocator_env({}) == ({"PYTORCH_ALLOC_CONF": OURS}, None)
    assert managed_all_allocator_env({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:32"}) == (
        {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:32," + OURS}, None)
    assert managed_all_allocator_env({"PYTORCH_ALLOC_CONF": "expandable_segments:False"}) == (
        {"PYTORCH_ALLOC_CONF": "expandable_segments:False"}, None)
    changes, notice = managed_all_allocator_env({"PYTORCH_HIP_ALLOC_CONF": "expandable_segments:True"})
    assert changes == {}
    assert notice.startswith("PYTORCH_HIP_ALLOC_CONF sets expandable_segments:True: ")
    assert "cannot be managed" in notice


# --- against the installed PyTorch -------------------------------------------------------

# One interpreter imports torch once and forks a child per question: PyTorch parses its allocator
# settings from the environment at their first use, not at import (the child's own variables count).
READER = """
import json, os, sys
import torch
for line in sys.stdin:
    pid = os.fork()
    if pid == 0:
        os.environ.update(json.loads(line))
        try:
            answer = {"settings": torch._C._accelerator_getAllocatorSettings()}
        except Exception as exc:
            answer = {"error": str(exc)}
        print(json.dumps(answer), flush=True)
        os._exit(0)
    os.waitpid(pid, 0)
"""


@pytest.fixture(scope="module")
def reader():
    pytest.importorskip("torch")
    env = {k: v for k, v in helpers.clean_env().items() if not k.startswith("PYTORCH_")}
    proc = subprocess.Popen([sys.executable, "-c", READER], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    yield proc
    proc.stdin.close()
    proc.wait(timeout=60)


def torch_reads(reader, env_vars):
    """The allocator settings PyTorch took from an environment with env_vars."""
    reader.stdin.write(json.dumps(env_vars) + "\n")
    reader.stdin.flush()
    answer = json.loads(reader.stdout.readline())
    assert "error" not in answer, answer["error"]
    return answer["settings"].strip()


@pytest.mark.parametrize("user", [
    {},
    {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128"},
    {"PYTORCH_CUDA_ALLOC_CONF": "", "PYTORCH_ALLOC_CONF": "max_split_size_mb:64"},
    {"PYTORCH_HIP_ALLOC_CONF": "garbage_collection_threshold:0.5", "PYTORCH_ALLOC_CONF": "x"},
    {"PYTORCH_ALLOC_CONF": "roundup_power2_divisions:[256:4,>:1], max_split_size_mb:64,"},
])
def test_pytorch_parses_the_merge_in_the_variable_it_reads(reader, user):
    changes, notice = managed_all_allocator_env(user)
    assert notice is None
    settings = torch_reads(reader, {**user, **changes})
    assert settings.replace(" ", "").endswith(OURS), settings


def test_pytorch_keeps_the_users_expandable_segments(reader):
    user = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    changes, _ = managed_all_allocator_env(user)
    assert torch_reads(reader, {**user, **changes}) == "expandable_segments:True"


def test_pytorch_booleans_are_capitalised(reader):
    """Why pump writes False, not false: PyTorch accepts exactly True and False."""
    assert torch_reads(reader, {"PYTORCH_ALLOC_CONF": OURS}) == OURS
    with pytest.raises(AssertionError, match="Expected 'True' or 'False'"):
        torch_reads(reader, {"PYTORCH_ALLOC_CONF": "expandable_segments:false"})
