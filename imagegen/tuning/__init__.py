"""Machine facts and choosing by measurement: machine.py (the CPU, its bfloat16 and VNNI capability,
free memory), probe.py (timing two ways once per machine and remembering the verdict), threads.py
(torch's thread count from the cores free now), allocator.py (malloc for training), choice.py (a decision
and its reason as one value). Below ops/ and
model/, which call it; it calls neither."""

__all__ = ["allocator", "choice", "machine", "probe", "threads"]
