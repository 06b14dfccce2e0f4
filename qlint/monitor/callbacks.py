""":func:`qlint.monitor` inside the Hugging Face ``Trainer`` and PyTorch Lightning.

``QlintTrainerCallback`` is a ``transformers.TrainerCallback``, ``QlintLightningCallback``
a Lightning ``Callback``; each class is built on first access, so this module imports
neither library until one is asked for (and says which to install when it is missing).
Both take a fixed batch (given, or the first training batch), measure it on every
evaluation and, with ``every_steps``, every that many optimizer steps, and log the
figures through the framework's own logging as ``qlint/<block>/stream_norm`` and
``qlint/<block>/gain@<s>`` (and any other figure of the records, :func:`qlint.monitor.logs.figures`; nan
for a non-finite figure); ``log=`` sends each record to a sink of :mod:`qlint.monitor.logs`
as well; the records themselves are in ``callback.monitor.records``. The warning's depth
signal is about the training dtype: float16 / bfloat16 under mixed precision, else the
parameters' dtype.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import torch

from qlint.monitor.logs import metrics
from qlint.monitor.stream import DEFAULT_SCALES, StreamMonitor

__all__ = ["QlintLightningCallback", "QlintTrainerCallback"]


def _on_device(inputs: tuple, model: torch.nn.Module) -> tuple:
    parameter = next(iter(model.parameters()), None)
    if parameter is None:
        return inputs
    return tuple(x.to(parameter.device) if isinstance(x, torch.Tensor) else x for x in inputs)


def _first_tensor_inputs(batch: Any) -> tuple:
    """A Lightning batch as the model's inputs: a tensor, or the first item of ``(x, y)``."""
    if isinstance(batch, torch.Tensor):
        return (batch,)
    if isinstance(batch, (tuple, list)) and batch and isinstance(batch[0], torch.Tensor):
        return (batch[0],)
    raise TypeError(f"cannot tell the model's inputs in a {type(batch).__name__} batch: give to_inputs=callable(batch) "
                    "-> tuple")


class _Adapter:
    """What both callbacks share: the fixed batch, the monitor, and measuring at a step."""

    def __init__(self, inputs: Any, every_steps: int, scales: Sequence[float], dtype: Optional[torch.dtype],
                 to_inputs: Optional[Callable[[Any], tuple]], log: Optional[Callable[[dict], None]] = None) -> None:
        if every_steps < 0:
            raise ValueError(f"every_steps must be 0 (evaluations only) or positive, not {every_steps}")
        self.inputs = inputs
        self.every_steps = every_steps
        self.scales = tuple(scales)
        self.dtype = dtype
        self.to_inputs = to_inputs
        self.sink = log  # not self.log: Lightning sets callback.log = pl_module.log
        self.monitor: Optional[StreamMonitor] = None

    def start(self, model: torch.nn.Module, first_batch: Callable[[], Any], dtype: Optional[torch.dtype]) -> None:
        """The monitor of ``model`` on the given batch, else on ``to_inputs(first_batch())``."""
        if self.monitor is not None:
            return
        inputs = self.inputs if self.inputs is not None else self.to_inputs(first_batch())  # type: ignore[misc]
        inputs = _on_device(tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,), model)
        self.monitor = StreamMonitor(model, inputs, scales=self.scales, dtype=self.dtype or dtype, log=self.sink)

    def due(self, step: int) -> bool:
        return bool(self.every_steps) and self.monitor is not None and step % self.every_steps == 0

    def measure(self, step: int) -> dict[str, float]:
        assert self.monitor is not None, "measure before start"
        return metrics(self.monitor.measure(step=step))


def _trainer_callback() -> type:
    try:
        from transformers import TrainerCallback
    except ImportError as exc:
        raise ImportError("QlintTrainerCallback needs transformers: pip install transformers") from exc

    class QlintTrainerCallback(_Adapter, TrainerCallback):
        """:func:`qlint.monitor` in a ``transformers.Trainer``: measures on ``on_evaluate`` and
        every ``every_steps`` steps, logs through ``trainer.log`` (``attach(trainer)``, or
        ``trainer=``), else into ``state.log_history``.

        ``inputs``: the fixed batch as the model's positional inputs; default: the first
        batch of the train dataloader, ``to_inputs(batch)`` (default: the model's main
        input, ``(batch["input_ids"],)`` for a language model). ``log``: a sink each record
        also goes to (:mod:`qlint.monitor.logs`: ``CSVLog``, ``TensorBoardLog``).
        """

        def __init__(self, inputs: Any = None, *, every_steps: int = 0, scales: Sequence[float] = DEFAULT_SCALES,
                     dtype: Optional[torch.dtype] = None, to_inputs: Optional[Callable[[Any], tuple]] = None,
                     trainer: Any = None, log: Optional[Callable[[dict], None]] = None) -> None:
            super().__init__(inputs, every_steps, scales, dtype, to_inputs, log)
            self.trainer = trainer

        def attach(self, trainer: Any) -> "QlintTrainerCallback":
            trainer.add_callback(self)
            self.trainer = trainer
            return self

        def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, train_dataloader: Any = None,
                           **kwargs: Any) -> None:
            if self.to_inputs is None:
                self.to_inputs = lambda batch: (batch[model.main_input_name],)
            dtype = torch.float16 if args.fp16 else torch.bfloat16 if args.bf16 else None
            self.start(model, lambda: next(iter(train_dataloader)), dtype)

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if self.due(state.global_step):
                self._log(state)

        def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if self.monitor is not None:
                self._log(state)

        def _log(self, state: Any) -> None:
            figures = self.measure(state.global_step)
            if self.trainer is not None:
                self.trainer.log(figures)
            else:
                state.log_history.append({**figures, "step": state.global_step})

    return QlintTrainerCallback


def _lightning_callback() -> type:
    try:
        from lightning.pytorch import Callback
    except ImportError:
        try:
            from pytorch_lightning import Callback
        except ImportError as exc:
            raise ImportError("QlintLightningCallback needs Lightning: pip install lightning") from exc

    class QlintLightningCallback(_Adapter, Callback):
        """:func:`qlint.monitor` in a Lightning ``Trainer``: measures at the end of every
        validation epoch (not the sanity check) and every ``every_steps`` optimizer steps,
        logs with ``pl_module.log_dict``.

        ``model``: the network whose blocks are measured (default: the LightningModule
        itself). ``inputs``: the fixed batch; default: ``to_inputs`` of the first training
        batch (default: the batch if it is a tensor, else its first item). ``log``: a sink
        each record also goes to (:mod:`qlint.monitor.logs`: ``CSVLog``, ``TensorBoardLog``).
        """

        def __init__(self, inputs: Any = None, *, model: Optional[torch.nn.Module] = None, every_steps: int = 0,
                     scales: Sequence[float] = DEFAULT_SCALES, dtype: Optional[torch.dtype] = None,
                     to_inputs: Optional[Callable[[Any], tuple]] = None,
                     log: Optional[Callable[[dict], None]] = None) -> None:
            super().__init__(inputs, every_steps, scales, dtype, to_inputs or _first_tensor_inputs, log)
            self.model = model

        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
            precision = str(trainer.precision)
            dtype = torch.bfloat16 if "bf16" in precision else torch.float16 if precision.startswith("16") else None
            self.start(self.model or pl_module, lambda: batch, dtype)

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            if self.due(trainer.global_step):
                pl_module.log_dict(self.measure(trainer.global_step))

        def on_validation_epoch_end(self, trainer: Any, pl_module: Any) -> None:
            if self.monitor is not None and not trainer.sanity_checking:
                pl_module.log_dict(self.measure(trainer.global_step))

    return QlintLightningCallback


_FACTORIES = {"QlintTrainerCallback": _trainer_callback, "QlintLightningCallback": _lightning_callback}


def __getattr__(name: str) -> Any:
    if name in _FACTORIES:
        cls = _FACTORIES[name]()
        globals()[name] = cls
        return cls
    raise AttributeError(f"module 'qlint.monitor.callbacks' has no attribute {name!r}")
