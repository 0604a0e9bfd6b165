"""Interfaces between layers and quantization: a method owns a layer's weights and math."""

from abc import ABC, abstractmethod

import torch


class QuantizeMethodBase(ABC):
    """How one layer's weights are created, post-processed after loading, and applied."""

    @abstractmethod
    def create_weights(self, layer: torch.nn.Module, *args, **kwargs) -> None: ...

    @abstractmethod
    def apply(self, layer: torch.nn.Module, *args, **kwargs) -> torch.Tensor: ...

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:  # noqa: B027
        """Called once all weights are loaded (default: nothing to do)."""


class QuantizationConfig(ABC):
    """Chooses the quantization method of each layer of a model."""

    @abstractmethod
    def get_quant_method(self, layer: torch.nn.Module, prefix: str) -> QuantizeMethodBase | None:
        """The method for `layer` at module path `prefix`, or None for the default."""

    def check_model_built(self, model: torch.nn.Module) -> None:  # noqa: B027
        """Called once `model`'s layers are built (default: nothing to check)."""
