"""The PixelTransformer: embeddings, blocks (layers), and the output heads."""

__all__ = ["heads", "transformer"]
