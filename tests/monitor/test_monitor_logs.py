"""qlint.monitor.logs: the CSV and TensorBoard sinks, read back, on their own and under the Hugging Face
Trainer / Lightning callbacks (whose own loggers get the same figures)."""

from __future__ import annotations

import csv
import glob
import math
import os
import subprocess
import sys

import pytest
import torch
from torch import nn

import qlint
from conftest import ROOT
from qlint.monitor.logs import CSVLog, TensorBoardLog, fan_out, figures, metrics


class MLP(nn.Module):
    """x + W2 relu(W1 x)."""

    def __init__(self, width: int = 6) -> None:
        super().__init__()
        self.w1 = nn.Linear(width, 2 * width)
        self.w2 = nn.Linear(2 * width, width)

    def forward(self, x):
        return x + self.w2(torch.relu(self.w1(x)))


class Stack(nn.Module):
    def __init__(self, depth: int = 2, width: int = 6) -> None:
        super().__init__()
        self.layers = nn.ModuleList(MLP(width) for _ in range(depth))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


BLOCKS = ["layers.0", "layers.1"]


def _train(log, steps: int = 4, scales=(1.0, 4.0)) -> list[dict]:
    """A few SGD steps of a 2-block residual MLP, measured at every step; its records."""
    torch.manual_seed(0)
    model = Stack()
    x, y = torch.randn(8, 6), torch.randn(8, 6)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    mon = qlint.monitor(model, (x,), scales=scales, log=log)
    for _ in range(steps):
        optimizer.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        mon.step()
    return mon.records


def _read_csv(path) -> list[dict]:
    with open(path, newline="") as file:
        return list(csv.DictReader(file))


def _as_csv(record: dict) -> dict:
    """The CSV row of a record: its step, block and every figure (whatever fields the records carry)."""
    assert record["stream_norm"] is not None and set(figures(record)) >= {"stream_norm", "gain@1", "gain@4"}
    return {"step": str(record["step"]), "block": record["block"],
            **{name: "" if value is None else repr(value) for name, value in figures(record).items()}}


def _scalars(log_dir) -> dict[str, list[tuple[int, float]]]:
    """Every scalar under ``log_dir`` (all event files, searched recursively): tag -> [(step, value)]."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict[str, list[tuple[int, float]]] = {}
    files = sorted(glob.glob(os.path.join(str(log_dir), "**", "events.out.tfevents.*"), recursive=True))
    assert files, f"no event file under {log_dir}"
    for path in files:
        events = EventAccumulator(path, size_guidance={"scalars": 0})
        events.Reload()
        for tag in events.Tags()["scalars"]:
            out.setdefault(tag, []).extend((e.step, e.value) for e in events.Scalars(tag))
    return out


# --- the figures ----------------------------------------------------------------------------


def test_figures_are_every_numeric_field_and_every_entry_of_a_dict_field():
    record = {"step": 3, "block": "layers.0", "stream_norm": 2.5, "gain": {"1": 0.5, "4": None},
              "overflow_iterations": 7, "warning": "text is no figure", "flag": True, "extra": {"a": 1}}
    assert figures(record) == {"stream_norm": 2.5, "gain@1": 0.5, "gain@4": None, "overflow_iterations": 7.0,
                               "flag": 1.0, "extra@a": 1.0}
    assert list(figures(record)) == ["stream_norm", "gain@1", "gain@4", "overflow_iterations", "flag", "extra@a"]
    flat = metrics([record, {**record, "block": "layers.1", "stream_norm": None}])
    assert flat["qlint/layers.0/gain@1"] == 0.5 and math.isnan(flat["qlint/layers.0/gain@4"])
    assert flat["qlint/layers.0/overflow_iterations"] == 7.0 and flat["qlint/layers.1/extra@a"] == 1.0
    assert math.isnan(flat["qlint/layers.1/stream_norm"])
    assert len(flat) == 12 and not any("warning" in tag or "step" in tag for tag in flat)


# --- CSV --------------------------------------------------------------------------------------


def test_csv_log_has_one_flushed_row_per_step_and_block_equal_to_the_records(tmp_path):
    path = tmp_path / "qlint.csv"
    sink = CSVLog(path)
    records = _train(sink)
    assert len(records) == 8 and len({(r["step"], r["block"]) for r in records}) == 8
    assert records[0]["gain"] != records[-2]["gain"]  # training moved the figures
    rows = _read_csv(path)  # still open: every row is already on disk
    assert list(rows[0])[:5] == ["step", "block", "stream_norm", "gain@1", "gain@4"]
    assert list(rows[0])[2:] == list(figures(records[0]))  # any further numeric field of the records, too
    assert rows == [_as_csv(r) for r in records]
    assert [(int(r["step"]), r["block"]) for r in rows] == [(s, b) for s in (1, 2, 3, 4) for b in BLOCKS]
    assert [float(r["gain@4"]) for r in rows] == [r["gain"]["4"] for r in records]
    sink.close()
    assert path.read_text().count("step,block") == 1


def test_csv_log_appends_under_the_same_header_and_refuses_another(tmp_path):
    path = tmp_path / "runs" / "qlint.csv"
    with CSVLog(path) as sink:
        first = _train(sink, steps=2)
    with CSVLog(path) as sink:
        second = _train(sink, steps=3)
    rows = _read_csv(path)
    assert rows == [_as_csv(r) for r in first + second] and len(rows) == 10
    assert path.read_text().count("step,block") == 1
    before = path.read_text()
    with CSVLog(path) as sink, pytest.raises(ValueError, match=r"columns \['step', 'block', 'stream_norm', 'gain@1', "
                                                              r"'gain@4'.*\], these records .*'gain@8'"):
        _train(sink, steps=1, scales=(1.0, 8.0))
    assert path.read_text() == before


def test_csv_log_writes_an_empty_cell_for_none_and_drops_a_late_figure_with_a_warning(tmp_path):
    path = tmp_path / "qlint.csv"
    with CSVLog(path) as sink:
        sink({"step": 1, "block": "b", "stream_norm": None, "gain": {"1": None, "4": 0.25}, "note": "skipped"})
        with pytest.warns(RuntimeWarning, match="no column for late"):
            sink({"step": 2, "block": "b", "stream_norm": 3.0, "gain": {"1": 1.0}, "late": 5})
    assert _read_csv(path) == [{"step": "1", "block": "b", "stream_norm": "", "gain@1": "", "gain@4": "0.25"},
                               {"step": "2", "block": "b", "stream_norm": "3.0", "gain@1": "1.0", "gain@4": ""}]


# --- TensorBoard ------------------------------------------------------------------------------


def test_tensorboard_log_writes_every_figure_at_its_step(tmp_path):
    pytest.importorskip("tensorboard")
    csv_path = tmp_path / "qlint.csv"
    with TensorBoardLog(tmp_path / "tb") as to_tb, CSVLog(csv_path) as to_csv:
        assert to_tb.owns_writer
        records = _train(fan_out(to_tb, to_csv))
        to_tb({"step": 9, "block": "layers.0", "stream_norm": None, "gain": {"1": None, "4": None}})
    scalars = _scalars(tmp_path / "tb")
    assert sorted(scalars) == sorted(f"qlint/{b}/{f}" for b in BLOCKS for f in figures(records[0]))
    assert {"qlint/layers.0/stream_norm", "qlint/layers.1/gain@4"} <= set(scalars)
    for block in BLOCKS:
        mine = [r for r in records if r["block"] == block]
        assert [step for step, _ in scalars[f"qlint/{block}/gain@4"]][:4] == [1, 2, 3, 4]
        assert [v for _, v in scalars[f"qlint/{block}/gain@4"]][:4] == pytest.approx([r["gain"]["4"] for r in mine],
                                                                                    rel=1e-6)
        assert [v for _, v in scalars[f"qlint/{block}/stream_norm"]][:4] == pytest.approx(
            [r["stream_norm"] for r in mine], rel=1e-6)
    step, value = scalars["qlint/layers.0/stream_norm"][-1]
    assert step == 9 and math.isnan(value)
    assert len(_read_csv(csv_path)) == len(records) == 8  # fan_out: both sinks got every record


def test_tensorboard_log_uses_a_given_writer_and_leaves_it_open():
    class Writer:
        def __init__(self) -> None:
            self.calls: list[tuple] = []

        def add_scalar(self, tag, value, step):
            self.calls.append((tag, value, step))

        def flush(self):
            self.calls.append(("flush",))

        def close(self):
            self.calls.append(("close",))

    writer = Writer()
    sink = TensorBoardLog(writer)
    sink({"step": 4, "block": "b", "stream_norm": 2.0, "gain": {"1": 0.5, "4": 8.0}, "overflow_iterations": 3})
    sink.close()
    assert not sink.owns_writer
    assert writer.calls == [("qlint/b/stream_norm", 2.0, 4), ("qlint/b/gain@1", 0.5, 4), ("qlint/b/gain@4", 8.0, 4),
                            ("qlint/b/overflow_iterations", 3.0, 4), ("flush",)]


def test_importing_the_sinks_does_not_import_tensorboard_and_a_missing_one_says_what_to_install(tmp_path):
    code = ("import sys, qlint, qlint.monitor.logs\n"
            "print(any(m.split('.')[0] == 'tensorboard' for m in sys.modules))\n"
            "sys.modules['tensorboard'] = None\n"
            "try:\n"
            f"    qlint.monitor.logs.TensorBoardLog({str(tmp_path)!r})\n"
            "except ImportError as exc:\n"
            "    print(exc)\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["False", "qlint TensorBoardLog needs tensorboard: pip install tensorboard"]


# --- the framework callbacks, for real ------------------------------------------------------


def _lightning():
    try:
        import lightning.pytorch as lightning
    except ImportError:
        lightning = pytest.importorskip("pytorch_lightning")
    return lightning


def _fit_lightning(lightning, callback, logger):
    from torch.utils.data import DataLoader, TensorDataset

    class Module(lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = Stack()

        def training_step(self, batch, batch_idx):
            x, y = batch
            return nn.functional.mse_loss(self.net(x), y)

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.log("val_loss", nn.functional.mse_loss(self.net(x), y))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.5)

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(12, 6), torch.randn(12, 6))
    module = Module()
    callback.model = module.net
    trainer = lightning.Trainer(max_steps=3, accelerator="cpu", callbacks=[callback], logger=logger,
                                enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                                num_sanity_val_steps=0, log_every_n_steps=1)
    trainer.fit(module, DataLoader(data, batch_size=4), DataLoader(data, batch_size=4))
    return callback.monitor.records, trainer


def test_lightning_callback_sends_its_records_to_the_sink(tmp_path):
    lightning = _lightning()
    from qlint.monitor.callbacks import QlintLightningCallback

    with CSVLog(tmp_path / "qlint.csv") as sink:
        records, trainer = _fit_lightning(lightning, QlintLightningCallback(every_steps=1, log=sink), logger=False)
    # steps 1, 2, 3, then the validation at the end of the (3-batch) epoch
    assert [(r["step"], r["block"]) for r in records] == [(s, b) for s in (1, 2, 3, 3) for b in BLOCKS]
    assert _read_csv(tmp_path / "qlint.csv") == [_as_csv(r) for r in records]
    last = records[-1]  # what pl_module.log_dict gave Lightning last
    assert trainer.callback_metrics[f"qlint/{last['block']}/gain@4"].item() == pytest.approx(last["gain"]["4"], rel=1e-5)


@pytest.mark.parametrize("kind", ["csv", "tensorboard"])
def test_lightning_loggers_get_the_qlint_figures(tmp_path, kind):
    lightning = _lightning()
    from qlint.monitor.callbacks import QlintLightningCallback

    if kind == "csv":
        logger = lightning.loggers.CSVLogger(str(tmp_path), name="run", version=0)
    else:
        pytest.importorskip("tensorboard")
        logger = lightning.loggers.TensorBoardLogger(str(tmp_path), name="run", version=0)
    records, _ = _fit_lightning(lightning, QlintLightningCallback(every_steps=1), logger)
    tag = "qlint/layers.1/gain@4"
    expected = [r["gain"]["4"] for r in records if r["block"] == "layers.1"]
    if kind == "csv":
        rows = [row for row in _read_csv(tmp_path / "run" / "version_0" / "metrics.csv") if row.get(tag)]
        assert {"qlint/layers.0/stream_norm", "qlint/layers.0/gain@1"} <= set(rows[0])
        logged = [(int(row["step"]), float(row[tag])) for row in rows]
    else:
        logged = _scalars(tmp_path / "run" / "version_0")[tag]
    # the three training steps and the validation at the end; Lightning stores float32 and logs a training
    # batch's figures at the count of steps before it (as it does the loss): qlint's step 1 is its step 0
    assert [step for step, _ in logged] == [0, 1, 2, 2]
    assert [value for _, value in logged] == pytest.approx(expected, rel=1e-6) and len(expected) == 4


def test_hugging_face_trainer_reports_the_qlint_figures_to_tensorboard(tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")  # the Trainer needs it on torch
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    log_dir = tmp_path / "tb"
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(log_dir))  # transformers >= 5; older ones take logging_dir
    import dataclasses

    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    from qlint.monitor.callbacks import QlintTrainerCallback

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, n_positions=16, vocab_size=32, bos_token_id=0,
                                       eos_token_id=0))
    ids = torch.randint(32, (8, 12))
    data = [{"input_ids": row, "labels": row} for row in ids]
    extra = {"logging_dir": str(log_dir)} if "logging_dir" in {f.name for f in dataclasses.fields(TrainingArguments)} else {}
    args = TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=2, per_device_train_batch_size=4,
                             report_to=["tensorboard"], use_cpu=True, logging_steps=10, save_strategy="no",
                             disable_tqdm=True, **extra)
    with CSVLog(tmp_path / "qlint.csv") as sink:
        callback = QlintTrainerCallback(every_steps=1, log=sink)
        trainer = Trainer(model=model, args=args, train_dataset=data)
        callback.attach(trainer)
        trainer.train()
    records = callback.monitor.records
    blocks = ["transformer.h.0:attn", "transformer.h.0:mlp"]
    assert [(r["step"], r["block"]) for r in records] == [(s, b) for s in (1, 2) for b in blocks]
    assert _read_csv(tmp_path / "qlint.csv") == [_as_csv(r) for r in records]
    scalars = _scalars(log_dir)
    for record in records:  # the Trainer's TensorBoard callback puts train/ before a training log's keys
        for figure, value in figures(record).items():
            step, logged = scalars[f"train/qlint/{record['block']}/{figure}"][record["step"] - 1]
            assert step == record["step"]
            assert math.isnan(logged) if value is None else logged == pytest.approx(value, rel=1e-6)
