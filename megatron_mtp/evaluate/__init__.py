"""`megatron-mtp eval`: above convert/, since the checkpoint it is given may be a Hugging Face export."""
