"""Decoding: the RNN / KV-cache / recompute loops, guidance, grids and completions; the CUDA-graph step."""

__all__ = ["cuda_graph_step", "decode", "plan", "threads"]
