"""Refills of rows that carry more than a prompt: images (refilled rows keep them), streaming datasets (refills read
the stream, the skip history is keyed by hashed prompts) and ``environment_factory`` episodes through TRL's tool
loop."""

from __future__ import annotations

import pytest
import torch

from tests.support.environments import TASKS, SubmitEnvironment, submit_calls
from tests.support.refill import DATA, DYNAMIC, SKIP, group_prompts, tied_or_informative
from tests.support.trainers import stub_generation, train_batch
from trl_zerostd.sampling.skipping import history_key

# ---------------------------------------------------------------------------------------------------------------
# Image inputs: refilled rows keep their images
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.every_trl
@pytest.mark.parametrize("kind", ["grpo", "rloo"])
@pytest.mark.parametrize("skipping", [False, True])
def test_refilled_rows_keep_their_images(tiny_vlm, tmp_path, kind, skipping):
    """Dynamic sampling (and prompt skipping) with images, each prompt its own: the tied group is replaced, and every
    row that trains carries its own prompt's image into the training batch (the pixel values TRL's processor gives
    that image alone), in both VLM layouts (one pixel row per image; patches flat with a grid per image)."""
    from trl.trainer.utils import split_pixel_values_by_grid

    from tests.support.trainers import prompt_image, vlm_batch, vlm_trainer

    trainer = vlm_trainer(tiny_vlm, tmp_path, kind=kind, prompts=DATA, skip_zero_std_prompts=skipping, **DYNAMIC)
    batch = vlm_batch(trainer, ["1+1=", "2+3="], lambda prompts: VLM_ANSWERS * (len(prompts) // 4))
    tokenizer = trainer.processing_class.tokenizer
    row_prompts = tokenizer.batch_decode(batch["prompt_ids"], skip_special_tokens=True)
    assert "1+1=" not in row_prompts and len(set(row_prompts)) == 2
    assert trainer._metrics["train"]["dynamic_sampling/rounds"][-1] >= 2 or skipping
    image_processor = trainer.processing_class.image_processor
    per_row = split_pixel_values_by_grid(batch)["pixel_values"]
    for prompt, pixels in zip(row_prompts, per_row, strict=True):
        torch.testing.assert_close(pixels, image_processor(prompt_image(prompt), return_tensors="pt")["pixel_values"])


VLM_ANSWERS = ["5 x", "4", "5", "2 yy"]  # the tiny VLM's reward: "1+1=" always right, else odd first character


# ---------------------------------------------------------------------------------------------------------------
# Streaming datasets: refills read the stream; the skip history is keyed by hashed prompts
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["grpo", "rloo"])
def test_streaming_refills_take_the_rows_that_follow_in_the_stream(make_trainer, kind):
    """An IterableDataset (unshuffled): the refill rounds take the stream's rows in order, the tied group is
    replaced, and the stream's position is the count of rows read (what a checkpoint stores)."""
    trainer = make_trainer(kind, prompts=DATA, streaming=True, shuffle_dataset=False, **DYNAMIC)
    batch = train_batch(trainer, ["1+1=", "2+3="], tied_or_informative)
    assert group_prompts(trainer, batch) == ["2+3=", "2+3="]  # the dataloader's, then the stream's 2nd row
    assert trainer.zero_std.refiller.stream.state_dict() == {"epoch": 0, "position": 2}  # round 2 read "1+1=", "2+3="
    batch = train_batch(trainer, ["1+1=", "1+1="], tied_or_informative)
    assert (
        group_prompts(trainer, batch) == ["4+4=", "3+5="]
        and trainer.zero_std.refiller.stream.state_dict()["position"] == 4
    )


def test_streaming_skip_history_is_keyed_by_the_prompt(make_trainer):
    """Prompt skipping on a stream: outcomes are recorded under the hashed prompt, so a later draw of the same text
    (another pass, or a duplicate row) is skipped by them; nothing is indexed by row."""
    trainer = make_trainer(prompts=DATA, streaming=True, shuffle_dataset=False, skip_zero_std_prompts=True, **DYNAMIC)
    train_batch(trainer, ["2+3=", "4+4="], tied_or_informative)  # the stream's first prompt, "1+1=", is tied
    skipper = trainer.zero_std.skipper
    assert skipper.hashed is not None and skipper.slots is None
    key = torch.tensor([history_key("1+1=")])
    assert bool(skipper.hashed.known(key)) and skipper.draw_prob(key).item() < 1.0
    slot = skipper.hashed.slots(key)
    assert skipper.rates.successes[slot].item() == skipper.rates.rows[slot].item() == 4.0
    assert skipper.rates.one_sided[slot].item() == 4.0 and not skipper.rates.split[slot].item()  # tied high
    assert trainer._metrics["train"]["prompt_skip/hash_evictions"][-1] == 0


@pytest.mark.every_trl
def test_streaming_skipping_gives_a_skipped_prompts_place_to_the_next_row(make_trainer):
    """Prompt skipping alone on a stream: "1+1=" (the stream's first row, hashed) is skipped and its place goes to
    the next row drawn; both groups generate and train, and the stream moved by the three rows it read."""
    trainer = make_trainer(prompts=DATA, streaming=True, shuffle_dataset=False, **SKIP)
    tied = history_key("1+1=")
    trainer.zero_std.skipper.draw_prob = lambda keys: (keys != tied).double()
    batch = train_batch(trainer, ["1+1=", "1+1="], tied_or_informative)
    assert group_prompts(trainer, batch) == ["2+3=", "4+4="]
    assert batch["completion_mask"].view(2, 4, -1).sum(dim=(1, 2)).min() > 0
    assert trainer.zero_std.refiller.stream.state_dict()["position"] == 3
    assert trainer._metrics["train"]["prompt_skip/skipped_frac"][-1] == pytest.approx(1 / 3)


def test_streaming_skipping_names_a_missing_key_field(make_trainer):
    trainer = make_trainer(
        prompts=DATA, streaming=True, skip_zero_std_prompts=True, skip_history_key="level", **DYNAMIC
    )
    with pytest.raises(ValueError, match="'level' field of each streamed row"):
        train_batch(trainer, ["2+3=", "4+4="], tied_or_informative)


# ---------------------------------------------------------------------------------------------------------------
# environment_factory: episodes through TRL's tool loop, refilled
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.every_trl
@pytest.mark.parametrize("skipping", [False, True])
def test_environment_episodes_refill_with_their_environments(tiny_tool_model_dir, tmp_path, skipping):
    """environment_factory with dynamic sampling (and prompt skipping): the refill rounds' prompts get their
    environment's observation, each rollout's tool call reaches its own environment, and the batch that trains holds
    the informative "coin" groups only, with the environment's rewards."""
    from datasets import Dataset
    from transformers import PreTrainedTokenizerFast

    from trl_zerostd import ZeroStdGRPOConfig, ZeroStdGRPOTrainer

    dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": f"task {t}"}] for t in TASKS], "task": TASKS})
    args = ZeroStdGRPOConfig(
        output_dir=str(tmp_path), per_device_train_batch_size=8, num_generations=4, max_completion_length=96,
        max_steps=1, report_to="none", use_cpu=True, bf16=False, seed=0, shuffle_dataset=False,
        skip_zero_std_prompts=skipping, **DYNAMIC,
    )  # fmt: skip
    trainer = ZeroStdGRPOTrainer(
        model=tiny_tool_model_dir, reward_funcs=[], args=args, train_dataset=dataset,
        processing_class=PreTrainedTokenizerFast.from_pretrained(tiny_tool_model_dir),
        environment_factory=SubmitEnvironment,
    )  # fmt: skip
    stub_generation(trainer, submit_calls)
    trainer.model.train()
    rows = [dict(dataset[i]) for i in (0, 1) for _ in range(4)]  # "win" and "lose": both tied
    batch = trainer._generate_and_score_completions(rows)
    prompts = trainer.processing_class.batch_decode(batch["prompt_ids"], skip_special_tokens=True)
    assert all("[coin" in prompt for prompt in prompts)
    assert trainer._metrics["train"]["zero_std/masked_group_frac"][-1] == 0.0
    rewards = trainer._metrics["train"]["rewards/SubmitEnvironment/mean"][-1]
    assert rewards == 0.5 and (batch["advantages"] != 0).all()
    assert trainer._metrics["train"]["dynamic_sampling/rounds"][-1] >= 2 or skipping


@pytest.mark.parametrize("engine,feature", [("hf", "dynamic"), ("hf", "skipping"), ("hf", "dynamic_skipping"),
                                            ("server", "dynamic_skipping")])  # fmt: skip
def test_each_rollout_resets_its_environment_once_and_logs_its_own_prompt(tiny_tool_model_dir, tmp_path, engine,
                                                                          feature):  # fmt: skip
    """A refill with a stateful environment over 3 training steps, one process (two: tests/launch/test_episodes.py):
    one reset per rollout generated (as TRL's own trainer), every rollout scored from the episode it ran in, and
    TRL's completions log holds each trained row's completion beside the prompt (episode) it was generated for."""
    from tests.launch.episode_worker import GLOBAL_BATCH, STEPS, run_episodes

    result = run_episodes(tiny_tool_model_dir, str(tmp_path), engine, feature)
    assert_episodes_kept([result])
    assert (len(result["rewarded"]) > GLOBAL_BATCH * STEPS) == feature.startswith("dynamic")  # more generated


def assert_episodes_kept(results: list[dict]) -> None:
    """Per rank: resets equal rollouts scored, each scored from its own episode, and no instance reset again while it
    holds a rollout of the batch (each keeps its rollout's state until the batch is logged); the completions log
    (every rank's rows, gathered) pairs each completion with its own prompt, batch after batch."""
    from tests.launch.episode_worker import GLOBAL_BATCH, STEPS

    for result in results:
        assert result["resets"] == len(result["rewarded"]) > 0 and result["reset_twice_in_a_batch"] == 0
        assert all(drawn == named for drawn, named in result["rewarded"])
        assert len(result["logged"]) == GLOBAL_BATCH * STEPS
        assert result["reward_entries"] == [1] * STEPS  # a dropped round's metrics never reach TRL's store
        assert all(prompt == completion for prompt, completion in result["logged"]), result["logged"]


def test_prompt_skipping_refuses_an_environment_that_makes_every_prompt(tiny_tool_model_dir, tmp_path):
    """With no train_dataset the environment's reset() makes every prompt (TRL fills in placeholder rows): there is
    no prompt to keep a history of, and the error says so; dynamic sampling alone is accepted."""
    from transformers import PreTrainedTokenizerFast

    from trl_zerostd import ZeroStdGRPOConfig, ZeroStdGRPOTrainer

    def build(**features):
        args = ZeroStdGRPOConfig(
            output_dir=str(tmp_path), per_device_train_batch_size=8, num_generations=4, max_steps=1,
            report_to="none", use_cpu=True, bf16=False, **features,
        )  # fmt: skip
        return ZeroStdGRPOTrainer(
            model=tiny_tool_model_dir, reward_funcs=[], args=args,
            processing_class=PreTrainedTokenizerFast.from_pretrained(tiny_tool_model_dir),
            environment_factory=SubmitEnvironment,
        )  # fmt: skip

    assert build(dynamic_sampling=True).zero_std.skipper is None
    with pytest.raises(ValueError, match="skip_zero_std_prompts needs a train_dataset that names its prompts"):
        build(dynamic_sampling=True, skip_zero_std_prompts=True)
