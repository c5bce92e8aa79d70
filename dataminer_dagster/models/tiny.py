"""Random-weight models of the real architectures, built offline and saved with save_pretrained.

Tests and the offline demo load these through exactly the code path used for hub weights
(`models.loading.load_pretrained` on a directory). They are deterministic for a given seed and
small enough to build and run in well under a second on a CPU. The embeddings carry no meaning.

* `build_tiny_siglip`: SiglipModel (the fixed-resolution SigLIP2 checkpoints such as
  google/siglip2-so400m-patch14-384) with a Gemma tokenizer and a SiglipProcessor, or with
  `naflex=True` a Siglip2Model with Siglip2Processor (the google/siglip2-*-naflex checkpoints).
* `build_tiny_dinov2`: Dinov2Model with its BitImageProcessor (facebook/dinov2-*).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path

# Tiny towers by default; "world" learns the synthetic world's shapes and colours (core.world) in
# a few thousand steps on a CPU (scripts/train_world_siglip.py; at 80 px its smallest objects
# span about one 10 px patch); "base-patch16-224" is the ViT-B/16 vision tower of
# google/siglip-base-patch16-224, a realistic CPU workload for benchmarks.
SIGLIP_VISION_PRESETS: dict[str, dict[str, int]] = {
    "tiny": dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=32,
        patch_size=8,
    ),
    "world": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        image_size=80,
        patch_size=10,
    ),
    "base-patch16-224": dict(
        hidden_size=768,
        intermediate_size=3072,
        num_hidden_layers=12,
        num_attention_heads=12,
        image_size=224,
        patch_size=16,
    ),
}
SIGLIP_TEXT_PRESETS: dict[str, dict[str, int]] = {
    "tiny": dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        max_position_embeddings=64,
    ),
    "world": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=4,
        max_position_embeddings=32,
    ),
}
# Gemma's special tokens, in Gemma's order.
_SPECIAL_TOKENS = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]
_ALPHABET = "▁abcdefghijklmnopqrstuvwxyz0123456789.,-'/"
# Words that get whole-word BPE merges, so prompts are a few tokens long as with a real tokenizer.
_MERGED_WORDS = [
    "a▁", "of▁", "the▁", "photo▁", "image▁", "picture▁", "close▁", "up▁", "view▁",
    "door", "glass", "window", "wall", "person", "people", "car", "street", "road",
    "dog", "cat", "building", "blurry", "dark", "text", "video", "game", "screen",
]  # fmt: skip


def build_tiny_siglip(
    path: Path,
    *,
    seed: int = 0,
    naflex: bool = False,
    vision_preset: str = "tiny",
    text_preset: str = "tiny",
    words: Sequence[str] = (),
    logit_scale: float = 2.3,
    logit_bias: float = 0.0,
) -> Path:
    """Save a random-weight SigLIP model, its tokenizer and processor under `path`.

    `logit_scale` (log of the temperature, 2.3 ~ x10) and `logit_bias` replace the zero
    initialisation so that scores spread over (0, 1) instead of sitting near 0.5. The presets
    size the towers (SIGLIP_VISION_PRESETS, SIGLIP_TEXT_PRESETS); `words` get whole-word tokens
    besides the built-in ones, so that a vocabulary a model is trained on reads in few tokens.
    """
    import torch
    from transformers import GemmaTokenizer, Siglip2Tokenizer

    for name, value, presets in (
        ("vision_preset", vision_preset, SIGLIP_VISION_PRESETS),
        ("text_preset", text_preset, SIGLIP_TEXT_PRESETS),
    ):
        if value not in presets:
            raise ValueError(f"{name} {value!r} is not one of {', '.join(presets)}")
    vision = dict(SIGLIP_VISION_PRESETS[vision_preset])
    vocab, merges = _tiny_bpe(words)
    text = dict(
        SIGLIP_TEXT_PRESETS[text_preset],
        vocab_size=len(vocab),
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=2,
    )
    text["projection_size"] = vision["hidden_size"]
    tokenizer_class = Siglip2Tokenizer if naflex else GemmaTokenizer
    tokenizer = tokenizer_class(vocab=vocab, merges=merges)

    if naflex:
        from transformers import (
            Siglip2Config,
            Siglip2ImageProcessor,
            Siglip2Model,
            Siglip2Processor,
        )

        image_size, patch_size = vision.pop("image_size"), vision["patch_size"]
        max_patches = (image_size // patch_size) ** 2
        config = Siglip2Config(
            text_config=text, vision_config=dict(vision, num_patches=max_patches)
        )
        image_processor = Siglip2ImageProcessor(patch_size=patch_size, max_num_patches=max_patches)
        processor = Siglip2Processor(image_processor=image_processor, tokenizer=tokenizer)
        model_class = Siglip2Model
    else:
        from transformers import SiglipConfig, SiglipImageProcessor, SiglipModel, SiglipProcessor

        config = SiglipConfig(text_config=text, vision_config=vision)
        size = vision["image_size"]
        image_processor = SiglipImageProcessor(size={"height": size, "width": size})
        processor = SiglipProcessor(image_processor=image_processor, tokenizer=tokenizer)
        model_class = SiglipModel

    with _seeded(seed):
        model = model_class(config).eval()
        with torch.no_grad():
            model.logit_scale.fill_(logit_scale)
            model.logit_bias.fill_(logit_bias)
    return _save(path, model, processor)


def build_tiny_dinov2(path: Path, *, seed: int = 0, image_size: int = 32) -> Path:
    """Save a random-weight Dinov2Model and its image processor (resize, centre crop) under `path`."""
    from transformers import BitImageProcessor, Dinov2Config, Dinov2Model

    config = Dinov2Config(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        mlp_ratio=2,
        image_size=image_size,
        patch_size=8,
    )
    processor = BitImageProcessor(
        size={"shortest_edge": image_size + image_size // 8},
        crop_size={"height": image_size, "width": image_size},
        do_center_crop=True,
        image_mean=[0.485, 0.456, 0.406],
        image_std=[0.229, 0.224, 0.225],
    )
    with _seeded(seed):
        model = Dinov2Model(config).eval()
    return _save(path, model, processor)


def _save(path: Path, model, processor) -> Path:
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    processor.save_pretrained(path)
    return path


@contextlib.contextmanager
def _seeded(seed: int) -> Iterator[None]:
    """Seed torch for the weight initialisation without disturbing the caller's random state."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def _tiny_bpe(words: Sequence[str] = ()) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """A deterministic Gemma-style BPE vocabulary: special tokens, characters, whole-word merges.

    Built by hand rather than trained so that the same seed always gives the same tokenizer.
    Upper-case letters are unknown to it; callers lower-case prompts, as SigLIP2 expects.
    """
    vocab = {token: index for index, token in enumerate(_SPECIAL_TOKENS)}
    for char in _ALPHABET:
        vocab.setdefault(char, len(vocab))
    merges: list[tuple[str, str]] = []
    for word in [*_MERGED_WORDS, *words]:
        for end in range(2, len(word) + 1):
            left, right = word[: end - 1], word[end - 1]
            if word[:end] not in vocab:
                merges.append((left, right))
                vocab[word[:end]] = len(vocab)
    return vocab, merges
