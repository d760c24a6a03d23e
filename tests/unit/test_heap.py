"""streamback.heap: with glibc's thresholds set, steps that free and allocate the same few MiB
reuse their pages (counted as minor page faults in a fresh process), and a user's own malloc
settings are left alone."""

import os
import subprocess
import sys

import pytest

from streamback import heap

# The median minor page faults of ten training steps of a tiny model with a 2048-token vocabulary
# (its logits and their gradient are 4 MiB each), after ten more that warm up; keep_freed_memory
# first (it sets nothing where the environment has malloc settings). The median, because the heap
# may still grow once in ten steps (4 and 8 MiB in two runs of four with the setting): what the
# setting changes is what every step pays.
PROBE = """
import resource, torch
from streamback.heap import keep_freed_memory
from streamback.model.model import ModelArgs, Transformer
kept = keep_freed_memory()
torch.set_num_threads(1)
model = Transformer(ModelArgs(dim=64, n_layers=2, n_heads=4, n_kv_heads=1, vocab_size=2048, multiple_of=32), torch.float32)
tokens = torch.randint(0, 2048, (4, 129), generator=torch.Generator().manual_seed(0))
def step():
    model.zero_grad(set_to_none=True)
    model(tokens[:, :-1], targets=tokens[:, 1:]).backward()
for _ in range(10):
    step()
faults = []
for _ in range(10):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    step()
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(kept, sorted(faults)[len(faults) // 2])
"""


def probe(**env) -> tuple[str, int]:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True,
                         env={k: v for k, v in os.environ.items() if k not in (*heap.USER_SETTINGS, "GLIBC_TUNABLES")} | env)
    kept, faults = out.stdout.split()
    return kept, int(faults)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
@pytest.mark.parametrize("env", [{"MALLOC_TRIM_THRESHOLD_": "1000000"}, {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1000000"}])
def test_the_users_malloc_settings_win(env):
    kept, faults = probe(**env)
    assert kept == "False" and faults > 2000  # a 1 MB trim threshold: measured 7,500-8,300 a step
