"""The `models` resource: the models of the filter, dedup and detect stages, built from their config
sections. The weights are loaded once per process and kept for the runs that follow, in the
process's `ModelCache` (models/loading.py): Dagster makes a run's resources for that run, while
`dataminer run` and the in-process executor run many runs in one process, and loading a model takes
seconds to minutes. torch and the model libraries are imported when a model is first asked for."""

from __future__ import annotations

from typing import TYPE_CHECKING

import dagster as dg

if TYPE_CHECKING:
    from dataminer_dagster.assets.dedup.config import DedupConfig
    from dataminer_dagster.assets.detect.config import DetectConfig
    from dataminer_dagster.assets.filter.config import FilterConfig
    from dataminer_dagster.models.detectors import Detector
    from dataminer_dagster.models.image_embedder import ImageEmbedder
    from dataminer_dagster.models.siglip import SiglipScorer


class ModelsResource(dg.ConfigurableResource):
    """The models a project's config names; a test or a location may put its own in its place."""

    def scorer(self, config: FilterConfig) -> SiglipScorer:
        """The filter's SigLIP2 scorer (the dedup stage embeds with it too when it reuses the
        filter's embeddings)."""
        from dataminer_dagster.models.siglip import SiglipScorer

        return SiglipScorer(config.model, device=config.device, batch_size=config.batch_size)

    def embedder(self, config: DedupConfig) -> ImageEmbedder:
        """The dedup stage's own image embedder (`dedup.embeddings: model`, DINOv2 by default)."""
        from dataminer_dagster.models.image_embedder import ImageEmbedder

        return ImageEmbedder(config.model, device=config.device)

    def detector(self, config: DetectConfig) -> Detector:
        """The detect stage's detector: YOLO for its classes, or an open-vocabulary one for its
        prompts."""
        from dataminer_dagster.models.detectors import load_detector

        return load_detector(
            config.detector,
            config.model,
            classes=config.classes or None,
            prompts=config.prompts or None,
            confidence=config.confidence,
            device=config.device,
            batch_size=config.batch_size,
        )
