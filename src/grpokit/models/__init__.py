"""Models: :mod:`.loading` (weights, tokenizer, prompts' token ids), :mod:`.lora` (adapters) and
:mod:`.logprobs` (the policy's and the reference model's per-token log-probabilities)."""
