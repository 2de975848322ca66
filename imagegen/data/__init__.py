"""Datasets as sources: the standard sets, image folders, downsampled ImageNet, the memory-mapped cache."""

__all__ = ["catalogue", "cifar", "download", "folder", "idx", "imagecache", "imagenet", "official", "sets", "source",
           "splits"]
