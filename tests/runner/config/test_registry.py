import pytest
import torch

from pml_extensions.runner.config import registry
from pml_extensions.runner.config.registry import (
    ROLES,
    classes_for_role,
    discover,
    find,
    package_classes,
    register,
)
from pml_extensions.runner.errors import ConfigError
from pml_extensions.runner.objects.builder import build


class TestRoles:
    @pytest.mark.parametrize(
        "role, module, name",
        [
            ("loss", "pml_extensions.losses.xml_wrapper", "XMLWrapper"),
            ("model", "pml_extensions.trunks.histogram_pooling", "HistogramPooling"),
            ("model", "pml_extensions.trunks.conv_net_body", "ConvNetBody"),
            ("model", "pml_extensions.runner.objects.mlp", "MLP"),
            ("accuracy_calculator", "pml_extensions.knn.chunked_accuracy_calculator", "ChunkedAccuracyCalculator"),
            (
                "accuracy_calculator",
                "pml_extensions.knn.asymmetric_accuracy_calculator",
                "AsymmetricAccuracyCalculator",
            ),
            ("dataset", "pml_extensions.datasets.glyph_dataset", "GlyphDataset"),
        ],
    )
    def test_plugin_classes_found_under_their_role(self, role, module, name):
        import importlib

        cls = getattr(importlib.import_module(module), name)
        assert classes_for_role(role)[name] is cls
        assert classes_for_role(role, include_stock=False)[name] is cls
        assert cls in classes_for_role(role).values()

    def test_every_package_class_has_a_role_or_is_a_tool(self):
        # every loss / trunk / trainer / tester / dataset class of the package is found under its role
        by_module = {
            "pml_extensions.losses": "loss",
            "pml_extensions.trunks": "model",
            "pml_extensions.trainers": "trainer",
            "pml_extensions.testers": "tester",
            "pml_extensions.datasets": "dataset",
        }
        for name, cls in package_classes().items():
            for prefix, role in by_module.items():
                if (
                    cls.__module__.startswith(prefix)
                    and issubclass(cls, (torch.nn.Module, torch.utils.data.Dataset))
                    or (cls.__module__.startswith(prefix) and role in ("trainer", "tester"))
                ):
                    assert name in classes_for_role(role), (name, role)

    def test_stock_classes_are_the_same_objects(self):
        from pytorch_metric_learning import losses, miners, testers

        assert classes_for_role("loss")["ContrastiveLoss"] is losses.ContrastiveLoss
        assert classes_for_role("miner")["MultiSimilarityMiner"] is miners.MultiSimilarityMiner
        assert classes_for_role("tester")["GlobalEmbeddingSpaceTester"] is testers.GlobalEmbeddingSpaceTester
        assert "RMSprop" in classes_for_role("optimizer")
        assert "MPerClassSampler" in classes_for_role("sampler")
        assert "HookContainer" in classes_for_role("hook")
        assert "ContrastiveLoss" not in classes_for_role("model")

    def test_unknown_role_and_name(self):
        with pytest.raises(ValueError, match="role must be one of"):
            classes_for_role("losses")
        with pytest.raises(ConfigError, match="unknown class 'Nope'"):
            find("loss", "Nope")


class TestRegister:
    def test_decorator_registers_role_and_config_name(self):
        @register(role="loss")
        class MyUserLoss(torch.nn.Module):
            def forward(self, embeddings, labels=None):
                return embeddings.sum() * 0

        assert find("loss", "MyUserLoss") is MyUserLoss
        assert isinstance(build({"MyUserLoss": {}}), MyUserLoss)

    def test_plain_call_with_name(self):
        def make_head(width=4):
            return torch.nn.Linear(width, 2)

        assert register(make_head, role="model", name="MyHead") is make_head
        assert build({"MyHead": {"width": 3}}).in_features == 3

    def test_errors(self):
        with pytest.raises(ValueError):
            register(torch.nn.Linear, role="widget")
        with pytest.raises(TypeError):
            register(3, role="loss")

    def test_discover_makes_unexported_classes_nameable(self):
        discover()
        for name in package_classes():
            assert registry.resolve(name) is not None

    def test_roles_constant(self):
        assert {"loss", "model", "trainer", "tester", "accuracy_calculator", "hook", "dataset"} <= set(ROLES)


def test_every_named_module_exists():
    import importlib

    names = set(registry.SEARCH_MODULES) | set(registry.SCANNED_PACKAGES)
    names |= {m for mods in registry.ROLE_MODULES.values() for m in mods}
    names |= {m for mods in registry.ROLE_PLACES.values() for m in mods}
    for name in sorted(names):
        importlib.import_module(name)  # no names of subpackages that do not exist


def test_one_store_and_one_register():
    class OneStoreLoss(torch.nn.Module):
        def forward(self, embeddings, labels):
            return embeddings.sum()

    assert register(OneStoreLoss, name="OneStoreAlias", role="loss") is OneStoreLoss
    assert registry._REGISTRY["OneStoreAlias"] == (OneStoreLoss, "loss")
    assert classes_for_role("loss")["OneStoreAlias"] is OneStoreLoss
    assert registry.resolve("OneStoreAlias") is OneStoreLoss


@pytest.mark.parametrize(
    "name, nearest",
    [
        ("resnt50", "resnet50"),
        ("Resnet50", "resnet50"),
        ("SmallResnet", "SmallResNet"),
        ("mobilenetv2_features", "mobilenet_v2_features"),
    ],
)
def test_a_misspelled_model_name_gets_did_you_mean(name, nearest):
    from pml_extensions.runner.config.registry import resolve

    with pytest.raises(ConfigError) as e:
        resolve(name, "command line: models.trunk")
    assert str(e.value).startswith(f"command line: models.trunk: unknown class {name!r}; did you mean {nearest}? (")


def test_a_name_far_from_any_gets_no_guess():
    from pml_extensions.runner.config.registry import resolve

    with pytest.raises(ConfigError, match=r"unknown class 'qqqzzz' \(searched"):
        resolve("qqqzzz")
