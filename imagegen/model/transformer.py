"""PixelTransformer: a decoder-only transformer over the D sub-pixels of an image.

Input  x (N, D) uint8. The model reads [START, x_0, ..., x_{D-2}] and predicts x_0..x_{D-1},
so every one of the D sub-pixels is scored. Embedding = byte + row + column + channel, so
"the same column one row up" is one learned relation rather than 28 separate ones.
Pre-LayerNorm blocks with a GELU (or ReLU²: `activation`) feed-forward; the attention comes from the
registry by name. The head maps each position to P distribution parameters.
Class-conditional models (num_classes C > 0) add a learned class vector to the input at every
position, START included (a per-image bias: one token read only at the start would fade as 1/t in
a linear attention's average); row C of that embedding is "no label", which label dropout trains,
so one model samples with and without labels (classifier-free guidance, see heads.guided_probs).
Context (`context`, sub-pixel distances o >= 2): position t also adds a learned embedding of its own per
distance of the byte x_{t-o} (START before the image), e.g. for colour 2, 3 (the pixel's earlier channel,
the same channel one pixel left) and 3W (one row up): the neighbours that a linear attention's running
average cannot single out, at the cost of a lookup. Decoding keeps the last max(context) bytes in its state.
Decoding (`init_state`, `step`) may run its matrix products in bfloat16, or in int8 (dtypes.INT8:
8-bit weights, activations quantized per row; the head stays float32, the first block's feed-forward input
bfloat16 where this CPU multiplies that faster, else float32: `precision.keep_out_of_int8`), with weights converted
once into the state; the residual stream, LayerNorm, the attention's sums and the head's output stay in the parameters'
dtype (float32).
"""
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from ..attention import make_attention
from ..config import ModelConfig
from ..dtypes import INT8
from ..errors import UserError
from ..ops import EPS, DecodeHead, DecodeLayer, decode_step
from ..ops.dense import Dense, dense
from .heads import make_head

START = 256  # token id of the start symbol; bytes are 0..255

DEFAULT = ModelConfig()                  # the constructor's defaults are the typed config's


@dataclass
class BlockState:
    """One block's decoding state: its attention's (an AttentionState) and the feed-forward's two
    (weight, bias) pairs for the step's products."""
    attn: object
    ff: tuple


@dataclass
class DecodingState:
    """What `PixelTransformer.step` carries: the next position t, a BlockState per block, the class
    vectors (N, D) added at every position (None: unconditional), and, when the whole step runs as
    one C++ call, the (DecodeLayer list, DecodeHead) that call reads (None otherwise); head: the
    output projection's weights for int8 products, `Dense.cast`'s (its parameters: int8 keeps it float32;
    None: the parameters')."""
    t: int = 0
    layers: list = field(default_factory=list)
    class_vector: torch.Tensor = None
    kernel: tuple = None
    head: tuple = None
    history: torch.Tensor = None          # (N, max(context)) long: the last bytes read, newest last (context models)
    context: tuple = None                 # the context's embeddings as one table (`PixelTransformer.context_table`)
    positions: torch.Tensor = None        # (length, D): every position's embedding, made once (`positions`)


class ReLU2(nn.Module):
    """relu(x)^2 (modded-nanogpt's feed-forward nonlinearity)."""

    def forward(self, x):
        return F.relu(x).square()


ACTIVATION = {"gelu": nn.GELU, "relu2": ReLU2}           # config.ACTIVATIONS' names


class Block(nn.Module):
    def __init__(self, attention, d_model, n_heads, d_ff, dropout, attention_options, activation="gelu"):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = make_attention(attention, d_model, n_heads, **attention_options)
        self.ln2 = nn.LayerNorm(d_model)
        self.ff = nn.Sequential(Dense(d_model, d_ff), ACTIVATION[activation](), Dense(d_ff, d_model))
        self.drop = nn.Dropout(dropout)

    def forward(self, x):                                    # (N, L, D)
        x = x + self.drop(self.attn(self.ln1(x)))
        return x + self.drop(self.ff(self.ln2(x)))

    def init_state(self, batch, max_len, device, dtype):
        """The attention's decoding state plus the feed-forward weights for products in dtype."""
        return BlockState(self.attn.init_state(batch, max_len, device, dtype),
                          (self.ff[0].cast(dtype, batch), self.ff[2].cast(dtype, batch)))

    def step(self, x_t, state):                              # (N, D), in the parameters' dtype
        y, state.attn = self.attn.step(self.ln1(x_t), state.attn)
        x_t = x_t + y
        ff1, ff2 = state.ff
        return x_t + dense(self.ff[1](dense(self.ln2(x_t), ff1)), ff2), state


class PixelTransformer(nn.Module):
    """Args: length (D sub-pixels), channels (1 or 3), width (pixels per row), attention (registry name),
    n_layers, d_model, n_heads, d_ff, head ('mixture' or 'categorical'), n_mixtures,
    dropout, attention_options (dict passed to the attention class), num_classes (0: unconditional),
    context (sub-pixel distances >= 2 whose bytes each add an embedding of their own; () none),
    activation (the feed-forward's: gelu or relu2)."""

    def __init__(self, length, channels, width, attention=DEFAULT.attention, n_layers=DEFAULT.n_layers,
                 d_model=DEFAULT.d_model, n_heads=DEFAULT.n_heads, d_ff=DEFAULT.d_ff, head=DEFAULT.head,
                 n_mixtures=DEFAULT.n_mixtures, dropout=DEFAULT.dropout, attention_options=None,
                 num_classes=DEFAULT.num_classes, context=(), activation=DEFAULT.activation):
        super().__init__()
        self.length, self.channels, self.width, self.num_classes = length, channels, width, num_classes
        self.activation = activation
        self.head = make_head(head, n_mixtures)
        self.tok = nn.Embedding(257, d_model)
        self.context = tuple(context or ())
        self.ctx = nn.ModuleList(nn.Embedding(257, d_model) for _ in self.context)
        self.row = nn.Embedding(length // (channels * width), d_model)
        self.col = nn.Embedding(width, d_model)
        self.chan = nn.Embedding(channels, d_model)
        self.blocks = nn.ModuleList(Block(attention, d_model, n_heads, d_ff, dropout, dict(attention_options or {}),
                                          activation) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.proj = Dense(d_model, self.head.n_params)
        embeddings = [self.tok, self.row, self.col, self.chan, *self.ctx]
        if num_classes:
            self.label = nn.Embedding(num_classes + 1, d_model)  # row num_classes: no label
            embeddings.append(self.label)
        for emb in embeddings:                                    # Dense layers initialise themselves (std 0.02)
            nn.init.normal_(emb.weight, std=0.02)

    @property
    def can_step(self):
        return all(b.attn.can_step for b in self.blocks)

    def embed(self, tokens, t):
        """tokens (N, L) long at positions t (L,) -> (N, L, D)."""
        return self.tok(tokens) + self.positions(t)

    def positions(self, t):
        """The embeddings of positions t (L,): row + column + channel, (L, D)."""
        pixel = t // self.channels
        return self.row(pixel // self.width) + self.col(pixel % self.width) + self.chan(t % self.channels)

    def context_vectors(self, history, table=None):
        """history (N, max(context)) long, the last bytes read, newest last -> the context's sum (N, D); with
        `context_table`'s table, as one gather-and-sum (faster than a lookup and add per distance:
        docs/notes/code-measurements.md)."""
        if table is None:
            return sum(emb(history[:, -o]) for o, emb in zip(self.context, self.ctx))
        weights, columns, offsets = table
        return F.embedding_bag(history[:, columns] + offsets, weights, mode="sum")

    def context_table(self, device):
        """The context's embeddings stacked for `context_vectors`: (weights (C * 257, D), the history's column
        of each of the C distances (C,), each distance's first row in weights (C,)), copied once per state."""
        columns = torch.tensor([max(self.context) - o for o in self.context], device=device)
        offsets = torch.arange(len(self.context), device=device) * self.ctx[0].num_embeddings
        return torch.cat([emb.weight.detach() for emb in self.ctx]), columns, offsets

    def class_vectors(self, labels, n, device):
        """The class embedding of labels (N,) long in 0..C-1, or C (no label) for None or -1 entries,
        as (N, D); None for an unconditional model (which ignores labels)."""
        if not self.num_classes:
            return None
        if labels is None:
            labels = torch.full((n,), self.num_classes, dtype=torch.long, device=device)
        labels = torch.as_tensor(labels, device=device).long()
        if labels.shape != (n,) or bool(((labels < -1) | (labels > self.num_classes)).any()):
            raise UserError(f"labels must be {n} class numbers in 0..{self.num_classes - 1} (or -1 for none), "
                            f"got {labels.tolist() if labels.numel() <= 20 else tuple(labels.shape)}.")
        return self.label(torch.where(labels < 0, self.num_classes, labels))

    def forward(self, x, labels=None):
        """x (N, L) uint8 with L <= D, labels (N,) or None -> distribution parameters (N, L, P) for x_0..x_{L-1}."""
        N, L = x.shape
        tokens = torch.cat([torch.full((N, 1), START, device=x.device, dtype=torch.long), x[:, :-1].long()], 1)
        h = self.embed(tokens, torch.arange(L, device=x.device))
        if self.context:
            m = max(self.context)
            seq = torch.cat([torch.full((N, m), START, device=x.device, dtype=torch.long), x.long()], 1)
            h = h + sum(emb(seq[:, m - o: m - o + L]) for o, emb in zip(self.context, self.ctx))
        if (c := self.class_vectors(labels, N, x.device)) is not None:
            h = h + c.unsqueeze(1)                           # (N, 1, D): the same vector at every position
        for block in self.blocks:
            h = block(h)
        return self.proj(self.ln_f(h))

    def nll(self, x, labels=None):
        """Negative log-likelihood in nats of each sub-pixel, (N, D); float32 under autocast too."""
        return -self.head.log_prob(self(x, labels).float(), x)

    def init_state(self, batch, device, dtype=None, whole_model_kernel=True, labels=None):
        """Decoding state for `step`; dtype: that of the blocks' matrix products (None: the
        parameters'; bfloat16 for float32 parameters converts their weights once, here). When every
        layer steps through the fused CPU kernel (linear attention, ungated, with elu, relu or favor
        features: `LinearAttention.step_form`) and the feed-forward is GELU, the whole step runs as one C++ call unless
        whole_model_kernel=False. labels (N,) as in `forward`, fixed for the state.
        dtype dtypes.INT8 (int8 products, quantized here once): every Dense product in int8 (`ops.dense`) but
        those `Dense.int8_keeps` (the head, the first block's feed-forward input; evaluation's int8 keeps the
        same): through the C++ kernel's int8 product in the one-call C++ step, or fbgemm's in the Python module
        loop, as `ops.int8.takes_kernel` says (sampling's plan, `sampling.plan.decoding_state`, chooses)."""
        dtype = dtype or self.proj.weight.dtype
        layers = [b.init_state(batch, self.length, device, dtype) for b in self.blocks]
        head = self.proj.cast(dtype, batch) if dtype == INT8 else None
        state = DecodingState(layers=layers, class_vector=self.class_vectors(labels, batch, device), head=head,
                              history=torch.full((batch, max(self.context)), START, dtype=torch.long, device=device)
                              if self.context else None,
                              context=self.context_table(device) if self.context else None,
                              positions=self.positions(torch.arange(self.length, device=device)))
        kernel_form = dtype != INT8 or all(isinstance(w, torch.Tensor) for s in layers    # no fbgemm weight
                                           for w in (s.attn.qkv[0], s.attn.out[0], s.ff[0][0], s.ff[1][0]))
        # the one-call step: every block's attention on the fused kernel's state (features of its dtype), with
        # one map it computes
        maps = [b.attn.step_form(s.attn.S.dtype) if getattr(s.attn, "form", None) in ("fused", "mapped") else None
                for b, s in zip(self.blocks, layers)]
        one_map = all(maps) and len({name for name, _ in maps}) == 1
        if whole_model_kernel and kernel_form and self.activation == "gelu" and one_map:
            state.kernel = self.kernel_weights(layers, maps)
        return state

    def kernel_weights(self, layers, maps):
        """The tensors `ops.decode_step` reads, by name: per block a DecodeLayer (its weights, the
        state's of the products' dtype, LayerNorm's the parameters; its decoding state and its feature
        map's tensor, from maps: `step_form` per block), the head's DecodeHead, and the map's name."""
        blocks = []
        for b, s, (_, features) in zip(self.blocks, layers, maps):
            (qkv_w, qkv_b), (out_w, out_b), ((ff1_w, ff1_b), (ff2_w, ff2_b)) = s.attn.qkv, s.attn.out, s.ff
            blocks.append(DecodeLayer(ln1_weight=b.ln1.weight, ln1_bias=b.ln1.bias, qkv_weight=qkv_w, qkv_bias=qkv_b,
                                      out_weight=out_w, out_bias=out_b, ln2_weight=b.ln2.weight, ln2_bias=b.ln2.bias,
                                      ff1_weight=ff1_w, ff1_bias=ff1_b, ff2_weight=ff2_w, ff2_bias=ff2_b,
                                      state=s.attn.S, features=torch.empty(0) if features is None else features))
        head = DecodeHead(ln_f_weight=self.ln_f.weight, ln_f_bias=self.ln_f.bias, proj_weight=self.proj.weight,
                          proj_bias=self.proj.bias)
        return blocks, head, maps[0][0]

    def step(self, token, state):
        """token (N,) long: the byte at position t-1 (START for t = 0) -> parameters (N, P) for x_t."""
        h = self.tok(token) + state.positions[state.t]
        if state.class_vector is not None:
            h = h + state.class_vector
        if self.context:
            state.history = torch.cat([state.history[:, 1:], token[:, None]], 1)
            h = h + self.context_vectors(state.history, state.context)
        state.t += 1
        if state.kernel is not None:             # the loop below as one C++ call
            blocks, head, features = state.kernel
            return decode_step(h, blocks, head, self.blocks[0].attn.n_heads, self.ln_f.eps, EPS, features), state
        for i, block in enumerate(self.blocks):
            h, state.layers[i] = block.step(h, state.layers[i])
        h = self.ln_f(h)
        return (self.proj(h) if state.head is None else dense(h, state.head)), state


def build_model(model_cfg, info):
    """Model from the `model` config section (a dict) and a DatasetInfo."""
    keys = ("attention", "n_layers", "d_model", "n_heads", "d_ff", "head", "n_mixtures", "dropout",
            "attention_options", "num_classes", "context", "activation")
    return PixelTransformer(info.length, info.channels, info.width, **{k: model_cfg[k] for k in keys if k in model_cfg})


def model_dims(model):
    """(d_model, d_ff) of a PixelTransformer: the shapes of its blocks' products."""
    ff = model.blocks[0].ff[0].weight               # Dense (d_model, d_ff)
    return ff.shape[0], ff.shape[1]
