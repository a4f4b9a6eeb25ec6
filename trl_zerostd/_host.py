"""What the adapter's mixins (``_generation.GenerationSide``, ``_adapter.ZeroStdAdapter``) read from the trainer they
are mixed into, for the type checker only: a TRL 1.16 ``GRPOTrainer`` or ``RLOOTrainer`` (a transformers ``Trainer``)
implementing the package's hooks (``_hooks.TrainerHooks``).

At run time ``TrainerHost`` is ``object``, so the mixins' method resolution order is unchanged: ``super()`` in a mixin
reaches TRL's trainer, placed after the adapter (``class ZeroStdGRPOTrainer(ZeroStdAdapter, GRPOTrainer)``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase, Trainer
    from trl import GRPOConfig, RLOOConfig

    from ._hooks import TrainerHooks

    class TrainerHost(Trainer, TrainerHooks):
        """The attributes and methods common to TRL 1.16's ``GRPOTrainer`` and ``RLOOTrainer`` that the mixins use
        (``Trainer``'s own come from its class)."""

        args: GRPOConfig | RLOOConfig
        num_generations: int | None  # TRL's config types (it sets both)
        shuffle_dataset: bool | None
        use_vllm: bool
        vllm_mode: str
        mask_truncated_completions: bool
        eos_token_ids: list[int]
        reward_func_names: list[str]
        _tokenizer: PreTrainedTokenizerBase

        def _generate(self, prompts: list) -> tuple: ...

        def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]: ...

        def _calculate_rewards(
            self, inputs: list[dict], prompts: list, completions: list, completion_ids_list: list[list[int]]
        ) -> torch.Tensor: ...

        def _get_per_token_logps_and_entropies(self, *args: Any, **kwargs: Any) -> Any: ...

        def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> torch.Tensor: ...

else:
    TrainerHost = object
