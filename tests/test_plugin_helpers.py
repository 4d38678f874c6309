"""The public helpers for plugin authors (edgebuild.plugin): OpTable, LoweringSet, Lazy and cpu_threads."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from edgebuild.errors import PluginError
from edgebuild.plugin import Lazy, LoweringSet, OpTable, cpu_threads


def split_attribute(ctx, node): ...


def split_input(ctx, node): ...


def test_op_table_looks_up_by_domain_op_type_and_opset():
    table = OpTable("a test lowering")
    table.add("Split", split_attribute, until=12)
    table.add("Split", split_input, since=13)
    table.add("RMSNorm", split_input, domain="com.example")
    assert table.lookup("Split", opset=1) is split_attribute
    assert table.lookup("Split", opset=12) is split_attribute
    assert table.lookup("Split", domain="ai.onnx", opset=13) is split_input
    assert table.lookup("Split") is split_input  # no opset: the latest
    assert table.lookup("RMSNorm", opset=1) is None
    assert table.lookup("RMSNorm", domain="com.example", opset=1) is split_input
    assert table.op_types() == ["Split", "com.example::RMSNorm"] and len(table) == 3
    assert [(e.op_type, e.opsets) for e in table.entries()] == [("Split", "1-12"), ("Split", "13-latest"),
                                                                ("RMSNorm", "1-latest")]
    assert table["Split"] is split_input
    with pytest.raises(KeyError):
        table["Pad"]


@pytest.mark.parametrize("since,until", [(1, None), (12, 12), (5, 20), (13, None)])
def test_op_table_refuses_an_overlapping_range_naming_both(since, until):
    table = OpTable("a test lowering")
    table.add("Split", split_attribute, until=12)
    table.add("Split", split_input, since=13, until=17)
    with pytest.raises(PluginError, match=r"test_plugin_helpers.split_input registers a test lowering of Split for "
                                          rf"opsets {since}-{until or 'latest'}, overlapping the one "
                                          r"test_plugin_helpers.split_(attribute|input) holds"):
        table.add("Split", split_input, since=since, until=until)
    table.add("Split", split_input, since=18)  # adjacent ranges are fine


def test_lowering_set_registers_every_declaration_and_refuses_a_second_for_the_same_opsets():
    lowerings = LoweringSet("test")
    lowerings.lowers("Squeeze", "Unsqueeze", until=12)(split_attribute)
    lowerings.lowers("Squeeze", "Unsqueeze", since=13)(split_input)
    registered = []
    lowerings.register_all(lambda *args, **kwargs: registered.append((*args, kwargs)))
    assert registered[0] == ("test", "Squeeze", split_attribute, {"domain": "", "since": 1, "until": 12})
    assert len(registered) == 4
    with pytest.raises(PluginError, match="overlapping the one test_plugin_helpers.split_input holds"):
        lowerings.lowers("Squeeze", since=17)(split_attribute)


def test_lazy_answers_known_attributes_without_importing_its_target():
    code = ("import sys; from edgebuild.plugin import Lazy; "
            "p = Lazy('edgebuild.graph.fusion:graph_pass', 'fuse_bias').known(default=True); "
            "print(p.default, 'onnxscript' in sys.modules, p.description.startswith('Conv'), 'onnxscript' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["True", "False", "True", "True"]
    assert repr(Lazy("a.b:C")) == "Lazy('a.b:C')"


@pytest.mark.parametrize("budget, expected", [("1", 1), ("3", 3), ("", None), ("0", None), ("many", None)])
def test_cpu_threads_follows_a_thread_budget_else_the_machine(monkeypatch, budget, expected):
    monkeypatch.setenv("OMP_NUM_THREADS", budget)
    assert cpu_threads() == (expected or os.cpu_count() or 1)


def test_unique_name_counts_past_the_names_taken():
    from edgebuild.plugin import unique_name

    taken = {"w", "w_2"}
    assert unique_name("w", taken) == "w_3" and "w_3" in taken
    assert unique_name("b", taken) == "b" and "b" in taken
    assert unique_name("w", taken, separator="__", first=1) == "w__1"
