"""What the refill tests share (``tests/trainer/test_dynamic_sampling.py``, ``test_prompt_skipping.py``,
``test_refill_inputs.py``): four prompts of which one always ties, completions that make the
others informative, the groups a batch trained, and the check that a batch trains as TRL's."""

from __future__ import annotations

import torch

from tests.support.trainers import assert_grads_close, grad_norm, loss_and_grads, train_batch

DATA = ["1+1=", "2+3=", "4+4=", "3+5="]  # "1+1=" is always answered right: a tied group; the others are informative
DYNAMIC = {"dynamic_sampling": True, "beta": 0.1}


def tied_or_informative(prompts):
    """Right on every "1+1=" row; elsewhere right and wrong in turn, so a group of 4 has 2 of each."""
    answers = {"1+1=": "2", "2+3=": "5", "4+4=": "8", "3+5=": "8"}
    return [answers[p] if p == "1+1=" or i % 2 else "9 z" for i, p in enumerate(prompts)]


def group_prompts(trainer, batch):
    prompts = trainer.processing_class.batch_decode(batch["prompt_ids"], skip_special_tokens=True)
    return [prompts[i] for i in range(0, len(prompts), trainer.num_generations)]


def assert_trains_as_trl(ours, ours_batch, base, base_batch):
    """Our loss and gradients on ``ours_batch`` equal TRL's on ``base_batch``, and the gradient is not zero."""
    ours_loss, ours_grads = loss_and_grads(ours, ours_batch)
    base_loss, base_grads = loss_and_grads(base, base_batch)
    assert grad_norm(base_grads) > 1e-4
    torch.testing.assert_close(ours_loss, base_loss)
    assert_grads_close(ours_grads, base_grads, rtol=1e-5, atol=1e-7)


SKIP = {"skip_zero_std_prompts": True, "beta": 0.1}


def trained_groups(trainer, steps):
    """The prompts of every group trained in ``steps`` batches (under skipping the dataloader's are not used)."""
    prompts = []
    for _ in range(steps):
        prompts += group_prompts(trainer, train_batch(trainer, ["2+3=", "4+4="], tied_or_informative))
    return prompts
