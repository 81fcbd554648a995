"""utils/offline_weights.py: torchvision model functions with weights on disk only, a local state dict
(``weights_path``), one line for weights that would be downloaded; nothing downloads."""

import os
from unittest import mock

import pytest
import torch
import torchvision

from pml_extensions.runner.errors import ConfigError, MissingDataError
from pml_extensions.runner.objects.builder import Builder
from pml_extensions.utils.offline_weights import (
    check_offline_weights,
    load_weights_file,
    no_downloads,
    requested_weights,
    weights_file,
)

SMALL = torchvision.models.mobilenet_v3_small
SMALL_FILE = "mobilenet_v3_small-047dcff4.pth"  # torchvision's IMAGENET1K_V1 (= DEFAULT) file name


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """An empty torch hub folder, and a network that fails the test when touched."""
    monkeypatch.setattr(torch.hub, "_hub_dir", str(tmp_path / "hub"))
    network = mock.Mock(side_effect=AssertionError("the network was used"))
    monkeypatch.setattr(torch.hub, "download_url_to_file", network)
    return tmp_path / "hub" / "checkpoints"


def test_requested_weights_by_name_legacy_and_default():
    members = torchvision.models.MobileNet_V3_Small_Weights
    assert requested_weights(SMALL, {"weights": "DEFAULT"}) == [("weights", members.IMAGENET1K_V1)]
    assert requested_weights(SMALL, {"weights": "MobileNet_V3_Small_Weights.IMAGENET1K_V1"})[0][1] is members.DEFAULT
    assert requested_weights(SMALL, {"pretrained": True}) == [("weights", members.IMAGENET1K_V1)]
    assert requested_weights(SMALL, {}) == requested_weights(SMALL, {"pretrained": False}) == []
    detection = torchvision.models.detection.fasterrcnn_mobilenet_v3_large_fpn
    assert [a for a, _ in requested_weights(detection, {})] == ["weights_backbone"]  # torchvision's default
    assert os.path.basename(weights_file(members.DEFAULT)) == SMALL_FILE


def test_weights_not_on_disk_are_one_line_naming_the_file_the_offline_weights_and_weights_path(hub):
    with pytest.raises(FileNotFoundError) as e:
        check_offline_weights("mobilenet_v3_small", SMALL, {"weights": "DEFAULT"})
    message = str(e.value)
    assert "\n" not in message
    assert message.startswith(
        f"weights DEFAULT (MobileNet_V3_Small_Weights.IMAGENET1K_V1): not on disk ({hub / SMALL_FILE}) and nothing is "
        "downloaded at run time; offline weights here: "
    )
    assert message.endswith(
        f"or copy the file to {hub}, or point at a local state dict: {{mobilenet_v3_small: {{weights_path: "
        "/path/to/file.pth}}"
    )
    with pytest.raises(ValueError, match=r"weights 'DEFALT' is not one of .*; did you mean DEFAULT\?"):
        check_offline_weights("mobilenet_v3_small", SMALL, {"weights": "DEFALT"})


def test_the_builder_refuses_before_building_and_reads_a_file_on_disk(hub):
    spec = {"models": {"trunk": [{"mobilenet_v3_small": {"weights": "DEFAULT"}}]}}
    with mock.patch.object(torchvision.models.mobilenetv3, "_mobilenet_v3", side_effect=AssertionError("built")):
        with pytest.raises(MissingDataError, match=r"^config: models.trunk\[0\].mobilenet_v3_small: weights DEFAULT"):
            Builder(spec).build_models()
    torch.manual_seed(0)
    saved = SMALL().state_dict()
    os.makedirs(hub)
    torch.save(saved, hub / SMALL_FILE)  # as if torchvision had cached it
    trunk = Builder(spec).build_models()["trunk"]
    assert torch.equal(trunk[0].features[0][0].weight, saved["features.0.0.weight"])


def test_weights_path_loads_a_local_state_dict(hub, tmp_path):
    torch.manual_seed(0)
    saved = SMALL(num_classes=7).state_dict()
    path = tmp_path / "mine.pth"
    torch.save({"state_dict": {f"module.{k}": v for k, v in saved.items()}}, path)  # a DataParallel checkpoint
    spec = {"models": {"trunk": {"mobilenet_v3_small": {"weights_path": str(path), "num_classes": 7}}}}
    trunk = Builder(spec).build_models()["trunk"]
    assert all(torch.equal(trunk.state_dict()[k], v) for k, v in saved.items())
    with pytest.raises(ConfigError, match=r"mobilenet_v3_small: weights_path .*mine.pth does not fit MobileNetV3: "):
        Builder({"models": {"trunk": {"mobilenet_v3_small": {"weights_path": str(path)}}}}).build_models()
    both = {"models": {"trunk": {"mobilenet_v3_small": {"weights_path": str(path), "weights": "DEFAULT"}}}}
    with pytest.raises(ConfigError, match="weights_path and weights .* both give the weights; keep one"):
        Builder(both).build_models()
    with pytest.raises(MissingDataError, match=r"weights_path .*nope.pth is not a file"):
        Builder({"models": {"trunk": {"resnet18": {"weights_path": str(tmp_path / "nope.pth")}}}}).build_models()


def test_load_weights_file_refuses_what_does_not_fit(tmp_path):
    path = tmp_path / "w.pth"
    torch.save({"weight": torch.zeros(3, 2)}, path)
    with pytest.raises(ValueError, match=r"weight has shape \[3, 2\], the model's \[4, 2\]"):
        load_weights_file(torch.nn.Linear(2, 4, bias=False), str(path))
    torch.save([1, 2], path)
    with pytest.raises(ValueError, match="expected a state dict"):
        load_weights_file(torch.nn.Linear(2, 4), str(path))


def test_no_downloads_refuses_any_hub_download(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.hub, "_hub_dir", str(tmp_path))
    with no_downloads("models.trunk"):
        with pytest.raises(FileNotFoundError, match=r"^models.trunk would download https://example.invalid/w.pth to"):
            torch.hub.load_state_dict_from_url("https://example.invalid/w.pth", model_dir=str(tmp_path))
    assert torch.hub.download_url_to_file.__name__ == "download_url_to_file"  # put back
