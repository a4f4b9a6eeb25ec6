"""One tiny-model fixture for every test: a local Qwen2 of ~85k parameters, a character tokenizer, stub generation.

``make_trainer`` builds any of the four trainers on the same model weights and data, so a test can run TRL's
trainer and ours on the same batch. ``stub_generation`` replaces only TRL's token generation on the instance (and
``stub_rollout`` goes through TRL's ``rollout_func``), so a test chooses every completion exactly.
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass

import pytest
import torch
from datasets import Dataset
from tiny_model import build_tokenizer, save_tiny_model
from transformers import AutoModelForCausalLM
from trl import GRPOConfig, GRPOTrainer, RLOOConfig, RLOOTrainer

from trl_zerostd import ZeroStdGRPOConfig, ZeroStdGRPOTrainer, ZeroStdRLOOConfig, ZeroStdRLOOTrainer
from trl_zerostd.config import ZERO_STD_FIELDS

LOSS_TYPES = ["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo"]  # TRL 1.16's GRPO losses
PROMPTS = ["1+1=", "2+3=", "4+4=", "3+5=", "2+2=", "1+6=", "5+3=", "7+1="]

# The regression batch. Group 1 ("1+1=") is tied: every completion is right. Group 2 ("2+3=") is informative: two
# right, two wrong. Lengths differ so that every token and row normaliser, and each row's KL, matters.
TIED = ["2", "2 a", "2 bb", "2"]
INFORMATIVE = ["5 x", "3", "5", "9 yy"]
MIXED_PROMPTS = ["1+1=", "2+3="]

BASE_CLASSES = {"grpo": (GRPOTrainer, GRPOConfig), "rloo": (RLOOTrainer, RLOOConfig)}
OUR_CLASSES = {"grpo": (ZeroStdGRPOTrainer, ZeroStdGRPOConfig), "rloo": (ZeroStdRLOOTrainer, ZeroStdRLOOConfig)}


@pytest.fixture(scope="session")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    return save_tiny_model(str(tmp_path_factory.mktemp("tiny") / "model"))


# Tiny vision-language models, built locally, in the two layouts TRL handles differently: LLaVA (CLIP vision tower,
# Qwen2 text model; pixel values one row per image) and Qwen2-VL (pixel values flat over patches, image_grid_thw per
# image). The char tokenizer gains the image tokens; the chat template renders image parts as them, and the
# processor expands them to the image's tokens.
def vlm_chat_template(image_part: str) -> str:
    return (
        "{% for m in messages %}{% if m['content'] is string %}{{ m['content'] }}{% else %}"
        "{% for p in m['content'] %}{% if p['type'] == 'image' %}"
        + image_part
        + "{% else %}{{ p['text'] }}{% endif %}"
        "{% endfor %}{% endif %}{% endfor %}"
    )


@dataclass(frozen=True)
class TinyVLM:
    """A saved tiny VLM and its processor (TRL loads the reference model from ``path``)."""

    path: str
    processor: object


def tiny_llava(path: str) -> TinyVLM:
    from transformers import (
        CLIPImageProcessorPil,
        CLIPVisionConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
    )

    template = vlm_chat_template("<image>")
    tokenizer = build_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": ["<image>"]})
    tokenizer.chat_template = template
    processor = LlavaProcessor(
        image_processor=CLIPImageProcessorPil(size={"shortest_edge": 8}, crop_size={"height": 8, "width": 8}),
        tokenizer=tokenizer, patch_size=4, vision_feature_select_strategy="default", num_additional_image_tokens=1,
        chat_template=template,
    )  # fmt: skip
    vision = CLIPVisionConfig(
        hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=8, patch_size=4
    )
    config = LlavaConfig(
        vision_config=vision, text_config=tiny_text_config(tokenizer), vision_feature_select_strategy="default",
        image_token_index=tokenizer.convert_tokens_to_ids("<image>"), vision_feature_layer=-1,
    )  # fmt: skip
    return save_vlm(LlavaForConditionalGeneration, config, tokenizer, processor, path)


def tiny_qwen2vl(path: str) -> TinyVLM:
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration, Qwen2VLImageProcessorPil, Qwen2VLProcessor
    from transformers.processing_utils import ProcessorMixin

    class ImageOnlyQwen2VLProcessor(Qwen2VLProcessor):
        """Qwen2-VL's processor without its video processor (which needs torchvision)."""

        @classmethod
        def get_attributes(cls):
            return ["image_processor", "tokenizer"]

        def __init__(self, image_processor, tokenizer, chat_template=None):
            self.image_token, self.video_token = "<|image_pad|>", "<|video_pad|>"
            self.image_token_id = tokenizer.convert_tokens_to_ids(self.image_token)
            self.video_token_id = tokenizer.convert_tokens_to_ids(self.video_token)
            ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template)

    template = vlm_chat_template("<|vision_start|><|image_pad|><|vision_end|>")
    tokenizer = build_tokenizer()
    tokenizer.add_special_tokens(
        {"additional_special_tokens": ["<|vision_start|>", "<|image_pad|>", "<|vision_end|>", "<|video_pad|>"]}
    )
    tokenizer.chat_template = template
    image_processor = Qwen2VLImageProcessorPil(min_pixels=28 * 28, max_pixels=4 * 28 * 28)  # 28x28: 4 patches
    processor = ImageOnlyQwen2VLProcessor(image_processor, tokenizer, chat_template=template)
    text = tiny_text_config(tokenizer).to_dict() | {"rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]}}
    token_ids = {
        f"{name}_token_id": tokenizer.convert_tokens_to_ids(token)
        for name, token in [("image", "<|image_pad|>"), ("video", "<|video_pad|>"),
                            ("vision_start", "<|vision_start|>"), ("vision_end", "<|vision_end|>")]
    }  # fmt: skip
    vision = dict(depth=1, embed_dim=16, hidden_size=32, num_heads=2, mlp_ratio=2, patch_size=14, spatial_merge_size=2)
    config = Qwen2VLConfig(text_config=text, vision_config=vision, **token_ids)
    return save_vlm(Qwen2VLForConditionalGeneration, config, tokenizer, processor, path)


def tiny_text_config(tokenizer):
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=128, pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id, bos_token_id=None,
    )  # fmt: skip


def save_vlm(model_cls, config, tokenizer, processor, path: str) -> TinyVLM:
    torch.manual_seed(0)
    model = model_cls(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(path)
    return TinyVLM(path, processor)


@pytest.fixture(scope="session", params=["llava", "qwen2vl"])
def tiny_vlm(request, tmp_path_factory) -> TinyVLM:
    build = {"llava": tiny_llava, "qwen2vl": tiny_qwen2vl}[request.param]
    return build(str(tmp_path_factory.mktemp(request.param) / "model"))


@pytest.fixture(scope="session")
def tiny_moe_model(tokenizer, tmp_path_factory):
    """A tiny Qwen2-MoE (4 experts, 2 per token) whose load-balancing auxiliary loss TRL adds to the loss; saved,
    since TRL loads the reference model from the policy's path."""
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

    config = Qwen2MoeConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
        shared_expert_intermediate_size=16, num_experts=4, num_experts_per_tok=2, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=128, router_aux_loss_coef=0.5,
        output_router_logits=True, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    path = str(tmp_path_factory.mktemp("moe") / "model")
    Qwen2MoeForCausalLM(config).save_pretrained(path)
    return AutoModelForCausalLM.from_pretrained(path)


@pytest.fixture(scope="session")
def base_model(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir)


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


@pytest.fixture
def make_trainer(tokenizer, base_model, tmp_path):
    """``make_trainer(kind, ours=True, reward_funcs=..., **config)`` -> a trainer on a fresh copy of the model
    (``streaming``: the train set as an ``IterableDataset``)."""

    def make(
        kind="grpo", ours=True, reward_funcs=answer_reward, prompts=PROMPTS, model=None, peft_config=None,
        streaming=False, **config,
    ):  # fmt: skip
        trainer_cls, config_cls = (OUR_CLASSES if ours else BASE_CLASSES)[kind]
        settings = dict(
            output_dir=str(tmp_path / ("ours" if ours else "base")),
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
        )

    return make


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


# A tiny model for environment_factory and tools: every printable ASCII character is a token, plus Qwen3's chat
# special tokens and its chat template (which TRL can parse tool calls from).
TOOL_SPECIAL_TOKENS = ["<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<tool_response>",
                       "</tool_response>", "<think>", "</think>"]  # fmt: skip


@pytest.fixture(scope="session")
def tiny_tool_model_dir(tmp_path_factory):
    import string

    from tiny_model import build_model
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from trl.chat_template_utils import qwen3_chat_template

    vocab = {token: i for i, token in enumerate(["<pad>", *dict.fromkeys(string.printable)])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>")
    tokenizer.add_special_tokens({"additional_special_tokens": TOOL_SPECIAL_TOKENS})
    tokenizer.eos_token = "<|im_end|>"
    tokenizer.chat_template = qwen3_chat_template
    model = build_model(tokenizer, hidden_size=32, num_heads=2)
    model.config.max_position_embeddings = 1024
    path = str(tmp_path_factory.mktemp("tools") / "model")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
