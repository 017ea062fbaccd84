"""brisk: fast, trustworthy fine-tuning of speech-LLMs (Fun-ASR-Nano) and LLMs on PyTorch."""

__version__ = "0.1.0"
