"""Executors: where the model runners of the tensor-parallel ranks live."""
