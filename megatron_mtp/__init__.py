"""megatron_mtp: pretraining of DeepSeek-V3-style MoE models with Multi-Token Prediction."""

__version__ = "0.1.0"
