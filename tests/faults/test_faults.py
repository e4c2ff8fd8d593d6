"""The short fault scenarios' first half, on private stack slot 0 (tests/faults/short.py)."""

from tests.faults import short

stack, test_fault__short__nothing_lost_or_doubled = short.half(0)
