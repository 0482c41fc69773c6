"""The ipywidgets explorer in a real browser: JupyterLab on localhost opens a notebook that shows `explore(run)` for the
tiny run, in headless Chromium (Debian's `chromium`, driven by Playwright through that executable); changing the detector
and then the condition dropdown must redraw the ROC and rewrite the numbers, and both must agree with the run's files.

Screenshots of the three states are written under the test's tmp dir and copied to `$TMPDIR/explorer_shots/`.
"""
import base64
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest

from conftest import read_json

from stealth_eval.report import _roc_png, explorer_data, find_chromium

KERNEL = "stealth-eval-test"   # a kernel spec of its own (JupyterLab's `python3` is always the server's own ipykernel)
SHOTS = Path(tempfile.gettempdir()) / "explorer_shots"
NUMBERS = re.compile(r"threshold\s+(\S+)\s+\(1% FPR target, calibrated on (\d+) human texts\)\s+TPR\s+([\d.]+)\s+over\s+(\d+)"
                     r"\s+AI texts\s+FPR\s+([\d.]+)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _notebook(run: Path) -> dict:
    "The two cells a user types: import the explorer, show it for a run."
    cell = lambda i, src: {"cell_type": "code", "id": i, "metadata": {}, "execution_count": None, "outputs": [], "source": src}
    return {"cells": [cell("imports", "from stealth_eval.report import explore"), cell("explore", f"explore({str(run)!r})")],
            "metadata": {"kernelspec": {"name": KERNEL, "display_name": KERNEL, "language": "python"}},
            "nbformat": 4, "nbformat_minor": 5}


@contextmanager
def jupyterlab(root: Path, timeout: float = 90):
    """JupyterLab serving `root` on a free localhost port, with its own config/data/runtime/settings folders and a
    kernel KERNEL that is this interpreter; yields (base url, token, log file). The server is stopped on exit."""
    j = root / ".jupyter"
    kernel = j / "data" / "kernels" / KERNEL
    kernel.mkdir(parents=True)
    (kernel / "kernel.json").write_text(json.dumps({"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                                                    "display_name": KERNEL, "language": "python"}))
    notif = j / "settings" / "@jupyterlab" / "apputils-extension"
    notif.mkdir(parents=True)                          # no "get Jupyter news?" toast over the widget
    (notif / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(j / "config"), "JUPYTER_DATA_DIR": str(j / "data"),
           "JUPYTER_RUNTIME_DIR": str(j / "runtime"), "IPYTHONDIR": str(j / "ipython"), "JUPYTER_PLATFORM_DIRS": "1"}
    port, token = _free_port(), os.urandom(16).hex()
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}", "--allow-root",
           f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}", "--ServerApp.disable_check_xsrf=True",
           "--LabApp.expose_app_in_browser=True",        # window.jupyterapp: run the cells with JupyterLab's own command
           f"--LabApp.user_settings_dir={j / 'settings'}", f"--LabApp.workspaces_dir={j / 'workspaces'}"]
    log = root / "jupyterlab.log"
    with open(log, "w") as f:
        srv = subprocess.Popen(cmd, cwd=root, env=env, stdout=f, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        t0 = time.monotonic()
        while True:
            if srv.poll() is not None:
                raise AssertionError(f"jupyter lab exited with {srv.returncode} before serving:\n{log.read_text()[-3000:]}")
            try:
                urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=5)
                break
            except OSError:
                if time.monotonic() - t0 > timeout:
                    raise AssertionError(f"jupyter lab did not answer on {url} within {timeout} s:\n{log.read_text()[-3000:]}")
                time.sleep(0.5)
        yield url, token, log
    finally:
        srv.terminate()
        try: srv.wait(20)
        except subprocess.TimeoutExpired:
            srv.kill(); srv.wait(10)


# what the widget shows, read from the page: the dropdowns' values, the image's src and bytes, the numbers, the examples
STATE_JS = """async () => {
  const out = document.querySelector('.jp-OutputArea-output .widget-vbox');
  const sel = {};
  for (const d of out.querySelectorAll('.widget-dropdown')) sel[d.querySelector('label').textContent] = d.querySelector('select').value;
  const img = out.querySelector('img.widget-image');
  const bytes = new Uint8Array(await (await fetch(img.src)).arrayBuffer());
  let bin = ''; for (const b of bytes) bin += String.fromCharCode(b);
  const html = out.querySelector('.widget-html-content');
  return {sel, src: img.src, png: btoa(bin), numbers: html.querySelector('p').innerText,
          shown: [img.width, img.height], natural: [img.naturalWidth, img.naturalHeight],
          samples: [...html.querySelectorAll('table')[0].querySelectorAll('tr')].slice(1).map(r => r.cells[0].innerText),
          views: [...(html.querySelectorAll('table')[1]?.querySelectorAll('tr') || [])].slice(1)
                   .map(r => [r.cells[0].innerText, r.cells[1].innerText, r.cells[2].innerText])};
}"""


def _check(state: dict, run: Path, metrics: dict) -> dict:
    "The widget's numbers agree with metrics.json, its examples and ROC image with explorer_data for its selection."
    ds, det, cond = state["sel"]["dataset"], state["sel"]["detector"], state["sel"]["condition"]
    m = metrics[ds][det][cond]
    got = NUMBERS.search(state["numbers"])
    assert got, f"the explorer's numbers are not in the expected form: {state['numbers']!r}"
    thr, n_h, tpr, n_ai, fpr = got.groups()
    assert float(thr) == pytest.approx(m["threshold1"], rel=6e-4), (det, cond, state["numbers"])     # shown to 4 digits
    assert (int(n_h), int(n_ai)) == (m["n_human"], m["n_ai"]), (det, cond, state["numbers"])
    assert (tpr, fpr) == (f"{m['tpr1']:.3f}", f"{m['fpr1_human']:.3f}"), (det, cond, state["numbers"])   # shown to 3 decimals
    d = explorer_data(run, ds, det, cond)
    assert state["samples"] == [e["sample_id"] for e in d["examples"]] and state["samples"], (det, cond)
    assert state["views"] == [[v["view"], str(v["group"]), v["metric"]] for v in d["views"]], (det, cond)   # deployment views
    png = base64.b64decode(state["png"])
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert png == _roc_png(d), f"the ROC shown for {det} / {cond} is not the one explorer_data gives"
    (w, h), (nw, nh) = state["shown"], state["natural"]
    assert w > 300 and w / h == pytest.approx(nw / nh, rel=0.02), f"the ROC is drawn {w}x{h} px: distorted from its {nw}x{nh}"
    return m


def _choose(options: list, differs) -> str:
    pick = next((o for o in options if differs(o)), None)
    assert pick is not None, f"no option among {options} would change the explorer's numbers: the tiny run cannot test the update"
    return pick


def test_explorer_in_jupyterlab(tiny_run, tmp_path):
    pytest.importorskip("jupyterlab", reason="jupyterlab is not installed (`pip install -e '.[dev]'`)")
    pw = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (`pip install -e '.[dev]'`)")
    chromium = find_chromium()
    if not chromium:
        pytest.skip("no Chromium found: install Debian's `chromium` (`make chromium`) or set $STEALTH_EVAL_CHROMIUM")
    run = Path(tiny_run["out"])
    metrics = read_json(run / "metrics.json")
    (tmp_path / "explore.ipynb").write_text(json.dumps(_notebook(run)))
    shots = []
    with jupyterlab(tmp_path) as (url, token, log), pw.sync_playwright() as p:
        spec = json.load(urllib.request.urlopen(f"{url}/api/kernelspecs?token={token}"))["kernelspecs"][KERNEL]["spec"]
        assert spec["argv"][0] == sys.executable                         # the kernel runs this environment's Python
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(120_000)
            page.goto(f"{url}/lab/tree/explore.ipynb?token={token}")
            page.wait_for_selector(".jp-Notebook .jp-Cell")
            kernel = page.evaluate("""async () => {
              const app = window.jupyterapp, nb = app.shell.currentWidget;
              await nb.context.ready; await nb.sessionContext.ready;
              app.shell.collapseLeft();
              await app.commands.execute('notebook:run-all-cells');
              return nb.sessionContext.session.kernel.name; }""")
            assert kernel == KERNEL
            try:
                page.wait_for_function("""() => { const o = document.querySelector('.jp-OutputArea-output .widget-vbox');
                    return o && o.querySelectorAll('select').length == 3 && o.querySelector('img.widget-image[src^="blob:"]')
                           && /TPR/.test(o.querySelector('.widget-html-content')?.innerText || ''); }""")
            except pw.TimeoutError:
                outs = page.locator(".jp-OutputArea").all_inner_texts()
                raise AssertionError(f"the explorer did not render; cell outputs: {outs}\n{log.read_text()[-2000:]}") from None

            def shot(name):
                shots.append(tmp_path / f"explorer_{name}.png")
                page.screenshot(path=str(shots[-1]))

            def select(label, value, before):
                page.select_option(f".jp-OutputArea-output .widget-dropdown:has(label:text-is('{label}')) select", value)
                try:                                                       # both the image and the numbers are redrawn
                    page.wait_for_function("""([src, numbers]) => { const o = document.querySelector('.jp-OutputArea-output .widget-vbox');
                        return o.querySelector('img.widget-image').src != src && o.querySelector('.widget-html-content p').innerText != numbers; }""",
                                           arg=[before["src"], before["numbers"]], timeout=60_000)
                except pw.TimeoutError:
                    raise AssertionError(f"choosing {label}={value} did not update both the ROC image and the numbers") from None
                after = page.evaluate(STATE_JS)
                assert after["sel"][label] == value and after["png"] != before["png"]
                return after

            first = page.evaluate(STATE_JS)
            m0 = _check(first, run, metrics)
            shot("1_first")
            ds, det0, cond0 = (first["sel"][k] for k in ("dataset", "detector", "condition"))
            text = lambda m: (f"{m['threshold1']:.4g}", f"{m['tpr1']:.3f}", f"{m['fpr1_human']:.3f}")
            det1 = _choose([d for d in metrics[ds] if d not in ("mean", det0) and cond0 in metrics[ds][d]],
                           lambda d: text(metrics[ds][d][cond0]) != text(m0))
            second = select("detector", det1, first)
            m1 = _check(second, run, metrics)
            assert second["sel"]["condition"] == cond0
            shot("2_detector")
            cond1 = _choose([c for c in metrics[ds][det1] if c != cond0 and metrics[ds][det1][c].get("label", "ai") == "ai"],
                            lambda c: text(metrics[ds][det1][c]) != text(m1))
            third = select("condition", cond1, second)
            _check(third, run, metrics)
            assert third["sel"]["detector"] == det1
            shot("3_condition")
        finally:
            browser.close()
    SHOTS.mkdir(exist_ok=True)
    for s in shots:
        data = s.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 50_000, f"{s.name} is nearly empty"
        shutil.copy2(s, SHOTS / s.name)
    print(f"explorer screenshots: {', '.join(str(SHOTS / s.name) for s in shots)}")
