"""Tiny models built locally for the tests: vision-language models in TRL's two image layouts, a mixture of experts
and a model whose tokenizer has Qwen3's chat template for tools (the char-level Qwen2 itself:
``demo.tiny_model``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from demo.tiny_model import build_model, build_tokenizer


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


def save_tiny_moe_model(tokenizer, path: str) -> str:
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
    Qwen2MoeForCausalLM(config).save_pretrained(path)
    return path


# A tiny model for environment_factory and tools: every printable ASCII character is a token, plus Qwen3's chat
# special tokens and its chat template (which TRL can parse tool calls from).
TOOL_SPECIAL_TOKENS = ["<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<tool_response>",
                       "</tool_response>", "<think>", "</think>"]  # fmt: skip


def save_tiny_tool_model(path: str) -> str:
    """The tool model and its tokenizer, saved to ``path``."""
    import string

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
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
