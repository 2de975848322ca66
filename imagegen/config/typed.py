"""A config as its dataclass (schema.py, bench.py): what commands, training and sampling read, by attribute."""
from dataclasses import asdict, is_dataclass

__all__ = ["typed", "plain"]


def typed(schema, cfg):
    """cfg (a dict, an OmegaConf node, or already a `schema`) as an instance of the dataclass `schema`: the
    options it leaves out at their defaults, every value's type checked by OmegaConf."""
    if isinstance(cfg, schema):
        return cfg
    from omegaconf import OmegaConf
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), cfg))


def plain(cfg):
    """A typed config (or a part of one) as the plain dict a checkpoint or a JSON record stores."""
    return asdict(cfg) if is_dataclass(cfg) else dict(cfg)

