"""Model families. Each family folder holds its specs, TransformerConfig translation and HF mapping."""
