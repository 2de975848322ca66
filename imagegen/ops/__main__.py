"""python -m imagegen.ops [cpu|cuda]: build the compiled kernel for that device now (default cpu)."""
import sys

from .build import main

main(sys.argv[1:])
