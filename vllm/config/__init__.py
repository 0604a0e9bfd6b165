"""Engine configuration: dataclass configs and parsing of user-facing options."""
