"""Causal self-attentions behind one protocol (base.py: `Attention`, `AttentionState`), chosen by name
from a registry (registry.py: `ATTENTIONS`, `make_attention`): softmax.py, linear.py (feature_maps.py),
lsh.py (lsh_naive.py: its loop reference). This file only re-exports; importing the attention modules
fills the registry."""
from .base import Attention, AttentionState
from .registry import ATTENTIONS, make_attention, register
from .linear import LinearAttention, LinearState
from .lsh import LSHAttention
from .softmax import KVCache, SoftmaxAttention

__all__ = ["ATTENTIONS", "Attention", "AttentionState", "KVCache", "LSHAttention", "LinearAttention", "LinearState",
           "SoftmaxAttention", "make_attention", "register"]
