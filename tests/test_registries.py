"""The extension points' registries drive everything that offers, validates or builds their entries: MC kinds
(spec, CLI, builder, export, bundle check, training rules), optimizers (CLI, trainer) and notification
channels (cloud config, notifier). A throwaway entry registered within a test is taken up where the registry
is read at run time."""

from __future__ import annotations

import argparse
import pkgutil
import threading
from types import ModuleType

import pytest
import torch
from pydantic import Field
from support import notification
from torch import nn

from cloud.config import CloudConfig, notification_keys
from cloud.notify import CHANNELS, ChannelType, Message, Notifier, Tally
from filterforward.commands import demo, train
from models.bundle import check_mc_model
from models.errors import FilterForwardError
from models.filterspec import FilterSpec
from models.mc_export import export_mc, verify_export
from models.mc_kinds import MC_KINDS, MCKind
from models.microclassifiers import MicroClassifier, build_mc
from models.optimizer_kinds import OPTIMIZERS, OptimizerKind
from models.optimizers import CompressedOptimizer
from models.training import TrainConfig, make_optimizer, parse_curriculum

SIZE = (64, 32)


def command(module: ModuleType, name: str) -> argparse.ArgumentParser:
    """The subcommand's parser, built now (so from the registries as they are now)."""
    subparsers = argparse.ArgumentParser().add_subparsers()
    module.register(subparsers)
    return subparsers.choices[name]


def train_args(*args: str) -> argparse.Namespace:
    return command(train, "train").parse_args(["dataset", "--out", "out", *args])


# --- MC kinds -------------------------------------------------------------------------------------------


class Tiny(MicroClassifier):
    """A throwaway kind: one 1x1 conv, averaged over the cells."""

    architecture = "tiny"

    def __init__(self, channels: int, crop_hw: tuple[int, int], mask: object = None):
        super().__init__()
        self.conv = nn.Conv2d(channels, 1, 1)
        self.set_mask(mask)

    def logits(self, features: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        return self.conv(self.masked(features)).mean(dim=(1, 2, 3))


def test_the_spec_and_the_cli_offer_exactly_the_registered_kinds() -> None:
    assert FilterSpec.model_json_schema()["properties"]["architecture"]["enum"] == list(MC_KINDS)
    arch = next(a for a in command(train, "train")._actions if a.dest == "arch")
    assert arch.choices == (train.AUTO, *MC_KINDS)
    assert next(a for a in command(demo, "demo")._actions if a.dest == "arch").choices == arch.choices


@pytest.mark.parametrize("name", list(MC_KINDS))
def test_every_kind_is_built_exported_and_accepted_as_its_spec_says(name: str) -> None:
    kind = MC_KINDS[name]
    spec = FilterSpec(name="f", architecture=name, tap=kind.default_tap, input_size=SIZE, window=3)
    crop = (3 if kind.reads_pixels else 8, 4, 6)
    model = build_mc(name, crop[0], crop[1:], spec.window)
    assert type(model) is pkgutil.resolve_name(kind.model) and model.architecture == name
    check_mc_model(spec, export_mc(model, crop), crop)  # windowed kinds carry their history in and out
    config = TrainConfig(event="e", architecture=name, input_size=SIZE, window=3)
    assert (config.tap_name, config.context) == (kind.default_tap, 3 if kind.windowed else 1)
    assert train_args("--arch", name).arch == name


def test_a_registered_kind_is_built_exported_offered_and_trained_by_its_flags(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(MC_KINDS, "tiny", MCKind("tiny", f"{__name__}:Tiny", "early"))
    model = build_mc("tiny", 8, (4, 6))
    assert isinstance(model, Tiny)
    assert verify_export(model, export_mc(model, (8, 4, 6)), (8, 4, 6)) <= 1e-5
    assert train_args("--arch", "tiny").arch == "tiny"
    config = TrainConfig(event="e", architecture="tiny", input_size=SIZE)
    assert (config.tap_name, config.context) == ("early", 1)


# --- optimizers -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_every_optimizer_is_offered_made_by_name_and_steps(name: str) -> None:
    kind = OPTIMIZERS[name]
    model = nn.Linear(4, 1)
    optimizer = make_optimizer(name, model.parameters(), 1e-3, 10)
    assert type(optimizer) is pkgutil.resolve_name(kind.optimizer)
    assert isinstance(optimizer, CompressedOptimizer) == kind.compressed  # compressed ones skip DDP
    model(torch.randn(8, 4)).square().mean().backward()
    optimizer.step()
    assert name in command(train, "train").format_help()


def test_stages_are_sized_for_the_budget_and_start_after_the_curricula() -> None:
    params = [nn.Parameter(torch.zeros(3))]
    curricula = (parse_curriculum("window:fixed_linear:2:5:10"),)  # full difficulty from step 10
    assert make_optimizer("onebit_adam", params, 1e-3, 100).freeze_step == 20
    assert make_optimizer("onebit_adam", params, 1e-3, 100, curricula).freeze_step == 29
    zeroone = make_optimizer("zeroone_adam", params, 1e-3, 100, curricula)
    assert (zeroone.var_freeze_step, zeroone.local_step_scaler) == (59, 5)
    lamb = make_optimizer("onebit_lamb", params, 1e-3, 100)
    assert (lamb.freeze_step, lamb.param_groups[0]["lr"]) == (20, pytest.approx(1e-2))


def test_a_registered_optimizer_is_offered_and_made(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(OPTIMIZERS, "sgd", OptimizerKind("sgd", "torch.optim:SGD", lr_scale=2.0))
    optimizer = make_optimizer("sgd", [nn.Parameter(torch.zeros(3))], 0.1, 10)
    assert isinstance(optimizer, torch.optim.SGD) and optimizer.param_groups[0]["lr"] == pytest.approx(0.2)
    help_text = " ".join(command(train, "train").format_help().split())
    assert "sgd, or a communication-compressed one" in help_text and "sgd uses 2x this" in help_text


def test_unknown_names_are_refused_with_the_registered_ones() -> None:
    with pytest.raises(FilterForwardError, match=r"'yolo': choose one of full_frame, localized, windowed, discrete$"):
        build_mc("yolo", 8, (4, 6))
    with pytest.raises(FilterForwardError, match=r"'sgd': choose one of adam, onebit_adam, zeroone_adam, onebit_lamb$"):
        make_optimizer("sgd", [nn.Parameter(torch.zeros(3))], 1e-3, 10)


# --- notification channels ------------------------------------------------------------------------------


class Memory:
    """A throwaway sender: keeps the topics it is sent."""

    def __init__(self, name: str, tally: Tally) -> None:
        self.name = f"memory {name}"
        self.tally = tally
        self.topics: list[str] = []
        self.closed = False

    def send(self, message: Message, stop: threading.Event) -> None:
        self.topics.append(message.topic)
        self.tally.sent()

    def close(self, deadline: float) -> None:
        self.closed = True


def test_the_cloud_config_has_a_key_per_channel_type_and_the_counts_theirs() -> None:
    assert set(CHANNELS) == {"mqtt", "webhooks"} and set(CHANNELS) <= set(CloudConfig.model_fields)
    config = CloudConfig(tokens=[{"name": "t", "token": "t" * 16}], zmq={"insecure": True})
    notifier = Notifier(config, "http://cloud.test")
    notifier.close()
    assert list(notifier.counts) == ["mqtt_published", "mqtt_failed", "webhook_sent", "webhook_failed", "dropped"]


def test_a_registered_channel_gets_its_config_key_its_counters_and_every_event(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    senders: list[Memory] = []

    def open_memory(names: list[str], tally: Tally) -> list[Memory]:
        opened = [Memory(name, tally) for name in names]
        senders.extend(opened)
        return opened

    channel = ChannelType("memory", (list[str], Field(default_factory=list)), ("kept", "lost"), open_memory)
    monkeypatch.setitem(CHANNELS, "memory", channel)
    notifier = Notifier(notification_keys()(memory=["a", "b"]), "http://cloud.test")
    notifier.publish(notification("start", camera="front/door", filter_name="cars"))
    notifier.close()
    assert [(s.topics, s.closed) for s in senders] == [(["front_door/cars/start"], True)] * 2
    assert (notifier.counts["kept"], notifier.counts["lost"], notifier.counts["dropped"]) == (2, 0, 0)
