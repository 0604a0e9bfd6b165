"""Mixture-of-experts: the router and the expert computation."""
