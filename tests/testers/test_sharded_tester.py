import json
import os
import subprocess
import sys

import pytest
import torch

from pml_extensions.testers import AsymmetricTester
from pml_extensions.utils.sharded_embedding import shard_bounds

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "tests", "testers", "distributed_eval_script.py")


def _run(cmd, out):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([REPO] + sys.path))
    env.pop("WORLD_SIZE", None)
    proc = subprocess.run(cmd + [SCRIPT, out], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.load(open(out))


def test_two_gloo_processes_equal_one_process(tmp_path):
    """Each rank embeds only its shard (37 + 22 images per model: 18 + 11 / 19 + 11), results equal one process."""
    from tests.testers.distributed_eval_script import run

    # the one-process reference in this process (what the script alone writes: run()'s result through JSON);
    # torchrun starts the two ranks
    with torch.random.fork_rng(devices=[]):
        one = json.loads(json.dumps(run()))
    ranks = _run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"],
        str(tmp_path / "two.json"),
    )
    assert [r["world_size"] for r in ranks] == [2, 2]
    # plain tester: student embeds val + train once; asymmetric tester: student and teacher embed both once
    assert one["embedded"] == {"student": 2 * (37 + 22), "teacher": 37 + 22}
    for rank, r in enumerate(ranks):
        (lo_v, hi_v), (lo_t, hi_t) = shard_bounds(37, rank, 2), shard_bounds(22, rank, 2)
        shard = hi_v - lo_v + hi_t - lo_t
        assert r["embedded"] == {"student": 2 * shard, "teacher": shard}
        for key in ("plain", "asymmetric"):
            for split, accs in one[key].items():
                assert set(r[key][split]) == set(accs)
                for metric, value in accs.items():
                    assert r[key][split][metric] == pytest.approx(value, rel=1e-12), (key, split, metric)
        assert r["direct"] == pytest.approx(one["direct"], rel=1e-12)
    assert "mean_average_precision_trapezoidal_level0" in one["asymmetric"]["val"]


class Images(torch.utils.data.Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.y = torch.arange(n) % 3
        self.x = torch.randn(3, 4, generator=g)[self.y] + torch.randn(n, 4, generator=g)

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def test_several_reference_sets_each_embedded_once():
    data = {"test": Images(12, 0), "val": Images(9, 1)}
    torch.manual_seed(0)
    student, teacher = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)
    seen = {"student": 0, "teacher": 0}
    student.register_forward_hook(lambda m, i, o: seen.__setitem__("student", seen["student"] + len(o)))
    teacher.register_forward_hook(lambda m, i, o: seen.__setitem__("teacher", seen["teacher"] + len(o)))
    tester = AsymmetricTester(data_device=torch.device("cpu"), dataloader_num_workers=0, batch_size=5)
    sets = {"test": ["test"], "test+val": ["val", "test"], "val": ["val"]}
    out = tester.test_reference_sets(
        data, 3, student, query_split="test", reference_sets=sets, reference_trunk_model=teacher
    )
    assert seen == {"student": 12, "teacher": 21}  # queries once by the student, each split once by the teacher
    q, ql = tester.get_all_embeddings(data["test"], student)
    t, tl = tester.get_all_embeddings(data["test"], teacher)
    v, vl = tester.get_all_embeddings(data["val"], teacher)
    calc = tester.accuracy_calculator
    want = {
        "test": calc.get_accuracy(q, ql[:, 0], t, tl[:, 0], ref_includes_query=True),
        "test+val": calc.get_accuracy(q, ql[:, 0], torch.cat([t, v]), torch.cat([tl, vl])[:, 0], True),
        "val": calc.get_accuracy(q, ql[:, 0], v, vl[:, 0]),
    }
    for name, accs in want.items():
        assert out[name]["epoch"] == 3
        for metric, value in accs.items():
            assert out[name][f"{metric}_level0"] == pytest.approx(value, rel=1e-12), (name, metric)
    with pytest.raises(ValueError, match="reference_sets"):
        tester.test_reference_sets(data, 0, student, reference_sets={})
    with pytest.raises(ValueError, match=r"reference_sets\['twice'\] names a split twice: \['val', 'test', 'val'\]"):
        tester.test_reference_sets(data, 0, student, reference_sets={"twice": ["val", "test", "val"]})


def test_a_reference_dataset_alone_embeds_the_references_with_the_query_model():
    """With only ``reference_dataset_dict`` given, ``test_reference_sets`` passed the references through the query
    trunk but not its embedder (``test`` and ``get_all_embeddings_for_all_splits`` use both): a 3-wide query met
    4-wide references. Here the reference view holds the same images, so the results equal the symmetric test's."""
    data = {"test": Images(12, 0), "val": Images(9, 1)}
    torch.manual_seed(0)
    trunk, embedder = torch.nn.Identity(), torch.nn.Linear(4, 3)
    tester = AsymmetricTester(data_device=torch.device("cpu"), dataloader_num_workers=0, batch_size=5)
    sets = {"test+val": ["val", "test"]}
    view = dict(data)  # another dict of the same datasets: the reference side is embedded on its own
    out = tester.test_reference_sets(
        data, 1, trunk, embedder, query_split="test", reference_sets=sets, reference_dataset_dict=view
    )
    same = tester.test_reference_sets(data, 1, trunk, embedder, query_split="test", reference_sets=sets)
    assert out == same
