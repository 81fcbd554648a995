import pytest
import torch

from pml_extensions.utils.eval_mode import eval_mode


def test_each_submodule_gets_its_own_mode_back_also_after_an_error():
    frozen_bn = torch.nn.BatchNorm1d(3).eval()
    body = torch.nn.Sequential(torch.nn.Linear(3, 3), frozen_bn, torch.nn.Sequential(torch.nn.Dropout()))
    body[2].eval()
    before = [m.training for m in body.modules()]
    assert before == [True, True, False, False, False]
    with pytest.raises(RuntimeError, match="boom"), eval_mode(body, frozen_bn):  # a submodule named twice
        assert not any(m.training for m in body.modules())
        raise RuntimeError("boom")
    assert [m.training for m in body.modules()] == before


def test_a_batchnorm_frozen_inside_a_new_wrapper_keeps_its_statistics():
    """The probe's case: a Sequential built around an eval-mode BatchNorm starts in training mode; a forward after
    the block must still use (and not update) the running statistics."""
    bn = torch.nn.BatchNorm1d(2).eval()
    body = torch.nn.Sequential(bn)
    with eval_mode(body):
        pass
    x = torch.tensor([[1.0, 2.0], [3.0, 6.0]], dtype=torch.float64)
    out = body.double()(x)
    # running mean 0, var 1, eps 1e-5: x / sqrt(1 + 1e-5)
    assert torch.equal(bn.running_mean, torch.zeros(2, dtype=torch.float64))
    assert torch.allclose(out, x / (1 + 1e-5) ** 0.5, atol=0, rtol=1e-15)
