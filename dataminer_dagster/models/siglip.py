"""SigLIP / SigLIP2 prompt scoring for frames on disk.

`SiglipScorer` embeds prompts and frames with a transformers SiglipModel (the fixed-resolution
SigLIP2 checkpoints such as google/siglip2-so400m-patch14-384) or Siglip2Model (the naflex
checkpoints) and turns them into per-prompt probabilities. Its frames are embedded as
`image_embedder.ImageEmbedder` embeds them (batched, prefetched, decoded on the GPU where it can).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from dataminer_dagster.models.image_embedder import (
    ImageEmbedder,
    normalised_numpy,
    pooled_features,
)

# SigLIP2 was trained on prompts padded to 64 tokens; the text tower has 64 positions.
TEXT_MAX_LENGTH = 64


def sigmoid_scores(
    image_embeddings: np.ndarray,
    text_embeddings: np.ndarray,
    *,
    logit_scale: float,
    logit_bias: float,
) -> np.ndarray:
    """SigLIP probabilities sigmoid(img @ txt.T * exp(logit_scale) + logit_bias), shape (N, P).

    Both embedding sets must already be L2-normalised. Computed in float32, in a form that neither
    overflows nor loses precision for large negative logits.
    """
    image = np.asarray(image_embeddings, dtype=np.float32)
    text = np.asarray(text_embeddings, dtype=np.float32)
    if image.ndim != 2 or text.ndim != 2 or image.shape[1] != text.shape[1]:
        raise ValueError(
            f"embeddings must be (N, D) and (P, D) with the same D, got {image.shape} and {text.shape}"
        )
    logits = image @ text.T * np.float32(np.exp(logit_scale)) + np.float32(logit_bias)
    small = np.exp(-np.abs(logits))  # in (0, 1]: never overflows
    return np.where(logits >= 0, 1 / (1 + small), small / (1 + small)).astype(np.float32)


class SiglipScorer(ImageEmbedder):
    """SigLIP / SigLIP2 prompt probabilities for frames.

    Scores are sigmoid(img @ txt.T * exp(logit_scale) + logit_bias) on L2-normalised embeddings,
    in float32, as the reference system computed them.
    """

    processor_class_name = "AutoProcessor"

    def __init__(self, model_ref: str | os.PathLike[str], **options: Any):
        """`options` as for ImageEmbedder: device, dtype, batch_size, prefetch_workers, revision."""
        super().__init__(model_ref, **options)
        missing = [
            name
            for name in ("get_text_features", "get_image_features", "logit_scale", "logit_bias")
            if not hasattr(self.model, name)
        ]
        if missing or not hasattr(self.loaded.processor, "tokenizer"):
            raise ValueError(
                f"Model {self.loaded.source.reference} ({type(self.model).__name__}) is not a "
                "SigLIP image-text model: it lacks "
                + ", ".join(missing or ["a tokenizer in its processor"])
            )
        self.logit_scale = float(self.model.logit_scale.detach().float().cpu().reshape(-1)[0])
        self.logit_bias = float(self.model.logit_bias.detach().float().cpu().reshape(-1)[0])
        text_positions = getattr(self.model.config.text_config, "max_position_embeddings", None)
        self.text_max_length = min(TEXT_MAX_LENGTH, text_positions or TEXT_MAX_LENGTH)

    def embed_texts(self, prompts: Sequence[str]) -> np.ndarray:
        """(P, D) L2-normalised float32 embeddings of the lower-cased prompts."""
        import torch

        if isinstance(prompts, str):
            raise TypeError("embed_texts takes a sequence of prompts, not a single string")
        tokenizer = self.loaded.processor.tokenizer
        rows = [np.zeros((0, self.embedding_dim), np.float32)]
        for start in range(0, len(prompts), self.batch_size):
            texts = [prompt.lower() for prompt in prompts[start : start + self.batch_size]]
            tokens = tokenizer(
                texts,
                padding="max_length",
                max_length=self.text_max_length,
                truncation=True,
                return_tensors="pt",
            )
            with torch.inference_mode():
                inputs = {
                    key: tokens[key].to(self.device)
                    for key in ("input_ids", "attention_mask")
                    if key in tokens
                }
                features = pooled_features(self.model.get_text_features(**inputs))
                rows.append(normalised_numpy(features))
        return np.concatenate(rows)

    def cut_prompts(self, prompts: Sequence[str]) -> dict[str, int]:
        """The prompts longer than the text tower reads (text_max_length tokens), with their
        length in tokens: embed_texts ignores what follows the cut."""
        tokenizer = self.loaded.processor.tokenizer
        lengths = [
            len(ids)
            for ids in tokenizer([p.lower() for p in prompts], truncation=False)["input_ids"]
        ]
        return {
            prompt: length
            for prompt, length in zip(prompts, lengths, strict=True)
            if length > self.text_max_length
        }

    def score(self, image_embeddings: np.ndarray, text_embeddings: np.ndarray) -> np.ndarray:
        """(N, P) probabilities in [0, 1] for N image and P prompt embeddings."""
        return sigmoid_scores(
            image_embeddings,
            text_embeddings,
            logit_scale=self.logit_scale,
            logit_bias=self.logit_bias,
        )

    def _image_features(self, inputs: dict[str, Any]) -> Any:
        return pooled_features(self.model.get_image_features(**inputs))
