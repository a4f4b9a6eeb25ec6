"""Trainers on the tiny model and the tools to drive them: ``build_trainer`` builds any of the four trainers on the
same model weights and data, so a test can run TRL's trainer and ours on the same batch. ``stub_generation``
replaces only TRL's token generation on the instance (and ``stub_rollout`` goes through TRL's ``rollout_func``), so a
test chooses every completion exactly. No fixtures here: ``tests/conftest.py`` wraps these in fixtures, and the
launch workers import them directly."""

from __future__ import annotations

import copy
import itertools

import torch
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer, RLOOConfig, RLOOTrainer

from tests.support.models import TinyVLM
from trl_zerostd import ZeroStdGRPOConfig, ZeroStdGRPOTrainer, ZeroStdRLOOConfig, ZeroStdRLOOTrainer
from trl_zerostd.core.settings import ZERO_STD_FIELDS

LOSS_TYPES = ["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo"]  # TRL 1.16's GRPO losses
PROMPTS = ["1+1=", "2+3=", "4+4=", "3+5=", "2+2=", "1+6=", "5+3=", "7+1="]

# The regression batch. Group 1 ("1+1=") is tied: every completion is right. Group 2 ("2+3=") is informative: two
# right, two wrong. Lengths differ so that every token and row normaliser, and each row's KL, matters.
TIED = ["2", "2 a", "2 bb", "2"]
INFORMATIVE = ["5 x", "3", "5", "9 yy"]
MIXED_PROMPTS = ["1+1=", "2+3="]

BASE_CLASSES = {"grpo": (GRPOTrainer, GRPOConfig), "rloo": (RLOOTrainer, RLOOConfig)}
OUR_CLASSES = {"grpo": (ZeroStdGRPOTrainer, ZeroStdGRPOConfig), "rloo": (ZeroStdRLOOTrainer, ZeroStdRLOOConfig)}


def answer_reward(completions, prompts, **kwargs):
    """1.0 when the completion starts with the sum asked for by the prompt ``a+b=``, else 0.0."""
    rewards = []
    for prompt, completion in zip(prompts, completions, strict=True):
        a, b = prompt.rstrip("=").split("+")
        rewards.append(float(completion.strip().startswith(str(int(a) + int(b)))))
    return rewards


def constant_reward(completions, **kwargs):
    """The same reward for every completion: every group is zero-variance."""
    return [1.0] * len(completions)


def table_reward(table):
    """A reward function that looks each completion up in ``table`` (missing -> None, i.e. unscorable)."""

    def reward(completions, **kwargs):
        return [table.get(completion) for completion in completions]

    return reward


def build_trainer(
    tokenizer, base_model, output_root, kind="grpo", ours=True, reward_funcs=answer_reward, prompts=PROMPTS,
    model=None, peft_config=None, streaming=False, rollout_func=None, **config,
):  # fmt: skip
    """A trainer on a fresh copy of ``base_model`` (or ``model``) writing under ``output_root`` (``streaming``: the
    train set as an ``IterableDataset``; ``rollout_func``: TRL's); ``config``: its config fields over the tests'
    defaults."""
    trainer_cls, config_cls = (OUR_CLASSES if ours else BASE_CLASSES)[kind]
    settings = dict(
        output_dir=str(output_root / ("ours" if ours else "base")),
        per_device_train_batch_size=8,
        per_device_eval_batch_size=8,
        num_generations=4,
        max_completion_length=6,
        learning_rate=1e-2,
        beta=0.1,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        bf16=False,  # TRL defaults to bf16 autocast, on CPU too: fp32 keeps the gradient comparisons exact
        seed=0,
        max_steps=1,
    )
    settings.update(config)
    if not ours:
        settings = {k: v for k, v in settings.items() if k not in ZERO_STD_FIELDS}
    args = config_cls(**settings)
    dataset = Dataset.from_dict({"prompt": list(prompts)})
    return trainer_cls(
        model=copy.deepcopy(model if model is not None else base_model),
        reward_funcs=reward_funcs,
        args=args,
        train_dataset=dataset.to_iterable_dataset() if streaming else dataset,
        eval_dataset=dataset,
        processing_class=tokenizer,
        peft_config=peft_config,
        **({"rollout_func": rollout_func} if rollout_func is not None else {}),
    )


def completion_source(completions):
    """``prompts -> completion texts`` from a list (cycled over calls) or a callable ``prompts -> completions``."""
    if callable(completions):
        return completions
    stream = itertools.cycle(completions)
    return lambda prompts: [next(stream) for _ in prompts]


def encode_completion(tokenizer, text):
    """Token ids of a completion: EOS last, unless the text ends in ``"|"`` (cut there, no EOS: truncated)."""
    ids = tokenizer(text.rstrip("|"), add_special_tokens=False).input_ids
    return ids if text.endswith("|") else ids + [tokenizer.eos_token_id]


def stub_generation(trainer, completions, logprobs=None):
    """Replace only the token generation of ``trainer`` (TRL's ``_generate_single_turn``): the rows get
    ``completions`` (see ``completion_source``); TRL's own ``_generate`` still tokenizes, decodes and logs. GRPO:
    ``logprobs(row, ids) -> list[float]`` gives the sampling log-probs vLLM would return with them."""
    tokenizer = getattr(trainer.processing_class, "tokenizer", trainer.processing_class)  # a processor's tokenizer
    source = completion_source(completions)

    def generate_single_turn(prompt_ids, *args, **kwargs):
        texts = source(tokenizer.batch_decode(prompt_ids, skip_special_tokens=True))
        completion_ids = [encode_completion(tokenizer, text) for text in texts]
        if isinstance(trainer, RLOOTrainer):
            return completion_ids
        return completion_ids, [logprobs(i, ids) for i, ids in enumerate(completion_ids)] if logprobs else None

    trainer._generate_single_turn = generate_single_turn
    return trainer


def stub_rollout(trainer, completions, tool_mask=None, logprobs=None, extra_fields=None):
    """GRPO: generation through TRL's ``rollout_func`` seam, which can also return what a rollout adds:
    ``tool_mask(ids) -> list[int]`` (0 on tool-output tokens, TRL's ``env_mask``), ``logprobs(ids) -> list[float]``
    (vLLM's sampling log-probs) and ``extra_fields(prompts) -> dict`` (columns for the reward functions)."""
    tokenizer = trainer.processing_class
    source = completion_source(completions)

    def rollout(prompts, _trainer):
        completion_ids = [encode_completion(tokenizer, text) for text in source(prompts)]
        output = {
            "prompt_ids": [tokenizer(p, add_special_tokens=False).input_ids for p in prompts],
            "completion_ids": completion_ids,
            "logprobs": [logprobs(ids) for ids in completion_ids] if logprobs else None,
            **(extra_fields(prompts) if extra_fields else {}),
        }
        if tool_mask:
            output["env_mask"] = [tool_mask(ids) for ids in completion_ids]
        return output

    trainer.rollout_func = rollout
    return trainer


def rows_of(trainer, prompts):
    """The dataset rows of one generation batch: each prompt repeated ``num_generations`` times."""
    return [{"prompt": p} for p in prompts for _ in range(trainer.num_generations)]


def move_policy_away(model, scale=0.05, seed=1):
    """Perturb every trainable parameter (LoRA adapters only, under PEFT) so the policy differs from the reference:
    at step one they are equal and the KL gradient is zero whatever the code does."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.requires_grad:
                parameter.add_(scale * torch.randn(parameter.shape, generator=generator))


def assert_eval_is_trls(base, ours, completions, prompts) -> dict:
    """Eval on the same stubbed ``completions`` of ``prompts`` (``num_generations_eval`` rows each): the batch TRL
    scores, its loss and ``evaluate()``'s metrics (timings dropped) are the base trainer's, bit for bit. Returns our
    metrics."""
    runs = []
    for trainer in (base, ours):
        stub_generation(trainer, completions)
        trainer.model.eval()
        rows = [{"prompt": p} for p in prompts for _ in range(trainer.num_generations_eval)]
        output = trainer._generate_and_score_completions(rows)
        with torch.no_grad():
            loss = trainer.compute_loss(trainer.model, output)
        metrics = {k: v for k, v in trainer.evaluate().items() if "runtime" not in k and "per_second" not in k}
        runs.append((output, loss, metrics))
    (base_output, base_loss, base_metrics), (output, loss, metrics) = runs
    assert base_output.keys() == output.keys()
    for key in output:
        assert torch.equal(base_output[key], output[key]), key
    assert torch.equal(base_loss, loss)
    assert base_metrics == metrics and "eval_loss" in metrics
    return metrics


def loss_and_grads(trainer, batch):
    """Loss of ``batch`` in training mode and the parameter gradients it puts on the policy."""
    model = trainer.model
    model.train()
    if not hasattr(trainer, "current_gradient_accumulation_steps"):  # set by Trainer.train()
        trainer.current_gradient_accumulation_steps = trainer.args.gradient_accumulation_steps
    model.zero_grad(set_to_none=True)
    loss = trainer.compute_loss(model, batch)
    loss.backward()
    grads = {
        name: (p.grad.clone() if p.grad is not None else torch.zeros_like(p)) for name, p in model.named_parameters()
    }
    return loss.detach(), grads


def grad_norm(grads):
    return torch.sqrt(sum((g.double() ** 2).sum() for g in grads.values())).item()


def train_batch(trainer, prompts, completions, **rollout):
    """Training-mode output of ``_generate_and_score_completions`` for ``prompts`` x ``num_generations`` rows
    (``rollout`` options: generation through ``stub_rollout``)."""
    if rollout:
        stub_rollout(trainer, completions, **rollout)
    else:
        stub_generation(trainer, completions)
    trainer.model.train()
    return trainer._generate_and_score_completions(rows_of(trainer, prompts))


def answer_or_not(prompts):
    """Completions that depend only on the prompt and position, so two trainers see the same ones in eval."""
    return [("2" if p == "1+1=" else "3 z") if i % 2 else "8" for i, p in enumerate(prompts)]


def assert_grads_close(actual, expected, **tolerance):
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], msg=name, **tolerance)


def assert_all_zero(grads):
    nonzero = [name for name, g in grads.items() if torch.count_nonzero(g)]
    assert not nonzero, f"non-zero gradient on {nonzero}"


def moved_by_train(make_trainer, kind="grpo", **config):
    """``{ours: names of the parameters one real ``train()`` step moved}`` for our trainer and TRL's (policy moved
    away from the reference first, so a KL term would put gradient)."""
    moved = {}
    for ours in (True, False):
        trainer = make_trainer(kind, ours=ours, **config)
        move_policy_away(trainer.model)
        before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
        trainer.train()
        moved[ours] = [name for name, p in trainer.model.named_parameters() if not torch.equal(p, before[name])]
    return moved


def clipped_loss_metrics(make_trainer, prompts, completions, **config):
    """``(base, ours)`` trainers after one loss on the same batch with TRL's loss mask limited to our trained rows
    (first group masked): num_iterations=2 and a policy moved after generation push ratios past the clip range.
    ``config``: more settings of both (the package's own reach ours only)."""
    base = make_trainer(ours=False, beta=0.1, num_iterations=2, **config)
    ours = make_trainer(beta=0.1, num_iterations=2, **config)
    ours_batch = train_batch(ours, prompts, completions)
    base_batch = train_batch(base, prompts, completions)
    base_batch["advantages"] = ours_batch["advantages"]
    base_batch["completion_mask"][:4] = 0
    for trainer, batch in ((base, base_batch), (ours, ours_batch)):
        move_policy_away(trainer.model, scale=0.2)
        loss_and_grads(trainer, batch)
    return base, ours


VLM_INFORMATIVE = ["5 x", "4", "5", "2 yy"]  # first characters odd, even, odd, even: two right, two wrong
IMAGE_COLORS = {"1+1=": (200, 30, 30), "2+3=": (30, 30, 200), "4+4=": (30, 200, 30), "3+5=": (200, 200, 30)}


def vlm_trainer(vlm: TinyVLM, output_dir, ours=True, kind="grpo", prompts=MIXED_PROMPTS, **config):
    """A trainer on a tiny local VLM; every prompt has its own image (``IMAGE_COLORS``)."""
    dataset = Dataset.from_dict(
        {"prompt": [[{"role": "user", "content": p}] for p in prompts], "image": [prompt_image(p) for p in prompts]}
    )
    settings = dict(
        output_dir=str(output_dir), per_device_train_batch_size=8, num_generations=4, max_completion_length=4,
        beta=0.1, max_steps=2, logging_steps=1, save_strategy="no", report_to="none", use_cpu=True, bf16=False, seed=0,
    )  # fmt: skip
    settings.update(config)
    trainer_cls, config_cls = (OUR_CLASSES if ours else BASE_CLASSES)[kind]

    def reward(completions, prompts, **kwargs):  # "1+1=" always right (a tied group); else the first character
        return [
            1.0 if "1+1" in str(p) else float(ord((c[0]["content"] or "a")[0]) % 2)
            for p, c in zip(prompts, completions)
        ]

    return trainer_cls(
        model=vlm.path,
        reward_funcs=reward,
        args=config_cls(**settings),
        train_dataset=dataset,
        processing_class=copy.deepcopy(vlm.processor),
    )


def prompt_image(prompt: str):
    from PIL import Image

    return Image.new("RGB", (28, 28), IMAGE_COLORS[prompt])


def vlm_batch(trainer, prompts, completions):
    """Training-mode output for ``prompts`` x ``num_generations`` rows, each with its prompt's image."""
    images = {row["prompt"][0]["content"]: row["image"] for row in trainer.train_dataset}
    stub_generation(trainer, completions)
    trainer.model.train()
    rows = [{"prompt": [{"role": "user", "content": p}], "image": images[p]} for p in prompts for _ in range(4)]
    return trainer._generate_and_score_completions(rows)
