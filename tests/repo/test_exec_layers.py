"""exec's packages are layers: each imports only the packages before it in `LAYERS` (and sim), so the folder tree reads as the architecture (docs/exec.md, Layout). Reads the sources only."""
from __future__ import annotations

from tests.repo.test_architecture import ROOT, import_graph

# lowest first; the top-level modules (the command lines) may import any of them
LAYERS = ("models", "launch", "runtime", "measure", "pipeline", "profiler", "torch_pipelining")


def _package(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in LAYERS) else None


def test_every_package_of_exec_is_a_layer():
    found = {p.name for p in (ROOT / "exec").iterdir() if (p / "__init__.py").exists()}
    assert found == set(LAYERS)


def test_no_package_imports_one_above_it():
    graph = import_graph(("exec",))
    upward = sorted((m, d) for m, deps in graph.items() if (pm := _package(m)) is not None
                    for d in deps if (pd := _package(d)) is not None
                    and LAYERS.index(pd) > LAYERS.index(pm))
    assert not upward, f"imports against the layers: {upward}"


def test_the_layers_are_read():
    graph = import_graph(("exec",))
    assert "exec.runtime.step" in graph["exec.pipeline.worker"]
    assert "exec.launch.processes" in graph["exec.pipeline.runner"]
