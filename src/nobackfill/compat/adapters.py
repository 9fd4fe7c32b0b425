"""Parameter-efficient, switchable additions to a CLIP model or a BERT-style text model (XBT, seed
000, Sec. 3.3 and 4.1).

The architecture (:data:`ARCHITECTURES`) decides where the additions go: ``"clip"`` (a
``transformers.CLIPModel``: vision and text towers) or ``"bert"`` (a ``BertModel`` such as
all-MiniLM-L6-v2: one text tower, the model itself; XBT applied to text, ``bench xbt-text``).

Three kinds, each optional, none of which ever modifies a base weight:

* **LoRA** (via ``peft``) on the attention projections of the new encoders: rank 16, alpha 16,
  dropout 0.1 (Sec. 4.1). The paper does not name the target layers; we adapt every layer's
  ``q_proj, k_proj, v_proj, out_proj`` of both CLIP towers, and the BERT analogue
  ``attention.self.{query,key,value}, attention.output.dense`` (configurable).
* **Soft prompts** on the vision encoder only (CLIP): ``n_prompts`` (10, App. A.2) learnable tokens
  inserted after the CLS token, before the vision ``pre_layrnorm`` (VPT-shallow style; the
  pooled CLS output is unchanged in position). No text prompts: phi was pretrained on the original
  text distribution (Sec. 3.3).
* **LayerNorms**: every LayerNorm of every tower gets a trainable copy of its weight and bias
  (App. A.2: "layer normalization is set to be the only trainable component for all VLP image and
  text encoders"); the original LayerNorm stays in the model, frozen.

Switching off (:meth:`Adapters.set_enabled`) routes every wrapped layer back to its original
module (LoRA: peft's disabled path ``base_layer(x)``; LayerNorm: the original module; prompts: not
inserted), so the model's outputs equal the original model's **bit for bit**.
"""

from __future__ import annotations

import contextlib
import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn

from .._safetensors import save_tensors

ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
PROMPT_MODULE = "nobackfill_vision_prompts"
TOWERS = ("vision", "text")


@dataclass(frozen=True)
class Architecture:
    """Where the additions go in one model family: ``towers`` (tower name -> attribute path of its
    module, ``""`` = the model itself), the LoRA target pattern (``{towers}`` / ``{targets}`` are
    filled with the module-path prefixes and the target names) and the defaults of
    :class:`AdapterConfig`."""

    towers: tuple[tuple[str, str], ...]
    lora_pattern: str
    lora_targets: tuple[str, ...]
    n_prompts: int

    @property
    def tower_names(self) -> tuple[str, ...]:
        return tuple(t for t, _ in self.towers)


#: the supported model families; ``detect_architecture`` picks one from a model
ARCHITECTURES: dict[str, Architecture] = {
    # transformers.CLIPModel: vision_model / text_model, layers ...encoder.layers.N.self_attn.{q,k,v,out}_proj
    "clip": Architecture(towers=(("vision", "vision_model"), ("text", "text_model")),
                         lora_pattern=r"^({towers})\.encoder\.layers\.\d+\.self_attn\.({targets})$",
                         lora_targets=("q_proj", "k_proj", "v_proj", "out_proj"), n_prompts=10),
    # transformers.BertModel (all-MiniLM-L6-v2, the Multi30K old model): one text tower, the model
    # itself; encoder.layer.N.attention.self.{query,key,value} and attention.output.dense
    "bert": Architecture(towers=(("text", ""),),
                         lora_pattern=r"^encoder\.layer\.\d+\.attention\.({targets})$",
                         lora_targets=("self.query", "self.key", "self.value", "output.dense"), n_prompts=0),
}


def detect_architecture(model: nn.Module) -> str:
    """``"clip"`` for a model with ``vision_model`` and ``text_model``, ``"bert"`` for a BERT-style
    encoder (``embeddings`` + ``encoder.layer``); else a ``ValueError`` naming the model class."""
    if hasattr(model, "vision_model") and hasattr(model, "text_model"):
        return "clip"
    if hasattr(model, "embeddings") and hasattr(getattr(model, "encoder", None), "layer"):
        return "bert"
    raise ValueError(f"adapters support CLIP and BERT-style models; {type(model).__name__} is neither "
                     f"(architectures: {sorted(ARCHITECTURES)})")


@dataclass
class AdapterConfig:
    """What to add. Defaults are XBT's (Sec. 4.1, App. A.2) for the ``architecture``: ``None``
    fields take the architecture's defaults (CLIP: q/k/v/out_proj of both towers, 10 vision
    prompts; BERT: query/key/value/output.dense of the one text tower, no prompts)."""

    lora_rank: int = 16
    lora_alpha: int = 16
    lora_dropout: float = 0.1
    lora_targets: tuple[str, ...] | None = None
    lora_towers: tuple[str, ...] | None = None  # () = no LoRA
    n_prompts: int | None = None  # vision soft prompts; 0 = none
    layernorm: bool = True  # trainable LayerNorm copies in every tower
    seed: int = 0
    architecture: str = "clip"  # a key of ARCHITECTURES (configs saved before it existed are CLIP's)

    def __post_init__(self) -> None:
        if self.architecture not in ARCHITECTURES:
            raise ValueError(f"architecture must be one of {sorted(ARCHITECTURES)}, got {self.architecture!r}")
        arch = ARCHITECTURES[self.architecture]
        self.lora_targets = tuple(arch.lora_targets if self.lora_targets is None else self.lora_targets)
        self.lora_towers = tuple(arch.tower_names if self.lora_towers is None else self.lora_towers)
        self.n_prompts = arch.n_prompts if self.n_prompts is None else int(self.n_prompts)
        bad = [t for t in self.lora_towers if t not in arch.tower_names]
        if bad:
            raise ValueError(f"lora_towers must be a subset of {arch.tower_names} ({self.architecture}), got {bad}")
        if self.lora_towers and self.lora_rank < 1:
            raise ValueError(f"lora_rank must be >= 1, got {self.lora_rank}")
        if self.lora_towers and not self.lora_targets:
            raise ValueError("lora_targets is empty but lora_towers is not (use lora_towers=() for no LoRA)")
        if self.n_prompts < 0:
            raise ValueError(f"n_prompts must be >= 0, got {self.n_prompts}")
        if self.n_prompts and "vision" not in arch.tower_names:
            raise ValueError(f"n_prompts={self.n_prompts}: a {self.architecture} model has no vision tower "
                             "for soft prompts")

    @classmethod
    def xbt(cls, **kw) -> "AdapterConfig":
        """LoRA (both towers) + 10 vision prompts + LayerNorms (Sec. 3.3, App. A.2)."""
        return cls(**kw)

    @classmethod
    def text(cls, **kw) -> "AdapterConfig":
        """XBT on a BERT-style text model: LoRA on the attention projections + LayerNorms (no
        prompts: there is no vision tower)."""
        return cls(**{"architecture": "bert", **kw})

    @classmethod
    def for_model(cls, model: nn.Module, **kw) -> "AdapterConfig":
        """XBT's defaults for ``model``'s architecture (:func:`detect_architecture`)."""
        return cls(**{"architecture": detect_architecture(model), **kw})

    @classmethod
    def lora_only(cls, **kw) -> "AdapterConfig":
        """The LoRA-only baseline of Table 1."""
        return cls(**{"n_prompts": 0, "layernorm": False, **kw})

    @classmethod
    def base(cls, **kw) -> "AdapterConfig":
        """The Base baseline of Table 1: LoRA-only plus the learnable prompts."""
        return cls(**{"layernorm": False, **kw})

    def to_dict(self) -> dict:
        d = asdict(self)
        d["lora_targets"], d["lora_towers"] = list(self.lora_targets), list(self.lora_towers)
        return d


class SwitchableLayerNorm(nn.Module):
    """A LayerNorm with a trainable copy of its affine parameters; the original stays as
    ``self.base`` (frozen) and is used verbatim when switched off."""

    def __init__(self, base: nn.LayerNorm) -> None:
        super().__init__()
        self.base = base
        self.enabled = True
        w = base.weight.detach().clone() if base.weight is not None else torch.ones(base.normalized_shape)
        b = base.bias.detach().clone() if getattr(base, "bias", None) is not None else torch.zeros(base.normalized_shape)
        self.tuned_weight = nn.Parameter(w)
        self.tuned_bias = nn.Parameter(b)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.enabled:
            return self.base(x)
        return F.layer_norm(x, self.base.normalized_shape, self.tuned_weight, self.tuned_bias, self.base.eps)


class VisionPrompts(nn.Module):
    """``n`` learnable tokens inserted after the vision CLS token (a forward hook on the
    vision embeddings)."""

    def __init__(self, n: int, width: int) -> None:
        super().__init__()
        self.prompts = nn.Parameter(torch.randn(n, width) * 0.02)
        self.enabled = True

    def insert(self, hidden: torch.Tensor) -> torch.Tensor:
        p = self.prompts.to(hidden.dtype).unsqueeze(0).expand(hidden.shape[0], -1, -1)
        return torch.cat([hidden[:, :1], p, hidden[:, 1:]], dim=1)


def lora_target_names(model: nn.Module, cfg: AdapterConfig) -> list[str]:
    """The names ``cfg.lora_targets`` may hold for ``model``: the linear layers the architecture's
    LoRA pattern reaches in ``cfg.lora_towers`` (CLIP: q_proj, k_proj, v_proj, out_proj), in model order."""
    arch = ARCHITECTURES[cfg.architecture]
    prefixes = "|".join(re.escape(dict(arch.towers)[t]) for t in cfg.lora_towers)
    rx = re.compile(arch.lora_pattern.format(towers=prefixes, targets=".+"))
    found = (m.group(rx.groups) for name, mod in model.named_modules()
             if isinstance(mod, nn.Linear) and (m := rx.match(name)))
    return list(dict.fromkeys(found))


def check_adapter_config(model: nn.Module, cfg: AdapterConfig, field: str = "adapters") -> None:
    """Refuse an adapter config that does not fit ``model`` before anything trains, in one line naming
    the config's field ``field`` (trial Y: ``lora_targets = ["q_prj"]`` passed stage 1 of ``upgrade xbt``
    and failed in stage 2 with peft's "Target modules ... not found in the base model"; a list with one
    misspelt name among good ones left that name out silently)."""
    arch_name = detect_architecture(model)
    if cfg.architecture != arch_name:
        raise ValueError(f"{field}.architecture: {cfg.architecture!r}, but {type(model).__name__} is a "
                         f"{arch_name!r} model")
    if not cfg.lora_towers:
        return
    found = lora_target_names(model, cfg)
    bad = [t for t in cfg.lora_targets if t not in found]
    if bad:
        raise ValueError(f"{field}.lora_targets: {', '.join(map(repr, bad))} {'is' if len(bad) == 1 else 'are'} "
                         f"not a module LoRA can target in {type(model).__name__}'s "
                         f"{' and '.join(cfg.lora_towers)} tower{'s' if len(cfg.lora_towers) > 1 else ''}; "
                         f"it has: {', '.join(found) or 'none'}")


def _towers(model: nn.Module, architecture: str = "clip") -> dict[str, nn.Module]:
    """Tower name -> module of ``model`` for ``architecture``."""
    return {name: (model.get_submodule(path) if path else model) for name, path in ARCHITECTURES[architecture].towers}


@contextlib.contextmanager
def _seeded(seed: int) -> Iterator[None]:
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        yield
    finally:
        torch.random.set_rng_state(state)


class Adapters:
    """Attach the additions of ``cfg`` *in place* to a ``transformers.CLIPModel`` or a BERT-style
    text model (``cfg.architecture`` must be the model's, :func:`detect_architecture`; ``cfg=None``
    takes XBT's defaults for it).

    Every base parameter is frozen; the added ones are trainable. Switched on by default.
    ``base_state_dict()`` gives the base weights under their original names (to check they never
    change); ``state_dict()`` only the added tensors (what an upgrade directory stores).
    """

    def __init__(self, model: nn.Module, cfg: AdapterConfig | None = None) -> None:
        arch_name = detect_architecture(model)
        self.model = model
        self.cfg = cfg = cfg or AdapterConfig(architecture=arch_name)
        check_adapter_config(model, cfg)  # before peft (whose error names neither the field nor what exists)
        arch = ARCHITECTURES[arch_name]
        self.lora_config = None
        self._hook = None
        model.requires_grad_(False)
        with _seeded(cfg.seed):
            if cfg.lora_towers:
                from peft import LoraConfig, inject_adapter_in_model

                paths = dict(arch.towers)
                prefixes = "|".join(re.escape(paths[t]) for t in cfg.lora_towers)
                targets = "|".join(re.escape(t) for t in cfg.lora_targets)
                self.lora_config = LoraConfig(
                    r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout, bias="none",
                    target_modules=arch.lora_pattern.format(towers=prefixes, targets=targets))
                inject_adapter_in_model(self.lora_config, model)
                if not any(".lora_" in n for n, _ in model.named_parameters()):
                    raise ValueError(f"LoRA matched no attention projection of {type(model).__name__} "
                                     f"(targets {list(cfg.lora_targets)})")
            if cfg.layernorm:
                for tower in _towers(model, arch_name).values():
                    for name, mod in list(tower.named_modules()):
                        if isinstance(mod, nn.LayerNorm):
                            parent = tower.get_submodule(name.rpartition(".")[0]) if "." in name else tower
                            setattr(parent, name.rpartition(".")[2], SwitchableLayerNorm(mod))
            if cfg.n_prompts:
                width = model.config.vision_config.hidden_size
                model.add_module(PROMPT_MODULE, VisionPrompts(cfg.n_prompts, width))
                self._hook = model.vision_model.embeddings.register_forward_hook(self._prompt_hook)
        for _, p in self.named_parameters():
            p.requires_grad_(True)
        model.train(model.training)  # new modules (LoRA dropout) follow the model's train / eval mode
        self._enabled = True

    # ----------------------------------------------------------------- structure
    @property
    def prompts(self) -> VisionPrompts | None:
        return getattr(self.model, PROMPT_MODULE, None)

    def _prompt_hook(self, module, inputs, output):
        pr = self.prompts
        if pr is None or not pr.enabled:
            return None
        return pr.insert(output)

    @staticmethod
    def is_adapter_name(name: str) -> bool:
        return (".lora_" in name or name.startswith(PROMPT_MODULE + ".")
                or name.endswith(".tuned_weight") or name.endswith(".tuned_bias"))

    def named_parameters(self) -> list[tuple[str, nn.Parameter]]:
        return [(n, p) for n, p in self.model.named_parameters() if self.is_adapter_name(n)]

    def groups(self) -> dict[str, list[nn.Parameter]]:
        """``{"lora": [...], "prompts": [...], "layernorm": [...]}`` (empty lists allowed)."""
        out: dict[str, list[nn.Parameter]] = {"lora": [], "prompts": [], "layernorm": []}
        for n, p in self.named_parameters():
            key = "lora" if ".lora_" in n else "prompts" if n.startswith(PROMPT_MODULE) else "layernorm"
            out[key].append(p)
        return out

    def num_parameters(self) -> dict[str, int]:
        return {k: sum(p.numel() for p in v) for k, v in self.groups().items()}

    def base_state_dict(self) -> dict[str, torch.Tensor]:
        """The model's base weights under their original (pre-attachment) names."""
        out = {}
        for n, t in self.model.state_dict().items():
            if self.is_adapter_name(n):
                continue
            out[n.replace(".base_layer.", ".").replace(".base.", ".")] = t
        return out

    # ----------------------------------------------------------------- on / off
    @property
    def enabled(self) -> bool:
        return self._enabled

    def set_enabled(self, enabled: bool) -> None:
        """Switch every addition on or off (off = the original model, bit for bit)."""
        from peft.tuners.tuners_utils import BaseTunerLayer

        enabled = bool(enabled)
        grads = {id(p): p.requires_grad for _, p in self.named_parameters()}
        for m in self.model.modules():
            if isinstance(m, BaseTunerLayer):
                m.enable_adapters(enabled)  # peft also toggles requires_grad; restored below
            elif isinstance(m, (SwitchableLayerNorm, VisionPrompts)):
                m.enabled = enabled
        for _, p in self.named_parameters():
            p.requires_grad_(grads[id(p)])
        self._enabled = enabled

    @contextlib.contextmanager
    def switched(self, enabled: bool) -> Iterator[None]:
        prev = self._enabled
        self.set_enabled(enabled)
        try:
            yield
        finally:
            self.set_enabled(prev)

    def merged_model(self) -> nn.Module:
        """A copy of the model with every addition folded in, for serving (peft's
        ``merge_and_unload``): LoRA merged into the base weights (``W + scale * B A``), the tuned
        LayerNorms as plain LayerNorms, the prompts inserted by a hook of the copy's own. Its outputs
        equal the switched-on model's; this object's model is left as it is (still switchable)."""
        import copy

        from peft.tuners.tuners_utils import BaseTunerLayer

        if not self._enabled:
            raise ValueError("switch the adapters on before merging them")
        hook, self._hook = self._hook, None  # not copied into the merged model
        if hook is not None:
            hook.remove()
        try:
            merged = copy.deepcopy(self.model)
        finally:
            if hook is not None:
                self._hook = self.model.vision_model.embeddings.register_forward_hook(self._prompt_hook)
        replaced: list[str] = []
        for name, mod in list(merged.named_modules()):
            if any(name.startswith(r + ".") for r in replaced):
                continue  # inside a wrapper already replaced
            parent_name, _, attr = name.rpartition(".")
            parent = merged.get_submodule(parent_name) if parent_name else merged
            if isinstance(mod, (BaseTunerLayer, SwitchableLayerNorm)):
                replaced.append(name)
            if isinstance(mod, BaseTunerLayer):
                mod.merge()
                setattr(parent, attr, mod.get_base_layer())
            elif isinstance(mod, SwitchableLayerNorm):
                ln = mod.base
                with torch.no_grad():
                    ln.weight.copy_(mod.tuned_weight)
                    ln.bias.copy_(mod.tuned_bias)
                setattr(parent, attr, ln)
        prompts = getattr(merged, PROMPT_MODULE, None)
        if prompts is not None:
            merged.vision_model.embeddings.register_forward_hook(lambda _m, _i, out: prompts.insert(out))
        merged.requires_grad_(False)
        return merged.eval()

    def detach(self) -> None:
        """Remove the prompt hook (LoRA and LayerNorm wrappers stay; switch them off)."""
        if self._hook is not None:
            self._hook.remove()
            self._hook = None

    # ----------------------------------------------------------------- persistence
    def state_dict(self) -> dict[str, torch.Tensor]:
        return {n: p.detach().clone().contiguous() for n, p in self.named_parameters()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        own = dict(self.named_parameters())
        missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
        if missing or unexpected:
            raise ValueError(f"adapter weights do not match the configuration: missing {missing[:4]}"
                             f"{'...' if len(missing) > 4 else ''}, unexpected {unexpected[:4]}"
                             f"{'...' if len(unexpected) > 4 else ''}")
        with torch.no_grad():
            for n, p in own.items():
                if p.shape != state[n].shape:
                    raise ValueError(f"adapter weight {n}: shape {tuple(state[n].shape)}, expected {tuple(p.shape)}")
                p.copy_(state[n])

    def save(self, directory: str | Path) -> None:
        """``adapter_model.safetensors`` (every added tensor) and ``adapter_config.json`` (the peft
        ``LoraConfig``, Hugging Face style, plus our additions under ``"nobackfill"``)."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        save_tensors(self.state_dict(), str(d / ADAPTER_WEIGHTS))
        cfg = {}
        if self.lora_config is not None:
            cfg = {k: (sorted(v) if isinstance(v, set) else v) for k, v in self.lora_config.to_dict().items()}
        cfg = json.loads(json.dumps(cfg, default=str))
        cfg["nobackfill"] = self.cfg.to_dict()
        (d / ADAPTER_CONFIG).write_text(json.dumps(cfg, indent=2))

    @staticmethod
    def read_config(directory: str | Path) -> AdapterConfig:
        path = Path(directory) / ADAPTER_CONFIG
        if not path.is_file():
            raise FileNotFoundError(f"{directory}: no {ADAPTER_CONFIG}")
        return AdapterConfig(**json.loads(path.read_text())["nobackfill"])

    def load(self, directory: str | Path) -> None:
        self.load_state_dict(load_file(str(Path(directory) / ADAPTER_WEIGHTS)))


def trainable_names(model: nn.Module) -> set[str]:
    """Names of the parameters of ``model`` that require grad."""
    return {n for n, p in model.named_parameters() if p.requires_grad}

