"""Compatibility learning over a sequence of model updates (Biondi et al.'s tutorial, the compatibility-learning
tutorial): every method is a :class:`~.base.CompatMethod` plug-in of the one training loop,
registered by name.

=================  ======================================================  =================
name               method                                                  file
=================  ======================================================  =================
baseline           independent training per step                           baseline.py
bct                BCT: influence loss, synthesised classifier rows        bct.py
bt2                BT^2: extra dimensions + learnable basis transformation bct.py
lce                LCE: alignment + boundary losses, learned mapping       lce.py
advbct             AdvBCT: discriminator + point-to-set loss               advbct.py
cores              CoReS: fixed d-Simplex, pre-allocated classes           simplex.py
dsimplex-hoc       d-Simplex-HOC: lambda CE + (1 - lambda) InfoNCE         simplex.py
cl2r               CL2R: d-Simplex + replay + feature distillation         simplex.py
psp / lsp          softmax / logit simplex projections as features         softmax_features.py
fd-kl / fd-lm      Focal Distillation (KL / logit matching)                flips.py
elodi              ensemble logit difference inhibition                    flips.py
muscle             masked KL between old model and new reference           flips.py
=================  ======================================================  =================

May import: ``_atomic``, ``_safetensors``, ``config``, ``data``, ``encoders``, ``metrics``, ``progress``, ``train``.
"""

from . import baseline, bct, lce, advbct, simplex, softmax_features, flips  # noqa: F401,I001  (registration order)
from .base import CompatMethod, ModelConfig, StepContext, StepModel, simplex_vertices
from .data import ClassData, DataConfig, class_schedule, load_class_data
from .registry import create_method, method_class, method_names, register
from .sequence import SequenceConfig, evaluate_sequence, run_method, train_sequence

__all__ = ["CompatMethod", "ModelConfig", "StepContext", "StepModel", "simplex_vertices", "ClassData", "DataConfig",
           "class_schedule", "load_class_data", "create_method", "method_class", "method_names", "register",
           "SequenceConfig", "evaluate_sequence", "run_method", "train_sequence"]
