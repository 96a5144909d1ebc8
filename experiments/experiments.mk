# The experiments behind the numbers in docs/ (experiments/README.md): each target trains, evaluates
# and tabulates into its run folder under runs/ (not committed); the files a doc reports are copied
# from there to experiments/results/ (experiments/results/README.md says which is which).
# Included by the root Makefile (`make long` etc. run from the root), after the variables used here:
# $(STAMP), $(BIN) (.venv), $(BENCH_STAMP), $(BENCH_ARGS) (.venv-bench, TRL).

.PHONY: long long-arith loss-variants loss-variants-mu2 tools tools-mawps feedback process process-steps ppo-vs-grpo efficacy-vs-trl

# Recipe (b), word problems (docs/efficacy.md): a supervised warm-up on ASDiv's written equations
# (the recipe's sft section; skipped when runs/long-sft, its model.name_or_path, exists), GRPO on MAWPS from it (its own evaluations pair the SFT model
# with each checkpoint), then the base model paired with the last checkpoint on the same problems.
LONG_SFT := runs/long-sft
# LONG_LAST: the run folder; grpokit eval takes its newest complete checkpoint
LONG_LAST := runs/long
long: $(STAMP)
	test -f $(LONG_SFT)/sft_info.json || $(BIN)/grpokit sft recipes/long.yaml
	$(BIN)/grpokit train recipes/long.yaml
	$(BIN)/grpokit eval smollm2-135m-instruct --against $(LONG_LAST) --heldout-of recipes/long.yaml --output runs/long/eval_base_vs_last.json

# Tools (experiments/tools.md): the call-format warm-up (the recipe's sft section; skipped when
# runs/tools-sft exists), then per seed GRPO with the calculator from it and GRPO without a tool
# from the packaged model, the same problems and steps; then the table (experiments/scripts/paired_evals.py).
TOOLS_SFT := runs/tools-sft
TOOLS_OUT := runs/tools-table
TOOLS_SEEDS ?= 0 1
NO_ENV := rollout.env=null 'rollout.env_options={}'
tools: $(STAMP)
	test -f $(TOOLS_SFT)/sft_info.json || $(BIN)/grpokit sft recipes/tools.yaml
	$(BIN)/grpokit eval $(TOOLS_SFT) --heldout-of recipes/tools.yaml --overwrite --output $(TOOLS_OUT)/warmup_tools.json
	$(BIN)/grpokit eval $(TOOLS_SFT) --heldout-of recipes/tools.yaml $(NO_ENV) --overwrite --output $(TOOLS_OUT)/warmup_notools.json
	for s in $(TOOLS_SEEDS); do \
	  $(BIN)/grpokit train recipes/tools.yaml train.seed=$$s eval.before=false train.output_dir=$(TOOLS_OUT)/tool_s$$s || exit 1; \
	  $(BIN)/grpokit train recipes/tools.yaml $(NO_ENV) model.name_or_path=smollm2-135m-instruct train.seed=$$s train.output_dir=$(TOOLS_OUT)/notool_s$$s || exit 1; \
	done
	$(BIN)/python experiments/scripts/paired_evals.py warmup=$(TOOLS_OUT)/warmup_tools.json warmup_no_tool=$(TOOLS_OUT)/warmup_notools.json \
	  $(foreach s,$(TOOLS_SEEDS),tool_s$(s)=$(TOOLS_OUT)/tool_s$(s)/eval_after.json base_s$(s)=$(TOOLS_OUT)/notool_s$(s)/eval_before.json notool_s$(s)=$(TOOLS_OUT)/notool_s$(s)/eval_after.json) \
	  $(foreach s,$(TOOLS_SEEDS),--pair tool_s$(s):notool_s$(s) --pair tool_s$(s):warmup --pair notool_s$(s):base_s$(s)) \
	  --pair warmup:warmup_no_tool --json $(TOOLS_OUT)/table.json

# Word problems with the calculator (experiments/tools.md): make long's warm-up (skipped when runs/long-sft
# exists), then per seed GRPO on MAWPS with the calculator in the "expression =" call format.
MAWPS_OUT := runs/tools-mawps
tools-mawps: $(STAMP)
	test -f $(LONG_SFT)/sft_info.json || $(BIN)/grpokit sft recipes/long.yaml
	$(BIN)/grpokit eval $(LONG_SFT) --heldout-of recipes/tools_mawps.yaml $(NO_ENV) --overwrite --output $(MAWPS_OUT)/warmup_notools.json
	for s in $(TOOLS_SEEDS); do \
	  $(BIN)/grpokit train recipes/tools_mawps.yaml train.seed=$$s train.output_dir=$(MAWPS_OUT)/s$$s || exit 1; \
	done
	$(BIN)/python experiments/scripts/paired_evals.py warmup_no_tool=$(MAWPS_OUT)/warmup_notools.json \
	  $(foreach s,$(TOOLS_SEEDS),before_s$(s)=$(MAWPS_OUT)/s$(s)/eval_before.json s20_s$(s)=$(MAWPS_OUT)/s$(s)/eval_step20.json \
	    s40_s$(s)=$(MAWPS_OUT)/s$(s)/eval_step40.json s60_s$(s)=$(MAWPS_OUT)/s$(s)/eval_step60.json \
	    after_s$(s)=$(MAWPS_OUT)/s$(s)/eval_after.json) \
	  $(foreach s,$(TOOLS_SEEDS),--pair after_s$(s):before_s$(s) --pair s60_s$(s):before_s$(s) --pair s40_s$(s):before_s$(s) \
	    --pair s20_s$(s):before_s$(s)) \
	  --pair before_s0:warmup_no_tool $(foreach s,$(TOOLS_SEEDS),--pair after_s$(s):warmup_no_tool) --json $(MAWPS_OUT)/table.json

# The feedback environment on the arithmetic recipe (experiments/tools.md): per seed (each its own held-out
# set, --heldout-of with train.seed), GRPO with the feedback environment (its eval_before and
# eval_after are the base's and the trained model's last answers, 3 turns), then the first answers
# of both (rollout.max_turns=1), and the paired table.
FEEDBACK_OUT := runs/feedback
FEEDBACK_SEEDS ?= 0 1
feedback: $(STAMP)
	for s in $(FEEDBACK_SEEDS); do \
	  $(BIN)/grpokit train recipes/feedback.yaml train.seed=$$s train.output_dir=$(FEEDBACK_OUT)/s$$s || exit 1; \
	  $(BIN)/grpokit eval smollm2-135m-instruct --heldout-of recipes/feedback.yaml train.seed=$$s rollout.max_turns=1 \
	    --overwrite --output $(FEEDBACK_OUT)/s$$s/base_first.json || exit 1; \
	  $(BIN)/grpokit eval $(FEEDBACK_OUT)/s$$s --heldout-of recipes/feedback.yaml train.seed=$$s rollout.max_turns=1 \
	    --overwrite --output $(FEEDBACK_OUT)/s$$s/trained_first.json || exit 1; \
	done
	$(BIN)/python experiments/scripts/paired_evals.py \
	  $(foreach s,$(FEEDBACK_SEEDS),base_first_s$(s)=$(FEEDBACK_OUT)/s$(s)/base_first.json \
	    base_last_s$(s)=$(FEEDBACK_OUT)/s$(s)/eval_before.json trained_first_s$(s)=$(FEEDBACK_OUT)/s$(s)/trained_first.json \
	    trained_last_s$(s)=$(FEEDBACK_OUT)/s$(s)/eval_after.json) \
	  $(foreach s,$(FEEDBACK_SEEDS),--pair base_last_s$(s):base_first_s$(s) --pair trained_last_s$(s):trained_first_s$(s) \
	    --pair trained_first_s$(s):base_first_s$(s) --pair trained_last_s$(s):base_last_s$(s)) \
	  --json $(FEEDBACK_OUT)/paired.json

# The loss and advantage variants (experiments/loss_variants.md): each 30 steps of recipes/arith.yaml,
# seed 0, then the table (held-out greedy at step 30 paired with plain GRPO) and the entropy/length plot.
# VARIANTS="plain gspo" runs some; runs/variants/<name> that hold eval_after.json are not run again.
VARIANTS ?=
loss-variants: $(STAMP)
	$(BIN)/python experiments/scripts/loss_variants.py run $(if $(VARIANTS),--only $(VARIANTS))
	$(BIN)/python experiments/scripts/loss_variants.py table --json runs/variants/table.json --plot runs/variants/curves.png

# The variants that act only through ratios != 1 (CISPO, dual clip, GSPO, GSPO-token) paired with plain
# GRPO at two gradient passes per batch (train.num_iterations=2), in runs/variants_mu2.
MU2_VARIANTS ?= plain cispo dual_clip gspo gspo_token
loss-variants-mu2: $(STAMP)
	$(BIN)/python experiments/scripts/loss_variants.py run --only $(MU2_VARIANTS) --shared train.num_iterations=2 --out runs/variants_mu2
	$(BIN)/python experiments/scripts/loss_variants.py table --out runs/variants_mu2 --json runs/variants_mu2/table.json --plot runs/variants_mu2/curves.png

# The arithmetic recipe, 60 steps (docs/guide.md, "Arithmetic that improves").
long-arith: $(STAMP)
	$(BIN)/grpokit train recipes/arith.yaml

# Process supervision on the demo's data, 20 steps (docs/process_vs_outcome.md).
process: $(STAMP)
	$(BIN)/grpokit train recipes/process.yaml

# Issue #33 on the multi-step task (docs/process_supervision.md, "A multi-step task"): where outcome
# supervision leaves groups without signal, the warm-up, step labels of its own solutions, the PRM
# trained on them (and checked against the rule verifier), then the arms of experiments/scripts/process_arms.py
# (outcome, rule verifier, learned PRM, learned PRM with the answer check on the last step,
# iterative PRM) for each seed in STEPS_SEEDS, and the table.
# Each part is skipped when its output exists; the labels resume.
STEPS_SEEDS ?= 0 1
STEPS_ARMS ?= outcome rule prm prm_outcome prm_iterative
process-steps: $(STAMP)
	test -f runs/steps/sft/config.json || $(BIN)/grpokit sft recipes/steps.yaml
	test -f runs/steps/signal.json || $(BIN)/python experiments/scripts/step_signal.py sample recipes/steps.yaml prm.judge=reasoning_gym --json runs/steps/signal.json
	$(BIN)/grpokit prm label recipes/steps.yaml
	test -f runs/steps/prm/prm_info.json || $(BIN)/grpokit prm train recipes/steps.yaml
	$(BIN)/python experiments/scripts/step_signal.py labels recipes/steps.yaml --prm runs/steps/prm --json runs/steps/prm_check.json
	$(BIN)/python experiments/scripts/process_arms.py run --seeds $(STEPS_SEEDS) --only $(STEPS_ARMS)
	$(BIN)/python experiments/scripts/process_arms.py table --seeds $(STEPS_SEEDS) --json runs/steps/table.json

# Held-out accuracy against training minutes, grpokit vs TRL on recipes/arith.yaml (hours on 2 cores;
# BENCH_ARGS="--quick" checks the script in minutes, "--seeds 0" runs one seed). 40 training steps
# per run (--steps), as measured in docs/efficacy.md; the recipe itself runs 60.
efficacy-vs-trl: $(STAMP) $(BENCH_STAMP)
	$(BIN)/python bench/efficacy_vs_trl.py $(BENCH_ARGS)

# PPO against GRPO on the arithmetic recipe (docs/ppo_vs_grpo.md; BENCH_ARGS passes options).
ppo-vs-grpo: $(STAMP)
	$(BIN)/python bench/ppo_vs_grpo.py $(BENCH_ARGS)
