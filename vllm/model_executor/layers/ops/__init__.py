"""Triton ops of the generic layers, one file per op with its launcher and torch reference."""
