"""edgebuild's PyTorch frontend: TorchScript, torch.export programs and module factories with weights."""

__version__ = "0.1.0"
