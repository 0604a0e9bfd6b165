"""Neural-network layers shared by the models."""
