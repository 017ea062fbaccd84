"""Adapters added to a plain model from outside (LoRA), with the key names FunASR uses."""
