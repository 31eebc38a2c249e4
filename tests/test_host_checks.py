"""The host modules' shared check (trl_length_plugin/host_checks.py, docs/write-a-host.md): a host internal
whose parameters changed, or that is gone, is named with what it has now."""

from __future__ import annotations

from trl_length_plugin.host_checks import changed, parameters


class Host:
    def step(self, batch, metrics, _ray_trace_ctx=None): ...

    def load(self, path): ...


def test_parameters_and_what_changed():
    assert parameters(Host.step) == ("self", "batch", "metrics", "_ray_trace_ctx")
    assert parameters(Host.step, ignore=("_ray_trace_ctx",)) == ("self", "batch", "metrics")
    assert parameters(None) is None and parameters(42) is None
    expected = [
        (Host, "step", ("self", "batch", "metrics")),
        (Host, "load", ("self", "folder")),
        (Host, "gone", ()),
    ]
    assert changed(expected, ignore=("_ray_trace_ctx",)) == ["Host.load('self', 'path')", "Host.gone (gone)"]
    assert changed(expected[:1], ignore=("_ray_trace_ctx",)) == []
