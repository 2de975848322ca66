"""Machine facts and choosing by measurement: machine.py (the CPU, its bfloat16 and VNNI capability,
free memory), probe.py (timing two ways once per machine and remembering the verdict), threads.py
(torch's thread count from the cores free now), allocator.py (malloc for training). Below ops/ and
model/, which call it; it calls neither."""
