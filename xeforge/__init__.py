"""xeforge: port Triton kernels to Intel GPUs stage by stage, with every candidate verified on hardware."""

__version__ = "0.1.0"
