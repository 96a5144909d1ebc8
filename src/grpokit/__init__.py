"""grpokit: GRPO fine-tuning for causal LMs (outcome and process supervision)."""

import logging as _logging

# transformers imports torchao (the optional extra grpokit[torchao], for the 8-bit optimizer)
# whenever it is installed; on a CPU machine torchao then logs that its CUDA-only extensions cannot
# load, and torch warns about torchao's enum registrations. Neither concerns a grpokit run. Only
# the loggers are set here: grpokit itself never imports torchao unless train.optimizer=adamw_8bit.
for _name in ("torchao", "torch.utils._pytree"):
    if _logging.getLogger(_name).level == _logging.NOTSET:
        _logging.getLogger(_name).setLevel(_logging.ERROR)
