"""The pure part of ``trl_zerostd/trainer/engine.py``: how many copies a server request may ask for, how a round is cut
into calls, and what makes two rows' prompts the same."""

from PIL import Image

from trl_zerostd.trainer.engine import aligned_copies, engine_calls, prompt_key

A, B, C = [1, 2], [3], [4, 5, 6]


def test_trls_own_batch_asks_for_every_copy():
    assert aligned_copies([A] * 4 + [B] * 4, 4) == 4


def test_a_round_asks_for_the_largest_aligned_block():
    assert aligned_copies([A, A, B, B], 4) == 2  # a screen of 2
    assert aligned_copies([A, A, A, B, B, B], 4) == 3  # no more than the prompts hold
    assert aligned_copies([A, A, B, B, B, B], 4) == 2  # blocks must divide the rows evenly
    assert aligned_copies([A, B, A, B], 4) == 1
    assert aligned_copies([A, A, A, A, C, C, C, C], 2) == 2  # never more than asked


def test_calls_never_exceed_the_engine_size():
    assert engine_calls(16, 8) == [slice(0, 8), slice(8, 16)]
    assert engine_calls(12, 8) == [slice(0, 8), slice(8, 12)]
    assert engine_calls(8, 8) == [slice(0, 8)]


def test_images_of_one_size_with_other_pixels_are_other_prompts():
    red, blue = Image.new("RGB", (8, 8), (200, 0, 0)), Image.new("RGB", (8, 8), (0, 0, 200))
    assert prompt_key(A, None) == prompt_key(A, []) == tuple(A)
    assert prompt_key(A, [red]) == prompt_key(A, [red.copy()])
    assert prompt_key(A, [red]) != prompt_key(A, [blue])
    assert aligned_copies([prompt_key(A, [red])] * 2 + [prompt_key(A, [blue])] * 2, 4) == 2
