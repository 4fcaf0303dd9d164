"""Test doubles for the agent that run the real agent code on top of recorded data (fake pynvml)."""
