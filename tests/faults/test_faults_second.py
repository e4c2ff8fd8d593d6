"""The short fault scenarios' second half, on private stack slot 1 (tests/faults/short.py)."""

from tests.faults import short

stack, test_fault__short__nothing_lost_or_doubled = short.half(1)
