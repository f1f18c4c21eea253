"""Trace-driven simulator: discrete-event engine with simulated cloud and executor."""
