"""sim.plan.layout's records: `Layout` is exactly the fields of `Cluster`, `Parallel` and `Run`,
composed and taken apart without loss, and `sim.estimate` keeps the keyword names scripts rely on."""
import dataclasses
import inspect

from hypothesis import given, strategies as st

import sim
from sim.plan.layout import RECORDS, Cluster, Layout, Parallel, Run


def names(kind) -> list[str]:
    return [f.name for f in dataclasses.fields(kind)]


def test_layout_is_the_records_fields_each_once():
    """A new parameter is one field in one record and the same in Layout: none twice, none missing."""
    fields = [n for kind in RECORDS.values() for n in names(kind)]
    assert len(fields) == len(set(fields)) and set(fields) == set(names(Layout))
    for kind in RECORDS.values():  # the same defaults
        assert all(getattr(kind(), n) == getattr(Layout(), n) for n in names(kind))


@given(st.integers(1, 8), st.integers(1, 8), st.integers(1, 8), st.integers(1, 8), st.integers(1, 64),
       st.sampled_from(["p2p", "a2a"]), st.sampled_from([None, "flash", "unfused"]), st.integers(1, 16))
def test_records_round_trip(tp, pp, dp, cp, batch, comm, attention, node):
    parallel = Parallel(tp=tp, pp=pp, dp=dp, cp=cp, cp_comm=comm)
    run, cluster = Run(global_batch=batch, attention=attention), Cluster(gpus_per_node=node)
    lay = Layout.of(parallel, run, cluster)
    assert (lay.parallel, lay.run, lay.cluster) == (parallel, run, cluster)
    assert lay.gpus == tp * cp * pp * dp and lay.replicas == dp * cp
    assert lay.topology().gpus == lay.gpus


def test_estimate_keeps_the_issues_keyword_names():
    """Issue 32's names, so that scripts and notebooks can rely on them."""
    words = ("tp pp dp cp micro_batch global_batch gpus_per_node nics_per_node schedule virtual recompute "
             "sequence_parallel zero precision attention").split()
    params = inspect.signature(sim.estimate).parameters
    assert all(params[w].kind is inspect.Parameter.KEYWORD_ONLY for w in words)
    assert params["cp"].default == 1
