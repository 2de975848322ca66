"""The protocol every causal self-attention follows: the base class `Attention` and `AttentionState`.

Every attention module maps x (N, L, D) -> (N, L, D) with D = d_model and offers:
- `forward(x)`: the whole causal sequence (training, evaluation, recompute sampling);
- `init_state(batch, max_len, device, dtype)`: the decoding state, an `AttentionState` (a
  dataclass: softmax's `KVCache`, linear's `LinearState`), which also carries the projections'
  weights for products in `dtype` (`step_weights`: bfloat16 copies made once when the parameters
  are float32);
- `step(x_t, state) -> (y_t, state)`: one position, x_t and y_t (N, D).
`can_step` is False for attentions with no incremental state (LSH). The invariant:
stepping through a sequence gives the outputs of `forward` on it.
Shape letters: N batch, L length, D model dim, H heads, E query/key dim, M value dim.
"""
from dataclasses import dataclass

from torch import nn

from .. import config
from ..errors import UserError
from ..ops.dense import Dense, dense


@dataclass
class AttentionState:
    """What every attention carries between decoding steps: its projections' (weight, bias) for
    the step's products (`Dense.cast`); each attention's state adds its own sums or cache."""
    qkv: tuple
    out: tuple


class Attention(nn.Module):
    """Base: heads bookkeeping and the output projection.

    Args: d_model (D), n_heads (H); D must be a multiple of H, E = M = D / H. Each attention's own
    options are the fields of its `Options` dataclass (imagegen/config/schema.py: one type, default and help
    sentence each), which its __init__ takes as keyword arguments and reads through `parse_options`."""
    can_step = True
    Options = None                      # each attention's own dataclass

    def __init__(self, d_model, n_heads):
        super().__init__()
        if d_model % n_heads:
            raise UserError(f"d_model={d_model} is not a multiple of n_heads={n_heads}; pick values that divide.")
        self.d_model, self.n_heads, self.head_dim = d_model, n_heads, d_model // n_heads
        self.out = Dense(d_model, d_model)

    @classmethod
    def parse_options(cls, options):
        """model.attention_options (a plain dict, as configs and checkpoints hold it: empty, partial or
        whole) -> cls.Options, the missing ones at their defaults; one sentence for an option the
        attention does not have or a value of the wrong type."""
        return config.attention_options(cls.name, options, cls.Options)

    def split(self, x):
        """(N, L, D) -> (N, H, L, E)."""
        N, L, _ = x.shape
        return x.view(N, L, self.n_heads, self.head_dim).transpose(1, 2)

    def merge(self, y):
        """(N, H, L, M) -> (N, L, D) through the output projection."""
        N, H, L, M = y.shape
        return self.out(y.transpose(1, 2).reshape(N, L, H * M))

    def step_weights(self, dtype, batch):
        """The projections' (weight, bias) for decoding products in dtype at batch rows (see `Dense.cast`)."""
        return {"qkv": self.qkv.cast(dtype, batch), "out": self.out.cast(dtype, batch)}

    def merge_step(self, y, state):
        """(N, ..., M) heads of one position -> (N, D) through the state's output projection."""
        return dense(y.reshape(y.shape[0], self.d_model), state.out)

    def init_state(self, batch, max_len, device, dtype):
        raise NotImplementedError(f"{self.name} attention has no incremental state; sample it by recomputing "
                                  f"the prefix (sampler=recompute).")

    def step(self, x_t, state):
        return self.init_state(0, 0, None, None)
