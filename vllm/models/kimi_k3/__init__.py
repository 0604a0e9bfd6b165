"""Kimi-K3 / Kimi-Linear text model."""
