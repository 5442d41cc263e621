"""Negative tests of guide.checks: every way each guard can be fooled must raise."""
