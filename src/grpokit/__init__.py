"""grpokit: GRPO fine-tuning for causal LMs (outcome and process supervision)."""

import logging as _logging

# transformers imports torchao (a grpokit dependency, for the 8-bit optimizer) whenever it is
# installed; on a CPU machine torchao then logs that its CUDA-only extensions cannot load, and
# torch warns about torchao's enum registrations. Neither concerns a grpokit run.
for _name in ("torchao", "torch.utils._pytree"):
    if _logging.getLogger(_name).level == _logging.NOTSET:
        _logging.getLogger(_name).setLevel(_logging.ERROR)
