"""A `data` config section -> its dataset: DatasetInfo and splits, whatever the set (a standard set,
a folder of images, the downsampled ImageNet). What the commands, the trainer and the API call; no
module in imagegen/data imports it (catalogue.py: the table of sets; splits.py: the standard sets'
splits; source.py: a folder's or ImageNet's, from the memory-mapped cache).
"""
from . import catalogue, source
from .splits import load_splits


def dataset_info(name):
    """DatasetInfo of a dataset name (mnist, cifar10, ...) or of a data config section (a dict): a folder's
    size and channels come from its config, its class names from the config or the folder's cache."""
    if isinstance(name, dict):
        if name.get("name") == "folder":
            return source.folder_info(name)
        name = name.get("name")
    return catalogue.info(name)


def load_from_config(data_cfg, splits, overrides=None, labels=False):
    """[sequences (B, D) of each split in splits] as described by a `data` config section
    (dict); non-null `overrides` (e.g. a new root) replace its values. labels=True: [(sequences,
    labels (B,) long)] instead. A folder's sequences are source.ImageRows over its memory-mapped
    cache (indexing one gives a uint8 tensor), the standard sets' uint8 tensors."""
    d = {**data_cfg, **{k: v for k, v in (overrides or {}).items() if v is not None}}
    if d["name"] in catalogue.CACHED:
        return source.load(d, splits, labels)
    loaded = load_splits(d["name"], d["root"], splits, d["val_fraction"], d["split_seed"], d["download"],
                         d.get("mirror"))
    return [loaded[split] if labels else loaded[split][0] for split in splits]
