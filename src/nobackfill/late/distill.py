"""Target-CMLI knowledge distillation (the Target-CMLI paper, Eq. 5-8), a :class:`Method` plug-in.

A small student CLIP learns from a larger frozen teacher. As in the seed, the teacher is used as
an *image* model only: every student output regresses teacher image outputs (the teacher's text
tower is never run).

* Global KD (the baseline, "the loss we used before"): the student's global image and text
  embeddings both regress the teacher's global image embedding.
* Eq. 5, ``L_KD^i2t``: global term + the student's image patches regress the teacher's patches
  at the same positions (the patch grids must agree).
* Eq. 6, ``L_KD^t2i``: global term + every student text token regresses the teacher patch it
  matches best (Eq. 2: argmax of the cosine, computed in a shared low-dimensional projection
  of the teacher space; the MSE uses the full outputs). Only the positive pair is matched
  (Target-CMLI), never the ``B x B`` cross product.
* Eq. 7: ``L_KD = (L_KD^i2t + L_KD^t2i) / 2``; global and token terms have equal weight.
* Empty target: a learnable vector in the matching space that every text token is compared with
  besides the patches; a token whose best match is the empty target has zero token loss.
* Eq. 8, ``L_Reg = -log(p)``, ``p`` the share of tokens matched to a real patch, against the
  collapse onto the empty target.

Total: ``L_con(student) + kd_weight * L_KD + reg_weight * L_Reg`` (the seed keeps the contrastive
loss next to KD).

Two details the seed leaves open, decided here: (1) the student (width ``d_s``) is compared
with the teacher (width ``d_t``) through one learned linear head ``d_s -> d_t`` shared by both
towers and all tokens; (2) the argmax routing has no gradient, so the shared matching projection
is a fixed seeded orthonormal map, and the empty target and ``p`` get their gradient through a
straight-through gate: forward = the hard decision (exactly the seed's loss), backward = the
sigmoid of (best patch similarity - empty similarity) / ``gate_temperature``.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F

from .._safetensors import save_tensors
from ..encoders.clip import CLIPDualEncoder
from ..train.contrastive import ContrastivePretraining, info_nce
from .cmli import orthogonal_projection, project_tokens
from .towers import TowerOutputs, encode_towers

__all__ = ["KDConfig", "TargetCMLIDistillation", "KD_MODES", "route_tokens", "empty_target_loss"]

KD_MODES = ("global", "target-cmli")


@dataclass
class KDConfig:
    """Target-CMLI distillation settings. Seed: matching in 256 of 768 dims (a third); ours
    defaults to a quarter of the teacher's width when ``match_dim = 0``."""

    mode: str = "target-cmli"
    empty_target: bool = True
    match_dim: int = 0
    kd_weight: float = 1.0
    #: weight of L_Reg (Eq. 8; the seed gives none). Chosen on val (world-tiny student, 300 steps):
    #: 1.0 switches the empty target off for good (0% of tokens after 100 steps), 0.3 -> 17%,
    #: 0.2 -> 32% (best val R@1 of those below 50%), 0.1 -> 57%, 0.03 -> 84% (collapse)
    reg_weight: float = 0.2
    contrastive_weight: float = 1.0
    #: softness of the straight-through gate's backward pass (0.05 saturated and froze the routing)
    gate_temperature: float = 0.1
    seed: int = 0

    def __post_init__(self) -> None:
        if self.mode not in KD_MODES:
            raise ValueError(f"mode must be one of {KD_MODES}, got {self.mode!r}")
        if self.gate_temperature <= 0:
            raise ValueError(f"gate_temperature must be positive, got {self.gate_temperature}")
        if min(self.kd_weight, self.reg_weight, self.contrastive_weight) < 0:
            raise ValueError("loss weights must be >= 0")

    @property
    def label(self) -> str:
        if self.mode == "global":
            return "global_kd"
        return "target_cmli_empty" if self.empty_target else "target_cmli"


def _sq_err(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Squared L2 distance of the last dimension."""
    return (a - b).pow(2).sum(-1)


def route_tokens(student_tokens: torch.Tensor, text_mask: torch.Tensor, teacher_patches: torch.Tensor,
                 projection: torch.Tensor | None, empty: torch.Tensor | None, gate_temperature: float):
    """Eq. 2 with the empty target: for every student text token the best teacher patch of its own
    image (``index`` ``(B, M)``) and a straight-through gate ``(B, M)``: forward 1 if a patch beats
    the empty target (always 1 without one), backward through
    ``sigmoid((best patch sim - empty sim) / gate_temperature)``; 0 on masked tokens."""
    s = project_tokens(student_tokens, projection)
    t = project_tokens(teacher_patches, projection)
    sim = torch.einsum("bmd,bnd->bmn", s, t)
    best = sim.max(dim=2)  # gradient flows into the best patch's similarity only
    mask = text_mask.to(sim.dtype)
    if empty is None:
        return best.indices, mask
    e_sim = s @ F.normalize(empty, dim=0)
    margin = (best.values - e_sim) / gate_temperature
    soft = torch.sigmoid(margin)
    hard = (margin > 0).to(sim.dtype)
    return best.indices, (hard + soft - soft.detach()) * mask


def empty_target_loss(gate: torch.Tensor, text_mask: torch.Tensor, eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 8: ``L_Reg = -log(p)``, ``p`` = share of valid tokens routed to a real patch. Returns
    ``(L_Reg, p)``."""
    n = text_mask.sum().clamp(min=1)
    p = (gate * text_mask).sum() / n
    return -torch.log(p.clamp(min=eps)), p


class TargetCMLIDistillation(ContrastivePretraining):
    """Train a student :class:`CLIPDualEncoder` with contrastive loss + (Target-CMLI) KD from a
    frozen teacher. Batches are ``(pixels, captions)``."""

    name = "target-cmli-kd"

    def __init__(self, student: CLIPDualEncoder, teacher: CLIPDualEncoder, config: KDConfig | None = None,
                 save_dtype: str = "float32") -> None:
        super().__init__(student, save_dtype=save_dtype)
        self.teacher = teacher
        self.config = cfg = config or KDConfig()
        if not hasattr(getattr(getattr(teacher, "model", None), "config", None), "vision_config"):
            raise ValueError(f"teacher {getattr(teacher, 'name', '')!r} has no image tower (or is no CLIP model of "
                             "this project): Target-CMLI distils its image patches")
        teacher.model.eval().requires_grad_(False)
        s_grid = student.model.config.vision_config
        t_grid = teacher.model.config.vision_config
        if (s_grid.image_size // s_grid.patch_size) != (t_grid.image_size // t_grid.patch_size):
            raise ValueError(f"Eq. 5 needs the same patch grid: student {s_grid.image_size}/{s_grid.patch_size}, "
                             f"teacher {t_grid.image_size}/{t_grid.patch_size}")
        d_s, d_t = student.embed_dim, teacher.embed_dim
        torch.manual_seed(cfg.seed)
        self.head = torch.nn.Linear(d_s, d_t)
        match_dim = cfg.match_dim or max(1, d_t // 4)
        self.projection = orthogonal_projection(d_t, match_dim, seed=cfg.seed)
        self.empty = torch.nn.Parameter(torch.randn(match_dim) / math.sqrt(match_dim)) if cfg.empty_target else None

    # ------------------------------------------------------------------ parameters
    def param_groups(self) -> list[dict]:
        groups = super().param_groups()
        groups[0]["params"].append(self.head.weight)
        groups[-1]["params"].append(self.head.bias)
        if self.empty is not None:
            groups[-1]["params"].append(self.empty)
        return groups

    def train_mode(self, training: bool) -> None:
        super().train_mode(training)
        self.head.train(training)

    def state_dict(self) -> dict:
        state = {**super().state_dict(), "head": self.head.state_dict()}
        if self.empty is not None:
            state["empty"] = self.empty.detach().clone()
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.head.load_state_dict(state["head"])
        if self.empty is not None:
            with torch.no_grad():
                self.empty.copy_(state["empty"])

    def export(self, out: Path) -> None:
        self.encoder.meta["distillation"] = {"method": self.config.label, "teacher": self.teacher.space_id,
                                             "config": asdict(self.config)}
        super().export(out)
        extra = {"empty": self.empty, "projection": self.projection}
        save_tensors({**{f"head.{k}": v.detach().contiguous() for k, v in self.head.state_dict().items()},
                      **{k: v.detach().contiguous() for k, v in extra.items() if v is not None}},
                     Path(out) / "kd_head.safetensors")

    # ------------------------------------------------------------------ loss
    def _teacher(self, pixels) -> TowerOutputs:
        with torch.no_grad():
            return encode_towers(self.teacher, pixels, None)

    def loss(self, batch, step: int):
        pixels, captions = batch[0], batch[1]
        cfg = self.config
        s = encode_towers(self.encoder, pixels, captions)
        t = self._teacher(pixels)
        scale = self.encoder.model.logit_scale.exp()
        l_con = info_nce(s.image, s.text, scale)
        g_img = _sq_err(self.head(s.image), t.image).mean()
        g_txt = _sq_err(self.head(s.text), t.image).mean()
        logs = {"loss_con": float(l_con.item())}
        if cfg.mode == "global":
            l_kd = 0.5 * (g_img + g_txt)
            total = cfg.contrastive_weight * l_con + cfg.kd_weight * l_kd
            logs["loss_kd"] = float(l_kd.item())
            return total, logs
        # Eq. 5: patch n of the student regresses patch n of the teacher
        patches = _sq_err(self.head(s.image_tokens), t.image_tokens).mean()
        l_i2t = g_img + patches
        # Eq. 6: each student text token regresses its best-matching teacher patch (or nothing)
        s_tok = self.head(s.text_tokens)
        index, gate = route_tokens(s_tok, s.text_mask, t.image_tokens, self.projection, self.empty,
                                   cfg.gate_temperature)
        target = torch.gather(t.image_tokens, 1, index[..., None].expand(-1, -1, t.image_tokens.shape[-1]))
        n_tok = s.text_mask.sum().clamp(min=1)
        tokens = (gate * _sq_err(s_tok, target)).sum() / n_tok
        l_t2i = g_txt + tokens
        l_kd = 0.5 * (l_i2t + l_t2i)  # Eq. 7
        total = cfg.contrastive_weight * l_con + cfg.kd_weight * l_kd
        logs.update(loss_kd=float(l_kd.item()), loss_patch=float(patches.item()), loss_token=float(tokens.item()))
        if self.empty is not None:
            l_reg, p = empty_target_loss(gate, s.text_mask.to(gate.dtype))
            total = total + cfg.reg_weight * l_reg
            logs.update(loss_reg=float(l_reg.item()), empty_share=float(1.0 - p.item()))
        return total, logs

    # ------------------------------------------------------------------ analysis
    @torch.no_grad()
    def empty_routing(self, pixels, captions: Sequence[str], top: int = 15) -> dict:
        """Share of text tokens routed to the empty target on ``(pixels, captions)`` and, per word,
        how often it was (words seen at least 5 times, most-excused first)."""
        if self.empty is None:
            return {"share": 0.0, "n_tokens": 0, "words": []}
        s = encode_towers(self.encoder, pixels, captions)
        t = self._teacher(pixels)
        _, gate = route_tokens(self.head(s.text_tokens), s.text_mask, t.image_tokens, self.projection,
                               self.empty, self.config.gate_temperature)
        tok = self.encoder.tokenizer
        seen, excused = Counter(), Counter()
        for row_ids, row_mask, row_gate in zip(s.input_ids, s.text_mask, gate):
            words = tok.convert_ids_to_tokens(row_ids.tolist())
            for w, m, g in zip(words, row_mask.tolist(), row_gate.tolist()):
                if not m:
                    continue
                w = tok.convert_tokens_to_string([w]).strip()
                seen[w] += 1
                excused[w] += int(g < 0.5)
        n = sum(seen.values())
        share = sum(excused.values()) / max(1, n)
        words = sorted(((w, excused[w] / c, c) for w, c in seen.items() if c >= 5), key=lambda x: (-x[1], -x[2], x[0]))
        return {"share": share, "n_tokens": n,
                "words": [{"word": w, "empty_share": round(r, 3), "count": c} for w, r, c in words[:top]],
                "never_excused": sorted(w for w, r, c in words if r == 0.0)[:30]}

