"""Module swaps live in brisk/swap.py (floor 0), so that memory/ and speed/ swap modules without importing the
model room; this name stays for the code that imports it from here."""

from ..swap import swap_class, swapped  # noqa: F401
