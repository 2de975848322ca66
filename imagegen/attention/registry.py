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
    if name not in ATTENTIONS:
        raise UserError(f"unknown attention {name!r}; choose one of {sorted(ATTENTIONS)}.")
    try:
        return ATTENTIONS[name](d_model, n_heads, **options)
    except TypeError as e:
        raise UserError(f"bad model.attention_options for {name} attention ({e}); see the docstring of "
                        f"{ATTENTIONS[name].__name__} for its options.") from None
