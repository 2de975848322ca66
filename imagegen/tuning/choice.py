"""A decision as a value: what was chosen and why, made once by one function, so that what runs and
what the user is told (a header, a log line, a run's metadata) cannot disagree."""
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Choice:
    """`value`: what runs (a dtype, an implementation's name, a flag); `reason`: why, in a few words
    ("" where the user asked for the value outright)."""
    value: Any
    reason: str = ""
