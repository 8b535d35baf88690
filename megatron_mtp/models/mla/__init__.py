"""What the multi-head latent attention families share (DeepSeek-V3, and under models/dsa/ DeepSeek-V3.2 and
GLM-5): a base, not a family (as models/gqa/ is for the grouped-query families)."""
