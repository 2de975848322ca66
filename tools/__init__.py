"""Research tools run from the repository root (python -m tools.NAME), not part of the installed package."""
