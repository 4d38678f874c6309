"""pages_dropped_after_use around an eager call: hooks on plain modules, none on TorchScript ones
(which refuse Python hooks), and no hook left behind."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from edgebuild_pytorch import weight_pages  # noqa: E402


class _Block(torch.nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner, self.head = inner, torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.head(self.inner(x))


@pytest.mark.parametrize("scripted", ["whole", "inner", "none"])
def test_an_eager_call_runs_inside_and_leaves_no_hook(monkeypatch, scripted):
    dropped = []
    monkeypatch.setattr(weight_pages, "drop_resident_pages", lambda tensors: dropped.append(list(tensors)) or 0)
    inner = torch.nn.Linear(4, 4)
    module = _Block(torch.jit.script(inner) if scripted == "inner" else inner)
    if scripted == "whole":
        module = torch.jit.script(module)
    x = torch.ones(1, 4)
    expected = module(x)
    with weight_pages.pages_dropped_after_use(module):
        got = module(x)
    assert torch.equal(got, expected)
    hooked = [] if scripted == "whole" else [module, module.head] + ([module.inner] if scripted == "none" else [])
    assert len(dropped) == len(hooked) + 1  # each hooked module's own, then every parameter on leaving
    assert len(dropped[-1]) == len(list(module.parameters()))
    for sub in module.modules():
        assert not getattr(sub, "_forward_hooks", {}), "a hook was left behind"
