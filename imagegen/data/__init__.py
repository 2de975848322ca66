"""Datasets as sources: the standard sets, image folders, downsampled ImageNet, the memory-mapped cache."""
