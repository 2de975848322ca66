"""What is saved and loaded: run checkpoints (.pt, weights_only), shipped models (.safetensors + .json)."""

__all__ = ["checkpoint", "checks", "format", "pack", "shipped"]
