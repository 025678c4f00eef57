"""`python -m benchmarks NAME ...` from the repository's root."""

import sys

from benchmarks.cli import main

main(sys.argv[1:])
