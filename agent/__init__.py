"""Tessera node agent: GPU inventory and sampling, job execution with enforced slices, portal transport."""

__version__ = "0.1.0"
