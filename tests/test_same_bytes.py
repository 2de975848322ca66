"""Same seed, same bytes: a softmax and a linear model sampled with one seed draw the same bytes (and
the draw's guided probabilities the same floats) in a fresh process and in one that first loaded and
ran a linear model (whose attention loads the C++ kernel): the draw's path never depends on what the
process ran before."""
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
SCRIPT = r"""
import hashlib, sys
import torch
sys.path.insert(0, sys.argv[3])
from fixtures import tiny_model
from imagegen.model import heads
from imagegen.sampling.decode import generate

attention, before = sys.argv[1], sys.argv[2]
sizes = {"head": "mixture", "n_mixtures": 2, "num_classes": 2}
if before == "linear":
    generate(tiny_model("linear", seed=1, **sizes), 1, seed=1, labels=1, guidance=2.0)
model = tiny_model(attention, **sizes)
x = generate(model, 3, seed=0, labels=[0, 1, -1], guidance=2.0)
params = torch.randn(64, 6, generator=torch.Generator().manual_seed(0))
p = heads.guided_probs(model.head, params, params.flip(0), 2.0)
print(hashlib.sha256(x.numpy().tobytes() + p.numpy().tobytes()).hexdigest())
"""


def drawn(attention, before):
    proc = subprocess.run([sys.executable, "-c", SCRIPT, attention, before, str(TESTS)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()[-1]


@pytest.mark.parametrize("attention", ["softmax", "linear"])
def test_one_seed_draws_the_same_bytes_after_a_linear_model(attention):
    assert drawn(attention, "nothing") == drawn(attention, "linear")
