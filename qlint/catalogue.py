"""Catalogue specs: ``hf:NAME``, ``timm:NAME``, ``torchvision:NAME``, a library's architecture without a factory.

The model is built from its library's default configuration with random weights, offline (no weights or
configs are downloaded), and shrunk by default: the exponent of a block is a fact of its architecture, not of
its width or depth, so a few layers of small width say what the full model's blocks are, in seconds. What was
changed is said on the report (``built: ...``). ``?full-size`` (the CLI's ``--full-size``) keeps the
library's sizes; pair it with ``--device meta`` for a large model.

Options follow the name as a query: ``hf:llama?layers=4&hidden=128``. The short names (``layers``,
``hidden``, ``ffn``, ``heads``, ``kv-heads``, ``head-dim``, ``experts``) set every config key of that kind;
any other option is a config key set as written (a number, ``true`` / ``false``, or a string).

- ``hf:MODEL_TYPE`` (``hf:llama``) builds the base model of that model type (``LlamaModel``);
  ``hf:CLASS`` (``hf:LlamaForCausalLM``) builds that class. The example input is what the model's
  ``main_input_name`` asks for: 8 token ids, a 3-channel image at the config's size, a second of audio,
  or log-mel features; an encoder-decoder gets decoder token ids too. Sub-configs (a vision-text
  model's towers, an encoder-decoder's halves) are shrunk as well.
- ``timm:NAME`` builds ``timm.create_model(NAME)``; depth options its builder takes (``depth``,
  ``depths``, ``layers``) are set to a block or two per stage.
- ``torchvision:NAME`` builds ``torchvision.models.get_model(NAME)``, at full size (its builders take no
  size options), on a 224 x 224 image (a list of one image for detection models).

A shrunk model is built, then run once on its example input. When that fails, the shrinking is undone
a kind at a time (width first) until one builds and runs; when none does, the error is one line naming
the keys that were changed and what the library said.
"""

from __future__ import annotations

import ast
import inspect
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from qlint.core.errors import QlintError

LIBRARIES = ("hf", "timm", "torchvision")
FULL_SIZE = "full-size"
TOKENS = 8  # the example sequence length
IMAGE = 224  # torchvision's image side

# Each kind of size: the config keys that hold it and the value a shrunk model takes (only ever made smaller).
# Tried in this order; a failed build undoes the kinds from the last one back, so depth stays shrunk longest.
HF_SIZES: dict[str, tuple[tuple[str, ...], int]] = {
    "layers": (("num_hidden_layers", "num_layers", "n_layer", "n_layers", "num_encoder_layers",
                "num_decoder_layers", "encoder_layers", "decoder_layers", "depth"), 2),
    "experts": (("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"), 4),
    "experts-per-token": (("num_experts_per_tok", "moe_topk", "top_k", "num_selected_experts"), 2),
    "ffn": (("intermediate_size", "ffn_dim", "d_ff", "n_inner", "encoder_ffn_dim", "decoder_ffn_dim",
             "moe_intermediate_size", "shared_expert_intermediate_size", "ffn_hidden_size"), 128),
    "latent": (("q_lora_rank", "kv_lora_rank"), 32),
    "rope-dims": (("qk_rope_head_dim", "qk_nope_head_dim"), 32),
    "hidden": (("hidden_size", "d_model", "n_embd", "embed_dim", "hidden_dim", "dim"), 64),
    "heads": (("num_attention_heads", "n_head", "num_heads", "encoder_attention_heads",
               "decoder_attention_heads"), 4),
    "kv-heads": (("num_key_value_heads", "num_kv_heads", "multi_query_group_num"), 2),
    "head-dim": (("head_dim", "d_kv", "attention_head_dim", "kv_channels", "v_head_dim"), 32),
}
# the width kinds change together: a width that no longer divides by the head count is no model
WIDTH_KINDS = ("latent", "rope-dims", "hidden", "heads", "kv-heads", "head-dim")
PER_LAYER_LISTS = ("layer_types", "block_types", "layers_block_type", "attn_type_list", "mlp_only_layers")


class CatalogueError(QlintError):
    """A catalogue spec that names nothing, or a model that does not build: one line."""


@dataclass(frozen=True)
class CatalogueSpec:
    library: str
    name: str
    options: dict[str, str] = field(default_factory=dict)

    @property
    def full_size(self) -> bool:
        return FULL_SIZE in self.options


@dataclass
class Built:
    model: Any
    inputs: Any  # a tuple of arguments, or a dict of keyword arguments
    description: str  # what was built and what was changed, for the report's "built:" line


def parse(spec: str) -> Optional[CatalogueSpec]:
    """``hf:llama?layers=4`` -> CatalogueSpec("hf", "llama", {"layers": "4"}); None for any other spec."""
    library, sep, rest = spec.partition(":")
    if not sep or library not in LIBRARIES:
        return None
    name, _, query = rest.partition("?")
    if not name:
        raise CatalogueError(f"{spec}: no model name after {library}:, e.g. {library}:{_EXAMPLES[library]}")
    options = {}
    for item in filter(None, query.split("&")):
        key, _, value = item.partition("=")
        options[key.strip()] = value.strip()
    return CatalogueSpec(library, name.strip(), options)


def with_full_size(spec: str) -> str:
    """The spec with ``full-size`` among its options when it is a catalogue spec (``--full-size``)."""
    parsed = parse(spec)
    if parsed is None or parsed.full_size:
        return spec
    return f"{spec}{'&' if '?' in spec else '?'}{FULL_SIZE}"


def build(spec: str) -> Built:
    """The model and example input a catalogue spec names (raises CatalogueError, one line)."""
    parsed = parse(spec)
    assert parsed is not None, spec
    builder = {"hf": _build_hf, "timm": _build_timm, "torchvision": _build_torchvision}[parsed.library]
    try:
        return builder(parsed)
    except CatalogueError as exc:
        raise CatalogueError(f"{spec}: {exc}") from None
    except ImportError as exc:
        raise CatalogueError(f"{spec}: needs the {_PACKAGES[parsed.library]} package ({exc})") from None


_EXAMPLES = {"hf": "llama", "timm": "convnext_tiny", "torchvision": "resnet18"}
_PACKAGES = {"hf": "transformers", "timm": "timm", "torchvision": "torchvision"}


def _value(text: str) -> Any:
    """A query value as the config wants it: ``4`` -> 4, ``1e4`` -> 10000.0, ``true`` -> True, else the string."""
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _first_that_runs(attempts: list[tuple[list[str], Callable[[], Built]]], what: str) -> Built:
    """The first attempt whose model builds and runs on its example input; else one line naming the changes
    of the first attempt (the one a user asked for) and what the library said."""
    import torch

    first_error = None
    for changes, attempt in attempts:
        try:
            built = attempt()
            if not any(parameter.is_meta for parameter in built.model.parameters()):  # (meta: shapes, no values)
                with torch.no_grad():
                    _call(built.model, built.inputs)
            return built
        except CatalogueError:  # the spec itself is wrong (an option the config lacks): no smaller model fixes it
            raise
        except Exception as exc:  # noqa: BLE001  (the library's own error, said on one line)
            if first_error is None:
                message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                changed = f" with {', '.join(changes)}" if changes else ""
                first_error = f"{what}{changed} does not build and run: {type(exc).__name__}: {message}"
    raise CatalogueError(first_error or f"{what} does not build")


def _call(model: Any, inputs: Any) -> Any:
    return model(**inputs) if isinstance(inputs, dict) else model(*inputs)


# -- transformers ------------------------------------------------------------------------------------------

def _build_hf(spec: CatalogueSpec) -> Built:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # configs come from the installed library, never the Hub
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

    if spec.name in CONFIG_MAPPING_NAMES:
        class_name = MODEL_MAPPING_NAMES.get(spec.name)
        if class_name is None:
            raise CatalogueError(f"transformers has no base model for model type {spec.name!r}; name a class, "
                                 f"e.g. hf:{CONFIG_MAPPING_NAMES[spec.name].replace('Config', 'Model')}")
        if isinstance(class_name, (tuple, list)):
            class_name = class_name[0]
    else:
        class_name = spec.name
    model_class = getattr(transformers, class_name, None)
    if not isinstance(model_class, type) or not hasattr(model_class, "config_class"):
        raise CatalogueError(f"{spec.name!r} is neither a transformers model type (e.g. llama) nor a model class "
                             "(e.g. LlamaForCausalLM)")
    requested = {key: _value(value) for key, value in spec.options.items() if key != FULL_SIZE}
    kinds = [] if spec.full_size else list(HF_SIZES)

    def attempt(kinds_used: list[str], changes: list[str]) -> Callable[[], Built]:
        def make() -> Built:
            import torch

            changes.clear()
            config = model_class.config_class()
            for kind in kinds_used:
                if kind not in requested:  # a size the user asked for is set as asked, not shrunk first
                    _shrink(config, kind, HF_SIZES[kind][1], changes)
            for key, value in requested.items():
                _set_option(config, key, value, changes)
            _quiet(config)
            torch.manual_seed(0)
            model = model_class(config).eval()
            inputs = _hf_inputs(model, config)
            return Built(model, inputs, _described(f"transformers {transformers.__version__} {class_name}",
                                                   changes, spec.full_size))
        return make

    attempts = []
    for kinds_used in _ladder(kinds):
        changes: list[str] = []
        attempts.append((changes, attempt(kinds_used, changes)))
    return _first_that_runs(attempts, class_name)


def _ladder(kinds: list[str]) -> list[list[str]]:
    """The kinds each attempt shrinks: all of them, then the width kinds undone together (a width alone would
    not divide by the old head count), then the others one by one from the last, down to none."""
    if not kinds:
        return [[]]
    others = [kind for kind in kinds if kind not in WIDTH_KINDS]
    return [kinds] + [others[:n] for n in range(len(others), -1, -1)]


def _configs(config: Any) -> list[Any]:
    """The config and every sub-config in it (a vision-text model's towers, an encoder-decoder's halves)."""
    from transformers import PretrainedConfig

    found = [config]
    for value in vars(config).values():
        if isinstance(value, PretrainedConfig):
            found.extend(_configs(value))
    return found


def _shrink(config: Any, kind: str, target: int, changes: list[str]) -> None:
    keys, _ = HF_SIZES[kind]
    for part in _configs(config):
        for key in keys:
            value = part.__dict__.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > target:
                new = _layers_kept(part, target) if kind == "layers" else target
                if new < value:
                    setattr(part, key, new)
                    changes.append(f"{_where(config, part)}{key} {value}->{new}")
                    if kind == "layers":
                        _cut_per_layer_lists(part, new)


def _layers_kept(config: Any, target: int) -> int:
    """At least ``target`` layers, and enough that every kind of layer a hybrid lists appears (Qwen3-Next's
    three linear-attention layers before its first full-attention one)."""
    for name in PER_LAYER_LISTS:
        kinds = config.__dict__.get(name)
        if isinstance(kinds, (list, tuple)) and kinds and all(isinstance(k, str) for k in kinds):
            firsts = {}
            for index, kind in enumerate(kinds):
                firsts.setdefault(kind, index)
            target = max(target, max(firsts.values()) + 1)
    return target


def _cut_per_layer_lists(config: Any, layers: int) -> None:
    for name in PER_LAYER_LISTS:
        value = config.__dict__.get(name)
        if isinstance(value, (list, tuple)) and len(value) > layers and all(isinstance(k, str) for k in value):
            setattr(config, name, type(value)(value[:layers]))


def _where(root: Any, part: Any) -> str:
    if part is root:
        return ""
    for name, value in vars(root).items():
        if value is part:
            return f"{name}."
    return f"{type(part).__name__}."


def _set_option(config: Any, key: str, value: Any, changes: list[str]) -> None:
    """A query option: a short name sets every key of its kind (in sub-configs too), another sets that key."""
    if key in HF_SIZES:
        if not isinstance(value, int) or value < 1:
            raise CatalogueError(f"option {key}={value!r}: expected a positive integer")
        for part in _configs(config):
            for name in HF_SIZES[key][0]:
                if isinstance(part.__dict__.get(name), int):
                    old = part.__dict__[name]
                    setattr(part, name, value)
                    changes.append(f"{_where(config, part)}{name} {old}->{value}")
                    if key == "layers":
                        _cut_per_layer_lists(part, value)
        return
    if not hasattr(config, key):
        raise CatalogueError(f"option {key!r}: {type(config).__name__} has no such key (short names: "
                             f"{', '.join(HF_SIZES)}, {FULL_SIZE})")
    changes.append(f"{key} {getattr(config, key)!r}->{value!r}")
    setattr(config, key, value)


def _quiet(config: Any) -> None:
    """No KV cache (not a tensor output) and eager attention where the model offers it, in every sub-config."""
    for part in _configs(config):
        if "use_cache" in part.__dict__:
            part.use_cache = False


def _hf_inputs(model: Any, config: Any) -> Any:
    """The keyword arguments for one forward: what ``main_input_name`` asks for."""
    inputs = _main_input(model, config)
    if "decoder_input_ids" in inspect.signature(model.forward).parameters and config.is_encoder_decoder:
        inputs["decoder_input_ids"] = _token_ids(config)
    return inputs


def _token_ids(config: Any) -> Any:
    import torch

    return torch.randint(0, min(_first_key(config, "vocab_size") or 100, 100), (1, TOKENS))


def _main_input(model: Any, config: Any) -> dict[str, Any]:
    import torch

    name = getattr(model, "main_input_name", "input_ids")
    if name == "input_ids":
        return {"input_ids": _token_ids(config)}
    if name == "pixel_values":
        channels = _first_key(config, "num_channels") or 3
        side = _first_key(config, "image_size") or IMAGE
        side = side[0] if isinstance(side, (list, tuple)) else side
        return {"pixel_values": torch.randn(1, channels, side, side)}
    if name == "input_values":
        return {"input_values": torch.randn(1, 4000)}
    if name == "input_features":
        bins = _first_key(config, "num_mel_bins") or 80
        positions = _first_key(config, "max_source_positions")
        frames = 2 * positions if isinstance(positions, int) else 100
        return {"input_features": torch.randn(1, bins, frames)}
    raise CatalogueError(f"no example input for {type(model).__name__}'s main input {name!r}; "
                         "write a factory that returns (model, inputs)")


def _first_key(config: Any, key: str) -> Any:
    for part in _configs(config):
        if part.__dict__.get(key) is not None:
            return part.__dict__[key]
    return None


# -- timm and torchvision ----------------------------------------------------------------------------------

TIMM_DEPTHS = {"depth": 2, "depths": 1, "layers": 1}  # a block or two per stage


def _build_timm(spec: CatalogueSpec) -> Built:
    import timm
    import torch

    if spec.name not in timm.list_models():
        raise CatalogueError(f"timm has no model {spec.name!r} (timm.list_models() lists them)")
    requested = {key: _value(value) for key, value in spec.options.items() if key != FULL_SIZE}
    pretrained = timm.models.get_pretrained_cfg(spec.name)
    shape = tuple(pretrained.input_size) if pretrained is not None else (3, IMAGE, IMAGE)

    def attempt(shrink: dict[str, Any]) -> Callable[[], Built]:
        def make() -> Built:
            torch.manual_seed(0)
            model = timm.create_model(spec.name, pretrained=False, **shrink, **requested).eval()
            taken = inspect.signature(type(model).__init__).parameters
            if any(key not in taken for key in shrink):  # a **kwargs that swallowed it: not a depth of this model
                raise CatalogueError(f"{type(model).__name__} takes no {', '.join(shrink)}")
            changes = [f"{key}={value}" for key, value in {**shrink, **requested}.items()]
            return Built(model, (torch.randn(1, *shape),),
                         _described(f"timm {timm.__version__} {spec.name}", changes, spec.full_size))
        return make

    attempts = []
    if not spec.full_size:
        for key, per_stage in TIMM_DEPTHS.items():
            for stages in ((None,) if key == "depth" else (4, 3, 5)):
                shrink = {key: per_stage if stages is None else (per_stage,) * stages}
                attempts.append(([f"{key}={shrink[key]}"], attempt(shrink)))
    attempts.append(([], attempt({})))
    return _first_that_runs(attempts, spec.name)


def _build_torchvision(spec: CatalogueSpec) -> Built:
    import torch
    import torchvision
    from torchvision import models

    if spec.name not in models.list_models():
        raise CatalogueError(f"torchvision has no model {spec.name!r} (torchvision.models.list_models() lists them)")
    requested = {key: _value(value) for key, value in spec.options.items() if key != FULL_SIZE}
    detection = spec.name in models.list_models(module=models.detection)
    video = spec.name in models.list_models(module=models.video)

    def make() -> Built:
        torch.manual_seed(0)
        backbone = {"weights_backbone": None} if detection or spec.name in models.list_models(
            module=models.segmentation) else {}
        model = models.get_model(spec.name, weights=None, **backbone, **requested).eval()
        image = torch.randn(1, 3, 8, 112, 112) if video else torch.randn(1, 3, IMAGE, IMAGE)
        inputs = ([image[0]],) if detection else (image,)
        changes = [f"{key}={value!r}" for key, value in requested.items()]
        return Built(model, inputs, _described(f"torchvision {torchvision.__version__} {spec.name}", changes,
                                               full_size=True))

    return _first_that_runs([([], make)], spec.name)


def _described(what: str, changes: list[str], full_size: bool) -> str:
    if changes:
        return f"{what}, random weights, default config with {', '.join(changes)}"
    return f"{what}, random weights, default config" + ("" if full_size else " (nothing to shrink)")
