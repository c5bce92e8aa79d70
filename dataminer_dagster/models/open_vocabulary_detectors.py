"""The open-vocabulary detectors of transformers, ``owlv2`` and ``grounding_dino``: one category
per text prompt, their image processors and post-processing run on the device."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from dataminer_dagster.core.coco import Detection
from dataminer_dagster.models.batched_detector import BatchedDetector
from dataminer_dagster.models.detection_boxes import to_detections, to_host
from dataminer_dagster.models.device import DevicePlan, to_device
from dataminer_dagster.models.loading import ModelLoadError, load_pretrained

if TYPE_CHECKING:
    import torch

# Open-vocabulary detectors predict one box per query (OWLv2: per image patch, Grounding DINO: per
# decoder query) and do no suppression of their own, so one object comes back several times. Boxes
# of the same category overlapping more than this are merged into the best one.
OPEN_VOCABULARY_NMS_IOU = 0.5


@dataclass(frozen=True)
class _TransformersInput:
    inputs: dict[str, Any]  # the model's keyword arguments, on the device
    sizes: list[tuple[int, int]]  # (height, width) of each frame


def _load_transformers_detector(
    model: str, plan: DevicePlan, model_class: Any, processor_class: Any
) -> Any:
    """The model and its processor, whose image processor must run on device tensors (the
    torchvision backend of transformers 5)."""
    loaded = load_pretrained(
        model,
        device=plan.device,
        dtype=plan.dtype,
        model_class=model_class,
        processor_class=processor_class,
        processor_kwargs={"backend": "torchvision"},
    )
    image_processor = loaded.processor.image_processor
    if not _runs_on_tensors(image_processor):
        raise ModelLoadError(
            f"Model {model!r} came with image processor {type(image_processor).__name__}, which "
            "cannot preprocess on the device; detection needs the torchvision image processors "
            "of transformers 5 (pip install 'transformers>=5')."
        )
    return loaded


def _runs_on_tensors(image_processor: Any) -> bool:
    try:
        from transformers.image_processing_backends import TorchvisionBackend
    except ImportError:  # transformers 4 has no processor backends
        return False
    return isinstance(image_processor, TorchvisionBackend)


def _preprocess_on_device(
    image_processor: Any, frames: Sequence[np.ndarray], plan: DevicePlan
) -> dict[str, Any]:
    """The processor's own resize, pad and normalisation run on the device: the frames are
    copied there once as uint8 and handed to it as tensors, which it keeps where they are."""
    on_device = to_device(frames, plan).permute(0, 3, 1, 2).contiguous()
    return dict(
        image_processor(
            images=list(on_device.unbind(0)),
            input_data_format="channels_first",  # never guessed, even for 3-pixel-wide frames
            return_tensors="pt",
        )
    )


def _model_inputs(
    image_inputs: dict[str, Any], text_inputs: dict[str, Any], frames: int, dtype: torch.dtype
) -> dict[str, Any]:
    """Image inputs (floating ones in the model's dtype) with the text inputs for every frame."""
    inputs = {
        key: value.to(dtype) if value.is_floating_point() else value
        for key, value in image_inputs.items()
    }
    inputs.update({key: value.repeat(frames, 1) for key, value in text_inputs.items()})
    return inputs


class Owlv2Detector(BatchedDetector):
    """transformers OWLv2: every text prompt is a query; a box gets the prompt it matches best."""

    def __init__(
        self,
        model: str,
        prompts: Sequence[str],
        confidence: float,
        plan: DevicePlan,
        batch_size: int | None,
    ):
        from transformers import Owlv2ForObjectDetection, Owlv2Processor

        super().__init__(plan, batch_size)
        loaded = _load_transformers_detector(model, plan, Owlv2ForObjectDetection, Owlv2Processor)
        self.processor, self.model, self.dtype = loaded.processor, loaded.model, loaded.dtype
        tokenizer = self.processor.tokenizer
        lengths = [len(ids) for ids in tokenizer(list(prompts))["input_ids"]]
        too_long = [
            p for p, n in zip(prompts, lengths, strict=True) if n > tokenizer.model_max_length
        ]
        if too_long:
            raise ValueError(
                f"OWLv2 prompts {too_long} are longer than the {tokenizer.model_max_length} tokens "
                f"that model {model!r} reads; shorten them"
            )
        self.labels = list(prompts)
        self.confidence = confidence
        # The prompts' tokens, once: the processor tokenizes them for every frame alike.
        text = self.processor(text=[self.labels], return_tensors="pt")
        self.text_inputs = {
            key: text[key].to(plan.device) for key in ("input_ids", "attention_mask")
        }

    def prepare(self, frames: Sequence[np.ndarray]) -> _TransformersInput:
        images = _preprocess_on_device(self.processor.image_processor, frames, self.plan)
        inputs = _model_inputs(images, self.text_inputs, len(frames), self.dtype)
        return _TransformersInput(inputs, [frame.shape[:2] for frame in frames])

    def run(self, prepared: _TransformersInput) -> list[list[Detection]]:
        import torch

        with torch.inference_mode():
            outputs = self.model(**prepared.inputs)
            # Post-process in float32: fp16 pixel coordinates lose up to 2 px at 4K.
            outputs.logits = outputs.logits.float()
            outputs.pred_boxes = outputs.pred_boxes.float()
            # OWLv2 pads each frame to a square; with (height, width) target sizes the processor
            # scales boxes back to the frame's pixels.
            processed = self.processor.post_process_grounded_object_detection(
                outputs=outputs, threshold=self.confidence, target_sizes=prepared.sizes
            )
            found = to_host([_nms(f["boxes"], f["scores"], f["labels"]) for f in processed])
        return [
            to_detections(
                rows[:, :4],
                rows[:, 4],
                [self.labels[int(k)] for k in rows[:, 5].tolist()],
                size,
                self.confidence,
            )
            for rows, size in zip(found, prepared.sizes, strict=True)
        ]


class GroundingDinoDetector(BatchedDetector):
    """transformers Grounding DINO with the prompts joined into one caption ("cat. red car.").

    The model scores every caption token for every box. A prompt's score for a box is the best
    score over the prompt's own tokens, and the box takes the prompt with the highest score. This
    replaces the processor's decoding of token spans into text, which returns fragments or
    merged prompts ("red car cat") rather than the categories that were asked for.
    """

    def __init__(
        self,
        model: str,
        prompts: Sequence[str],
        confidence: float,
        plan: DevicePlan,
        batch_size: int | None,
    ):
        from transformers import AutoModelForZeroShotObjectDetection, AutoProcessor

        super().__init__(plan, batch_size)
        for prompt in prompts:
            if "." in prompt:
                raise ValueError(
                    f"Grounding DINO prompt {prompt!r} contains '.', which separates prompts in its caption"
                )
        loaded = _load_transformers_detector(
            model, plan, AutoModelForZeroShotObjectDetection, AutoProcessor
        )
        self.processor, self.model, self.dtype = loaded.processor, loaded.model, loaded.dtype
        self.labels = list(prompts)
        self.confidence = confidence
        text_inputs, token_prompt = self._encode_caption(model)
        self.text_inputs = {key: value.to(plan.device) for key, value in text_inputs.items()}
        self.token_prompt = token_prompt.to(plan.device)

    def _encode_caption(self, model: str) -> tuple[dict[str, Any], torch.Tensor]:
        """Tokenize the caption once; map each token to the index of its prompt (-1: none)."""
        import torch

        spans, caption = [], ""
        for prompt in self.labels:
            spans.append((len(caption), len(caption) + len(prompt)))
            caption += prompt + ". "
        caption = caption.rstrip()
        encoded = self.processor.tokenizer(
            caption, return_offsets_mapping=True, return_tensors="pt"
        )
        offsets = encoded.pop("offset_mapping")[0].tolist()
        max_tokens = self.model.config.max_text_len
        if encoded["input_ids"].shape[1] > max_tokens:
            raise ValueError(
                f"The {len(self.labels)} prompts make a caption of {encoded['input_ids'].shape[1]} tokens; "
                f"Grounding DINO model {model!r} reads at most {max_tokens}. Use fewer or shorter prompts."
            )
        token_prompt = torch.full((len(offsets),), -1, dtype=torch.long)
        for t, (start, end) in enumerate(offsets):
            for p, (span_start, span_end) in enumerate(spans):
                if end > start and start >= span_start and end <= span_end:
                    token_prompt[t] = p
        missing = [self.labels[p] for p in range(len(self.labels)) if not (token_prompt == p).any()]
        if missing:
            raise ValueError(f"Grounding DINO's tokenizer produced no tokens for prompts {missing}")
        return dict(encoded), token_prompt

    def prepare(self, frames: Sequence[np.ndarray]) -> _TransformersInput:
        images = _preprocess_on_device(self.processor.image_processor, frames, self.plan)
        inputs = _model_inputs(images, self.text_inputs, len(frames), self.dtype)
        return _TransformersInput(inputs, [frame.shape[:2] for frame in frames])

    def run(self, prepared: _TransformersInput) -> list[list[Detection]]:
        import torch

        tokens = self.token_prompt
        with torch.inference_mode():
            outputs = self.model(**prepared.inputs)
            probs = outputs.logits.float().sigmoid()[
                :, :, : len(tokens)
            ]  # (frames, queries, tokens)
            # Best token score per prompt: (frames, queries, prompts).
            per_prompt = torch.stack(
                [probs[:, :, tokens == p].amax(dim=-1) for p in range(len(self.labels))], dim=-1
            )
            scores, label_ids = per_prompt.max(dim=-1)
            boxes = _cxcywh_to_xyxy(outputs.pred_boxes.float())
            kept = []
            for row, (height, width) in enumerate(prepared.sizes):
                keep = scores[row] >= self.confidence
                scale = torch.tensor([width, height, width, height], device=boxes.device)
                kept.append(_nms(boxes[row][keep] * scale, scores[row][keep], label_ids[row][keep]))
            found = to_host(kept)
        return [
            to_detections(
                rows[:, :4],
                rows[:, 4],
                [self.labels[int(k)] for k in rows[:, 5].tolist()],
                size,
                self.confidence,
            )
            for rows, size in zip(found, prepared.sizes, strict=True)
        ]


def _cxcywh_to_xyxy(boxes: torch.Tensor) -> torch.Tensor:
    import torch

    cx, cy, w, h = boxes.unbind(-1)
    return torch.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], dim=-1)


def _nms(
    boxes: torch.Tensor, scores: torch.Tensor, label_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-category non-maximum suppression (see OPEN_VOCABULARY_NMS_IOU) on the tensors' device,
    in float32; best score first."""
    import torch
    from torchvision.ops import batched_nms

    boxes, scores = boxes.float(), scores.float()
    label_ids = torch.as_tensor(label_ids, dtype=torch.long, device=boxes.device)
    keep = batched_nms(boxes, scores, label_ids, OPEN_VOCABULARY_NMS_IOU)
    return boxes[keep], scores[keep], label_ids[keep]
