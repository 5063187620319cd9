"""The tutorials as a student meets them: JupyterLab in headless Chromium, driven by selenium.

One JupyterLab server (a free port, a random token, its own settings, config and runtime
folders, the notebooks built into a temporary folder beside a copy of nbhelp.py) and one
browser serve the module. Each tutorial is opened, *Run All Cells* is run, and the test
checks that every code cell ran and none erred; where the tutorial has sliders, it moves one
with the keyboard and checks that the figure under it was redrawn (and that the sliders are
above it, as the tutorials say). A deliberately broken notebook shows the check fails.
Afterwards the browser, the server and its kernels are stopped, and the test checks that
none is left.

Needs Chromium, its driver and selenium (`apt-get install chromium chromium-driver`,
`pip install selenium`; .ci/run installs them where it can); without them every test here
skips, with one line saying so.
"""
from __future__ import annotations

import importlib.util
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers import notebook_module

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK_DIR = ROOT / "notebooks"
NEEDS_TORCH = {"03_real_runs.py", "04_modern_schedules.py", "06_closing_the_loop.py"}
START_TIMEOUT = 120   # seconds for the server to answer, and for a notebook's kernel to be idle
RUN_TIMEOUT = 480     # seconds for Run All Cells on one notebook
REDRAW_TIMEOUT = 120  # seconds for a figure to be redrawn after a slider moved
pytestmark = pytest.mark.slow




nbformat = pytest.importorskip("nbformat")
build = notebook_module("build")
SOURCES = build.sources()
BROWSER = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)
DRIVER = shutil.which("chromedriver")


def missing() -> str | None:
    """What this machine lacks for the browser test, or None."""
    lacks = [name for name, found in [("selenium", importlib.util.find_spec("selenium")), ("chromium", BROWSER),
                                      ("chromedriver", DRIVER), ("jupyterlab", importlib.util.find_spec("jupyterlab"))]
             if not found]
    return ", ".join(lacks) or None


if missing():  # one line for the whole module
    pytest.skip(f"no browser test: this machine lacks {missing()} (apt-get install chromium chromium-driver; "
                f"pip install selenium)", allow_module_level=True)


# The open notebook's state, read from JupyterLab's own model (the app is exposed to the page).
STATE = """
const app = window.jupyterapp, w = app && app.shell.currentWidget;
if (!w || !w.sessionContext || !w.content || !w.content.model) return null;
const kernel = w.sessionContext.session && w.sessionContext.session.kernel;
const cells = w.content.model.cells, counts = [], errors = [];
for (let i = 0; i < cells.length; i++) {
  const cell = cells.get(i);
  if (cell.type !== 'code') continue;
  counts.push(cell.executionCount);
  for (let j = 0; j < cell.outputs.length; j++) {
    const out = cell.outputs.get(j).toJSON();
    if (out.output_type === 'error') errors.push(`cell ${i}: ${out.ename}: ${out.evalue}`);
  }
}
return {path: w.context.path, kernel: kernel ? kernel.status : null, counts: counts, errors: errors};
"""
# The first interact box's figure (its <img> data URI) and where its slider and figure are.
FIGURE = """
const box = arguments[0], img = box.querySelector('.widget-output img'), slider = box.querySelector('.widget-slider');
return img ? {src: img.src, slider: slider.getBoundingClientRect().top, figure: img.getBoundingClientRect().top} : null;
"""
CLOSE = """
const done = arguments[arguments.length - 1], w = window.jupyterapp.shell.currentWidget;
w.sessionContext.shutdown().then(() => { w.context.model.dirty = false; w.dispose(); done(true); });
"""


@dataclass
class Lab:
    url: str
    token: str
    driver: object
    folder: Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(what: str, until, timeout: float, every: float = 0.5):
    """`until()` once it is truthy; AssertionError naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = until()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"{what}: not within {timeout} s")


def _answers(url: str) -> bool:
    try:
        return urllib.request.urlopen(url, timeout=5).status == 200
    except OSError:
        return False


def _start_server(folder: Path, log) -> tuple[subprocess.Popen, str, str]:
    settings = folder / ".lab" / "settings" / "@jupyterlab" / "notebook-extension"
    settings.mkdir(parents=True)
    (settings / "tracker.jupyterlab-settings").write_text('{"windowingMode": "none"}')  # every cell in the page
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "JUPYTER_CONFIG_DIR": str(folder / ".lab" / "config"), "JUPYTER_RUNTIME_DIR": str(folder / ".lab" / "run"),
           "JUPYTERLAB_SETTINGS_DIR": str(folder / ".lab" / "settings"),
           "JUPYTERLAB_WORKSPACES_DIR": str(folder / ".lab" / "workspaces")}
    port, token = _free_port(), secrets.token_hex(16)
    server = subprocess.Popen([sys.executable, "-m", "jupyter", "lab", "--no-browser", "--allow-root",
                               "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
                               f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={folder}",
                               "--LabApp.expose_app_in_browser=True"],
                              env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    _wait("JupyterLab answers", lambda: server.poll() is not None or _answers(f"{url}/api/status?token={token}"),
          START_TIMEOUT)
    assert server.poll() is None, f"JupyterLab exited {server.returncode}"
    return server, url, token


def _stop(server: subprocess.Popen) -> None:
    """Stop the server and its kernels (its process group), and check nothing of it is left."""
    os.killpg(server.pid, signal.SIGTERM)
    try:
        server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait(timeout=30)

    def group_gone() -> bool:
        try:
            os.killpg(server.pid, 0)
        except ProcessLookupError:
            return True
        return False
    if not _wait_quietly(group_gone, 10):
        os.killpg(server.pid, signal.SIGKILL)
        raise AssertionError("a kernel outlived JupyterLab (killed)")


def _wait_quietly(until, timeout: float) -> bool:
    try:
        return bool(_wait("", until, timeout))
    except AssertionError:
        return False


def _browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = BROWSER
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(argument)
    driver = webdriver.Chrome(options=options, service=Service(DRIVER))
    driver.set_page_load_timeout(START_TIMEOUT)
    driver.set_script_timeout(START_TIMEOUT)
    return driver


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lab")
    shutil.copy(NOTEBOOK_DIR / "nbhelp.py", folder)
    for source in SOURCES:
        (folder / f"{source.stem}.ipynb").write_text(build.build(source))
    with open(folder.parent / "jupyterlab.log", "w") as log:
        server, url, token = _start_server(folder, log)
        try:
            driver = _browser()
            try:
                yield Lab(url, token, driver, folder)
            finally:
                driver.quit()
        finally:
            _stop(server)


def run_all_cells(lab: Lab, name: str) -> dict:
    """Open notebook `name` in JupyterLab, wait for its kernel, Run All Cells, and wait until
    every cell ran or one erred (the rest are then not run): the notebook's state."""
    driver = lab.driver
    driver.get(f"{lab.url}/lab/tree/{name}?token={lab.token}")
    _wait(f"{name}'s kernel is idle", lambda: (s := driver.execute_script(STATE)) and s["path"] == name
          and s["kernel"] == "idle", START_TIMEOUT)
    driver.execute_script("window.jupyterapp.commands.execute('notebook:run-all-cells')")
    settled = []  # the same finished state twice, a second apart: the kernel is done

    def finished():
        state = driver.execute_script(STATE)
        done = state["kernel"] == "idle" and (state["errors"] or None not in state["counts"])
        settled[:] = settled[-1:] + [state if done else None]
        return len(settled) == 2 and settled[0] == settled[1] and done and state
    return _wait(f"Run All Cells on {name}", finished, RUN_TIMEOUT, every=1.0)


def assert_ran_cleanly(state: dict) -> None:
    assert state["errors"] == [], f"{state['path']}: {'; '.join(state['errors'])}"
    assert None not in state["counts"], f"{state['path']}: cells not run: {state['counts']}"


def move_a_slider(lab: Lab) -> tuple[dict, dict]:
    """Press an arrow key on the first slider of the open notebook (right, or left at its end):
    its figure before, and once redrawn."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    driver = lab.driver
    box = driver.execute_script("return window.jupyterapp.shell.currentWidget.node.querySelector('.widget-interact')")
    assert box is not None, "no sliders in the page"
    before = _wait("the figure under the sliders", lambda: driver.execute_script(FIGURE, box), REDRAW_TIMEOUT)
    handle = box.find_element(By.CSS_SELECTOR, ".widget-slider .noUi-handle")
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", handle)
    value = handle.get_attribute("aria-valuenow")
    handle.send_keys(Keys.ARROW_RIGHT)
    if handle.get_attribute("aria-valuenow") == value:  # at its maximum
        handle.send_keys(Keys.ARROW_LEFT)
    assert handle.get_attribute("aria-valuenow") != value, "the slider did not move"
    after = _wait("the figure redrawn", lambda: (f := driver.execute_script(FIGURE, box)) and f["src"] != before["src"]
                  and f, REDRAW_TIMEOUT)
    return before, after


def close(lab: Lab) -> None:
    """Shut the open notebook's kernel down and close it (its outputs are not saved)."""
    lab.driver.execute_async_script(CLOSE)


@pytest.mark.parametrize("source", SOURCES, ids=[p.name for p in SOURCES])
def test_tutorial_runs_in_jupyterlab_and_its_sliders_redraw(lab, source):
    if source.name in NEEDS_TORCH and importlib.util.find_spec("torch") is None:
        pytest.skip("needs torch: pip install -e '.[exec]'")
    t = time.perf_counter()
    state = run_all_cells(lab, f"{source.stem}.ipynb")
    ran = time.perf_counter() - t
    try:
        assert_ran_cleanly(state)
        if "sliders(" in source.read_text():
            before, after = move_a_slider(lab)
            assert before["slider"] < before["figure"] and after["slider"] < after["figure"]  # sliders above
        print(f"{source.name}: ran in {ran:.1f} s, {len(state['counts'])} code cells")
    finally:
        close(lab)


def test_a_notebook_with_an_error_cell_fails(lab):
    cells = [nbformat.v4.new_code_cell("x = 1"), nbformat.v4.new_code_cell("x / 0"), nbformat.v4.new_code_cell("y = 2")]
    nbformat.write(build.notebook(cells), lab.folder / "broken.ipynb")
    state = run_all_cells(lab, "broken.ipynb")
    close(lab)
    assert state["counts"][:2] == [1, 2] and state["counts"][2] is None  # Run All stops at the error
    with pytest.raises(AssertionError, match=r"broken.ipynb: cell 1: ZeroDivisionError: division by zero"):
        assert_ran_cleanly(state)
