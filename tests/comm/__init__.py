"""Tests of guide.comm, one file per module: log (measured), model (predicted), cost (estimated)."""
