"""The workflow service: RunCompleted in, the next nodes' runs out."""
