"""The attentions by name: `register` fills ATTENTIONS (each attention module on import, through the
package's __init__), `make_attention` builds one. A leaf: it imports no attention module."""
from ..errors import UserError

ATTENTIONS = {}


def register(name):
    def wrap(cls):
        ATTENTIONS[name] = cls
        cls.name = name
        return cls
    return wrap


def make_attention(name, d_model, n_heads, **options):
    """The attention `name` for d_model and n_heads; options: its model.attention_options (a plain dict,
    any missing at their defaults)."""
    if name not in ATTENTIONS:
        raise UserError(f"unknown attention {name!r}; choose one of {sorted(ATTENTIONS)}.")
    return ATTENTIONS[name](d_model, n_heads, **options)     # the class checks its options (Attention.parse_options)
