"""What the multi-head latent attention families share (DeepSeek-V3, DeepSeek-V3.2): a base, not a family
(as models/gqa/ is for the grouped-query families)."""
