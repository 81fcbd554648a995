"""runner/outputs/retrieval.py: seeded queries, exact top-k by cosine (own item left out, ties by index), the
asymmetric form, thumbnails of the untransformed images, one-line errors."""

import json
import os

import numpy as np
import pytest
import torch
from PIL import Image

from pml_extensions.runner.objects.data import Subset
from pml_extensions.runner.outputs.retrieval import dataset_image, embed, save_retrieval_examples

COLOURS = ("red", "pink", "blue", "navy", "green")


def _images(n=5, size=(12, 8)):
    return [Image.new("RGB", size, COLOURS[i % len(COLOURS)]) for i in range(n)]


def test_topk_by_cosine_hand_computed(tmp_path):
    emb = torch.tensor([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9], [-1.0, 0.0]])
    out = save_retrieval_examples(str(tmp_path), "t", emb, [0, 0, 1, 1, 2], _images().__getitem__, n_queries=5, k=3)
    expected_order = torch.randperm(5, generator=torch.Generator().manual_seed(0)).tolist()
    assert [q["index"] for q in out["queries"]] == expected_order
    by_query = {q["index"]: q for q in out["queries"]}
    # query 0 = (1, 0): cos with 1 = 0.9/sqrt(0.82), with 3 = 0.1/sqrt(0.82), with 2 = 0, with 4 = -1; itself excluded
    n0 = by_query[0]["neighbours"]
    assert [n["index"] for n in n0] == [1, 3, 2]
    assert [n["cosine"] for n in n0] == [round(0.9 / 0.82**0.5, 4), round(0.1 / 0.82**0.5, 4), 0.0]
    assert [n["same_class"] for n in n0] == [True, False, False] and [n["rank"] for n in n0] == [1, 2, 3]
    # query 4 = (-1, 0): 2 and 3 ... cos(4, 2) = 0 and cos(4, 3) = -0.1/sqrt(0.82), cos(4, 1) = -0.9/sqrt(.82)
    assert [n["index"] for n in by_query[4]["neighbours"]] == [2, 3, 1]
    assert all(q["index"] not in [n["index"] for n in q["neighbours"]] for q in out["queries"])
    with open(tmp_path / "retrieval" / "t.json") as f:
        assert json.load(f) == out


def test_ties_go_to_the_lower_index_and_k_is_clamped(tmp_path):
    emb = torch.tensor([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0], [2.0, 0.0]])  # all cosines 1
    out = save_retrieval_examples(str(tmp_path), "t", emb, [0, 1, 0, 1], _images(4).__getitem__, n_queries=4, k=9)
    assert out["k"] == 3
    for q in out["queries"]:
        assert [n["index"] for n in q["neighbours"]] == [i for i in range(4) if i != q["index"]]


def test_asymmetric_references_and_seeded_queries(tmp_path):
    queries = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], dtype=torch.float64)
    refs = torch.tensor([[0.0, 2.0], [3.0, 0.0], [1.0, 1.2]], dtype=torch.float64)
    out = save_retrieval_examples(
        str(tmp_path), "a", queries, [0, 1, 0], _images(3).__getitem__, refs, [1, 0, 0], _images(3).__getitem__,
        same_items=False, n_queries=1, k=3, seed=3,
    )  # fmt: skip
    (q,) = out["queries"]
    assert q["index"] == torch.randperm(3, generator=torch.Generator().manual_seed(3))[0].item()
    sims = torch.nn.functional.normalize(queries[q["index"]], dim=0) @ torch.nn.functional.normalize(refs, dim=1).T
    assert [n["index"] for n in q["neighbours"]] == torch.argsort(-sims, stable=True).tolist()
    again = save_retrieval_examples(
        str(tmp_path), "a", queries, [0, 1, 0], _images(3).__getitem__, refs, [1, 0, 0], same_items=False, n_queries=1,
        k=3, seed=3,
    )  # fmt: skip
    assert again == out


def test_thumbnails_and_class_names(tmp_path):
    emb = torch.eye(3)
    big = [Image.new("RGB", (400, 200), c) for c in ("red", "blue", "green")]
    out = save_retrieval_examples(str(tmp_path), "x", emb, [0, 1, 2], big.__getitem__, k=1, thumbnail=64,
                                  class_names=["cat", "dog", "fox"])  # fmt: skip
    for q in out["queries"]:
        with Image.open(tmp_path / "retrieval" / q["image"]) as im:
            assert im.size == (64, 32) and im.getpixel((5, 5)) == big[q["index"]].getpixel((0, 0))
        assert q["class"] == ["cat", "dog", "fox"][q["index"]]
    # a rerun replaces the old thumbnails
    (tmp_path / "retrieval" / "x" / "stale.png").write_bytes(b"")
    save_retrieval_examples(str(tmp_path), "x", emb, [0, 1, 2], big.__getitem__, k=1)
    assert "stale.png" not in os.listdir(tmp_path / "retrieval" / "x")


def test_dataset_image_follows_views_to_the_untransformed_item():
    class Base(torch.utils.data.Dataset):
        labels = np.array([0, 1, 2])

        def __getitem__(self, i):
            return Image.new("L", (4, 4), 50 * i), int(i)

        def __len__(self):
            return 3

    view = Subset(Base(), [2, 0], Base.labels, transform=lambda im: torch.zeros(3, 2, 2))
    image = dataset_image(torch.utils.data.Subset(view, [1, 0]), 1)  # view[0] = Base[2]
    assert image.mode == "RGB" and image.getpixel((0, 0)) == (100, 100, 100)
    tensor_set = [(torch.tensor([[[0.0, 2.0], [1.0, 2.0]]]), 0)]
    assert np.asarray(dataset_image(tensor_set, 0))[..., 0].tolist() == [[0, 255], [128, 255]]
    with pytest.raises(TypeError, match="dataset item 0"):
        dataset_image([("not an image", 0)], 0)


def test_embed_in_dataset_order_and_modes_restored():
    trunk, embedder = torch.nn.Flatten(), torch.nn.Linear(4, 2, bias=False)
    torch.nn.init.eye_(embedder.weight)
    trunk.train()
    data = [(torch.tensor([[float(i), 1.0], [0.0, 0.0]]), 0) for i in range(5)]
    out = embed(trunk, embedder, data, "cpu", batch_size=2)
    assert torch.equal(out, torch.tensor([[float(i), 1.0] for i in range(5)])) and trunk.training


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"name": "a/b"}, "name 'a/b'"),
        ({"query_embeddings": torch.zeros(3)}, r"expected \[N, D\]"),
        ({"query_labels": [0, 1]}, "3 queries with 2 labels"),
        ({"k": 0}, "at least 1"),
        ({"query_embeddings": torch.zeros(1, 2), "query_labels": [0]}, "at least one query and one other"),
    ],
)
def test_bad_input_is_one_line(tmp_path, kwargs, message):
    args = dict(folder=str(tmp_path), name="t", query_embeddings=torch.eye(3), query_labels=[0, 1, 2], query_image=None)
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        save_retrieval_examples(**args)
