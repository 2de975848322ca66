"""The PixelTransformer: embeddings, blocks (layers), and the output heads."""

__all__ = ["heads", "int8_step", "transformer"]
