"""The PixelTransformer: embeddings, blocks (layers), and the output heads."""
