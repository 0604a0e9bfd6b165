"""Engine statistics exported by the server (Prometheus) and logged periodically."""
