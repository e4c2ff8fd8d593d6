"""The fault harness and its scenarios (issue 26); see tests/faults/harness.py."""
