"""Image preprocessing with Pillow + NumPy (no torchvision), reading and writing the Hugging Face
``preprocessor_config.json`` keys of ``CLIPImageProcessor`` so a user's downloaded CLIP works
unchanged: resize the shortest edge (bicubic), centre crop, scale to [0, 1], normalise.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from PIL import Image

from ..data.images import open_rgb, to_rgb
from .base import ImageInput

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


@dataclass
class ImagePreprocessor:
    size: int = 224
    crop: int = 224
    mean: tuple[float, float, float] = CLIP_MEAN
    std: tuple[float, float, float] = CLIP_STD

    @classmethod
    def from_dir(cls, directory: str | Path, default_size: int) -> "ImagePreprocessor":
        path = Path(directory) / "preprocessor_config.json"
        if not path.is_file():
            return cls(size=default_size, crop=default_size)
        try:
            cfg = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: invalid JSON: {e}") from None
        size = cfg.get("size", default_size)
        size = size.get("shortest_edge", size.get("height", default_size)) if isinstance(size, dict) else size
        crop = cfg.get("crop_size", size)
        crop = crop.get("height", size) if isinstance(crop, dict) else crop
        return cls(size=int(size), crop=int(crop), mean=tuple(cfg.get("image_mean", CLIP_MEAN)),
                   std=tuple(cfg.get("image_std", CLIP_STD)))

    def save(self, directory: str | Path) -> None:
        cfg = {
            "image_processor_type": "CLIPImageProcessor", "do_resize": True,
            "size": {"shortest_edge": self.size}, "do_center_crop": True,
            "crop_size": {"height": self.crop, "width": self.crop}, "do_rescale": True,
            "rescale_factor": 1 / 255, "do_normalize": True, "image_mean": list(self.mean),
            "image_std": list(self.std), "do_convert_rgb": True, "resample": 3,
        }
        (Path(directory) / "preprocessor_config.json").write_text(json.dumps(cfg, indent=2))

    def to_array(self, image: ImageInput) -> np.ndarray:
        """One image as uint8 ``(crop, crop, 3)``, read as a person sees it
        (:func:`~nobackfill.data.images.to_rgb`: upright, transparency on white, 16-bit scaled)."""
        if isinstance(image, np.ndarray):
            if self._is_final(image):
                return image
            image = Image.fromarray(image)
        if isinstance(image, Image.Image):
            image = to_rgb(image)
        else:
            image = open_rgb(image)  # ImageReadError (a ValueError) names an unreadable file
        w, h = image.size
        if min(w, h) != self.size:
            # the output size of transformers' CLIPImageProcessor (shortest edge; the long edge
            # is truncated, not rounded)
            if w <= h:
                new = (self.size, int(self.size * h / w))
            else:
                new = (int(self.size * w / h), self.size)
            image = image.resize((max(1, new[0]), max(1, new[1])), Image.BICUBIC)
        w, h = image.size
        if (w, h) != (self.crop, self.crop):
            left, top = (w - self.crop) // 2, (h - self.crop) // 2
            image = image.crop((left, top, left + self.crop, top + self.crop))
        return np.asarray(image, dtype=np.uint8)

    def _is_final(self, arr: np.ndarray) -> bool:
        """Whether uint8 ``arr`` (one HWC image or an NHWC batch) needs no resize or crop."""
        return (arr.dtype == np.uint8 and arr.ndim >= 3 and arr.shape[-3:] == (self.crop, self.crop, 3)
                and self.size == self.crop)

    def __call__(self, images: Sequence[ImageInput] | np.ndarray) -> torch.Tensor:
        """A batch as normalised float32 ``(N, 3, crop, crop)``."""
        if isinstance(images, np.ndarray) and images.ndim == 4:
            arr = images if self._is_final(images) else np.stack([self.to_array(i) for i in images])
        else:
            arr = np.stack([self.to_array(i) for i in images])
        x = torch.from_numpy(np.ascontiguousarray(arr)).permute(0, 3, 1, 2).float().div_(255.0)
        mean = torch.tensor(self.mean, dtype=torch.float32).view(1, 3, 1, 1)
        std = torch.tensor(self.std, dtype=torch.float32).view(1, 3, 1, 1)
        return (x - mean) / std
