"""Gemma 4's assistant drafter trained on a frozen Gemma 4 target (``mtp.style: assistant``).

model_config.py: its model config (a Gemma 4 text config of its own width) and its checks; attention.py: the
query-only attention over the target's stored keys and values; block.py: the assistant as a megatron-core
module and its K recurrent draft steps; model.py: the target GPTModel that trains it; hf_mapping.py: its tensors
under transformers' ``Gemma4AssistantForCausalLM`` names."""
