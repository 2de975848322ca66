"""What imagegen-bench runs (imagegen/commands/bench.py): one module per mode and their helpers."""

__all__ = ["attention", "browser", "compare", "paper", "paper_tables", "progress", "report", "sampling", "step_limit",
           "sweep", "timing"]
