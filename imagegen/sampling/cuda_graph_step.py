"""On CUDA, a linear model's decoding step (`PixelTransformer.step`, the reference, which runs everywhere
else) over static buffers under torch.compile(mode="reduce-overhead"), which replays it as one CUDA graph
instead of launching every layer's small kernels from Python. The sampling plan (sampling/plan.py,
`make_step`) chooses it and keeps the compiled steps; the model holds nothing of them.

Tested on the CPU in its eager form against `PixelTransformer.step`; compiled, on a GPU only where
one is (tests/test_cuda_graph_step.py passed on an H200 once, docs/gpu.md; there the first call,
which compiles, took over 30 s). If torch declines to graph it, torch.compile logs why and runs it
compiled without graphs.
Shape letters: N batch, D model dim, P distribution parameters, E head dim.
"""
import torch

from ..model.transformer import START
from ..say import say


class GraphedStep:
    """`PixelTransformer.step` for `batch` images over static buffers: the position t is a device
    tensor and each layer's S (N H, E, E + 1), Z its last column, is updated in place, so every call
    runs the same operations on the same addresses. compile=False keeps it eager (the tests')."""

    def __init__(self, model, batch, device, dtype, compile=True):
        self.model = model
        dtype = dtype or model.proj.weight.dtype
        self.layers = [b.init_state(batch, model.length, device, dtype) for b in model.blocks]
        for state in self.layers:
            if getattr(state.attn, "form", None) not in ("torch", "triton"):
                raise ValueError("GraphedStep needs the PyTorch form of the linear state (S with Z as a column); "
                                 "on the CPU use PixelTransformer.step.")
            state.attn.form = "torch"     # a graph replays PyTorch's ops; Triton's step serves the eager loop
        self.t = torch.zeros((), dtype=torch.long, device=device)
        self.history = (torch.full((batch, max(model.context)), START, dtype=torch.long, device=device)
                        if model.context else None)   # the last bytes read, newest last (context models)
        self.batch, self.device = batch, device
        with torch.no_grad():
            self.cls = model.class_vectors(None, batch, device)    # (N, D) class vectors, or None
        self.fn = self.eager
        if compile:
            extra = [b for b in (self.cls, self.history) if b is not None]
            for buffer in [self.t, *(state.attn.S for state in self.layers), *extra]:
                torch._dynamo.mark_static_address(buffer)
            self.fn = torch.compile(self.eager, mode="reduce-overhead", fullgraph=True, dynamic=False)
            say(f"the sampling step for {batch} images compiles into one CUDA graph on its first call "
                "(once per process and batch; it took over 30 s on an H200)")

    def reset(self, labels=None):
        """Back to position 0 with empty states and these labels' class vectors, in place."""
        self.t.zero_()
        if self.history is not None:
            self.history.fill_(START)
        if self.cls is not None:
            with torch.no_grad():
                self.cls.copy_(self.model.class_vectors(labels, self.batch, self.device))
        for state in self.layers:
            state.attn.S.zero_()
        return self

    def eager(self, token):                                 # token (N,) long -> (N, P)
        h = self.model.embed(token, self.t)                 # (N, D)
        if self.cls is not None:
            h = h + self.cls
        if self.history is not None:
            self.history.copy_(torch.cat([self.history[:, 1:], token[:, None]], 1))
            h = h + self.model.context_vectors(self.history)
        for block, state in zip(self.model.blocks, self.layers):
            h = block.step(h, state)[0]
        self.t += 1
        return self.model.proj(self.model.ln_f(h))

    def __call__(self, token):
        return self.fn(token).clone()                       # a replay rewrites the graph's output buffer
