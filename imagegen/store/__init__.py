"""What is saved and loaded: run checkpoints (.pt, weights_only), shipped models (.safetensors + .json)."""
