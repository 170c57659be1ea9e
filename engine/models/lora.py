"""LoRA on the actor (actor_rollout_ref.model.lora_rank > 0, or a saved adapter: lora_adapter_path), with peft.

peft injects its LoRA layers into the HF model in place: each targeted `nn.Linear` becomes a
wrapper holding the original layer (`<module>.base_layer`) and two adapter matrices
(`<module>.lora_A.default`, r × in, and `<module>.lora_B.default`, out × r, B starting at zero).
The wrapper computes base(x) + alpha / r · B(A(x)). The engine shards that same HF model with
FSDP2 afterwards, so the adapters are sharded like every other parameter.

- Only the adapters train: peft freezes every other parameter, and those frozen base weights are
  kept in the compute dtype (no fp32 master copy: they never receive an update).
- The reference policy is this model with the adapters switched off (`adapters_off`): exactly the
  base model, with no second copy loaded.
- Rollout backends and the HF export need plain weights under the base model's names:
  `merge_lora_weights` folds each adapter into its base weight, W + alpha / r · B @ A.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

ADAPTER = "default"  # peft's name for the one adapter get_peft_model adds
BASE_LAYER = ".base_layer."
BASE_WEIGHT, LORA_A, LORA_B = ".base_layer.weight", f".lora_A.{ADAPTER}.weight", f".lora_B.{ADAPTER}.weight"
SUFFIX_PART = {BASE_WEIGHT: "W", LORA_A: "A", LORA_B: "B"}


def lora_scaling(rank: int, alpha: float) -> float:
    """What peft multiplies the adapter's output by (plain LoRA, not rsLoRA)."""
    return alpha / rank


def add_lora(model: nn.Module, model_cfg: Any, compute_dtype: torch.dtype) -> Any:
    """Inject adapters into `model` (in place) as `model_cfg` (actor_rollout_ref.model) says; returns the PeftModel.

    With `lora_adapter_path` the saved adapter is loaded, trainable, as verl does (peft's
    `PeftModel.from_pretrained`): its rank, alpha, target modules and weights are the adapter's own, and
    lora_rank / lora_alpha / target_modules are not read (rlconf.lora_adapter). Otherwise fresh adapters
    (B = 0) of lora_rank on target_modules.

    Call it after `gradient_checkpointing_enable`: with checkpointing, the embedding's output must
    require grad or the checkpointed layers' adapters get no gradient (the frozen embedding gives
    inputs that do not), which `enable_input_require_grads` arranges.
    """
    from peft import LoraConfig, PeftModel, get_peft_model
    from peft.tuners.lora import Linear as LoraLinear
    from peft.tuners.tuners_utils import BaseTunerLayer

    if model_cfg.lora_adapter_path is not None:
        peft_model = PeftModel.from_pretrained(model, model_cfg.lora_adapter_path, is_trainable=True)
        saved = peft_model.peft_config[ADAPTER]
        where = f"the adapter at {model_cfg.lora_adapter_path} (target_modules {saved.target_modules!r})"
        if saved.modules_to_save:
            # Fully trained copies of whole modules: not LoRA, and not something the weight merge knows.
            raise ValueError(f"{where} also trains whole modules (modules_to_save="
                             f"{sorted(saved.modules_to_save)}); this engine runs LoRA adapters of linear layers only")
    else:
        config = LoraConfig(r=model_cfg.lora_rank, lora_alpha=model_cfg.lora_alpha,
                            target_modules=model_cfg.target_modules, exclude_modules=model_cfg.exclude_modules,
                            lora_dropout=0.0, bias="none", task_type="CAUSAL_LM")
        peft_model = get_peft_model(model, config)
        where = f"target_modules={model_cfg.target_modules!r}"
    others = sorted({type(m).__name__ for m in model.modules()
                     if isinstance(m, BaseTunerLayer) and not isinstance(m, LoraLinear)})
    if others:
        # The weight merge below knows linear layers only (embedding/conv adapters lay out A and B otherwise).
        raise ValueError(f"{where} puts LoRA on {', '.join(others)} layers; "
                         "this engine merges adapters of linear layers only: name linear modules")
    if isinstance(model.get_output_embeddings(), BaseTunerLayer) and model.config.tie_word_embeddings:
        # The merged head would differ from the embeddings it shares its weight with: no plain model holds that.
        raise ValueError(f"{where} puts LoRA on the LM head, which this model ties "
                         "to its input embeddings; leave the LM head out or use a model with an untied head")
    merge_scaling(peft_model)  # one scale for every layer, or a clear error now rather than at the first sync
    if model_cfg.enable_gradient_checkpointing:
        model.enable_input_require_grads()
    for param in model.parameters():
        if not param.requires_grad:
            param.data = param.data.to(compute_dtype)  # frozen: no fp32 master copy needed
    return peft_model


def merge_scaling(peft_model: Any) -> float:
    """What every adapter's output is multiplied by, read from peft's layers (alpha / r; alpha / √r with rsLoRA):
    for a saved adapter its own numbers, never the plan's lora_rank and lora_alpha."""
    from peft.tuners.lora import LoraLayer

    scales = {layer.scaling[ADAPTER] for layer in peft_model.modules() if isinstance(layer, LoraLayer)}
    if len(scales) != 1:
        raise ValueError(f"the adapter's layers scale by {sorted(scales)} (a rank or alpha pattern per module): "
                         "the weight merge takes one scale for all; use an adapter of one rank and alpha")
    return float(next(iter(scales)))


@contextmanager
def adapters_off(model: nn.Module) -> Iterator[None]:
    """Every LoRA layer of `model` runs its base layer alone inside; the adapters' requires_grad stays as it was.

    Not peft's `disable_adapter()`: that also clears the adapters' requires_grad, and FSDP2 reads
    requires_grad once, at its lazy init on the first forward, to pick each layer group's gradient
    dtypes. Were that first forward the reference's (adapters off, nothing trainable), the
    adapters' gradients would later be reduced in bf16 and refused by their fp32 parameters.
    """
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]
    trainable = [p for layer in layers for p in layer.parameters() if p.requires_grad]
    for layer in layers:
        layer.enable_adapters(False)
    for param in trainable:
        param.requires_grad_(True)
    try:
        yield
    finally:
        for layer in layers:
            layer.enable_adapters(True)


def merge_lora_weights(named_tensors: Iterable[tuple[str, torch.Tensor]], scaling: float,
                       dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """The LoRA model's tensors as the plain model's: each adapted weight merged, under the base name.

    `named_tensors`: (name, full tensor) of the peft-injected HF model, in state-dict order (as
    engine.workers.fsdp.gather.full_tensors yields them). For each adapted module `m`:
    `m.base_layer.weight` W, `m.lora_A.default.weight` A and `m.lora_B.default.weight` B become one
    `m.weight` = W + scaling · B @ A, computed in fp32 and then cast to `dtype` (None: W's dtype);
    `m.base_layer.bias` becomes `m.bias`. Other tensors pass through (cast to `dtype`). A module's
    three tensors arrive next to each other, so at most one module waits here at a time.
    """
    pending: dict[str, dict[str, torch.Tensor]] = {}

    def cast(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to(dtype) if dtype is not None and tensor.is_floating_point() else tensor

    for name, tensor in named_tensors:
        suffix = next((suffix for suffix in SUFFIX_PART if name.endswith(suffix)), None)
        if suffix is not None:
            module = name[:-len(suffix)]
            parts = pending.setdefault(module, {})
            parts[SUFFIX_PART[suffix]] = tensor
            if len(parts) == 3:
                del pending[module]
                yield f"{module}.weight", merged_weight(parts["W"], parts["A"], parts["B"], scaling, dtype)
        elif BASE_LAYER in name:
            yield name.replace(BASE_LAYER, "."), cast(tensor)
        elif ".lora_" in name:
            raise ValueError(f"cannot merge LoRA tensor {name!r}: only linear layers' lora_A/lora_B are merged")
        else:
            yield name, cast(tensor)
    if pending:
        module, parts = next(iter(pending.items()))
        raise ValueError(f"LoRA module {module!r} sent {sorted(parts)} only: a merge needs W, A and B")


def merged_weight(base: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scaling: float,
                  dtype: torch.dtype | None = None) -> torch.Tensor:
    """W + scaling · B @ A for W [out, in], A [r, in], B [out, r], in fp32, cast to `dtype` (None: W's)."""
    merged = base.float() + scaling * (b.float() @ a.float())
    return merged.to(dtype if dtype is not None else base.dtype)
