"""The tiny models trained on the synthetic world (core.world), shipped inside the package.

`WORLD_SIGLIP` is a SigLIP model directory (save_pretrained: config, safetensors weights,
tokenizer, processor) that `models.siglip.SiglipScorer` loads as it loads a hub checkpoint;
`WORLD_YOLO` an ultralytics `.pt` checkpoint of the world's shapes that `models.detectors`'
"yolo" kind loads as any YOLO file. Each folder holds the `training.json` of its figures on a
held-out world and the command that reproduces them (scripts/train_world_siglip.py,
scripts/train_world_yolo.py). They know only the world: coloured circles, squares, triangles and
stars on dull backgrounds, and its junk scenes.
"""

from __future__ import annotations

from pathlib import Path

WORLD_MODELS = Path(__file__).resolve().parent / "world"
WORLD_SIGLIP = WORLD_MODELS / "siglip"
WORLD_YOLO = WORLD_MODELS / "yolo" / "world-yolov8.pt"
