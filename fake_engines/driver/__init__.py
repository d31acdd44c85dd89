"""Edges that run a clock-free engine core against real time and sockets."""
