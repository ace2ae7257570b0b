"""A stage's fixed cost: the runner (report/execute.py) imports nothing heavy that no stage uses, and
notebooks are still validated."""

import subprocess
import sys
import textwrap

PROBE = textwrap.dedent("""
    import sys
    from biasaudit.report.execute import skip_unused_imports, record_run
    skip_unused_imports()
    import jupytext, nbformat
    nb = jupytext.reads("# %%\\nx = 1\\n", fmt="py:percent")
    nbformat.validate(nb)
    bad = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x")])
    del bad.cells[0]["source"]  # a code cell without source breaks the v4 schema
    try:
        nbformat.validate(bad)
        print("VALIDATED-BAD")
    except nbformat.ValidationError:
        print("REJECTED-BAD")
    record_run("probe", "probe", 0.1, "", runs_dir=__import__("pathlib").Path(sys.argv[1]))
    unused = ("rfc3987_syntax", "jupyter_server", "tornado.web", "rfc3986_validator", "isoduration", "pandas")
    print(" ".join(m for m in unused if sys.modules.get(m)))
""")


def test_runner_skips_unused_imports_and_still_validates_notebooks(tmp_path):
    out = subprocess.run([sys.executable, "-c", PROBE, str(tmp_path)], capture_output=True, text=True, check=True)
    lines = out.stdout.strip().splitlines()
    # validation still protects against a malformed notebook
    assert lines == ["REJECTED-BAD"]  # and none of the unused modules was imported
    assert (tmp_path / "probe.json").exists()


def test_report_export_imports_no_format_checker_and_still_writes_the_page(tmp_path):
    """The report stage's kernel exports every notebook (report.trail): jsonschema's optional string-format
    checkers (rfc3987_syntax builds an Earley parser on import) are not imported, and the page is written."""
    probe = textwrap.dedent("""
        import sys
        from pathlib import Path
        from biasaudit.report.trail import export_html
        out = Path(sys.argv[1])
        import json
        nb = {"cells": [{"cell_type": "code", "execution_count": 1, "id": "c1", "metadata": {}, "outputs": [],
                         "source": "x = 1"}], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
        (out / "n.ipynb").write_text(json.dumps(nb))
        export_html(out / "n.ipynb", out / "n.html")
        print(" ".join(m for m in ("rfc3987_syntax", "rfc3986_validator", "fqdn") if sys.modules.get(m)))
    """)
    out = subprocess.run([sys.executable, "-c", probe, str(tmp_path)], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""  # none of the checkers imported
    page = (tmp_path / "n.html").read_text()
    assert page.lstrip().lower().startswith("<!doctype html") and 'class="n">x</span>' in page  # the cell, highlighted


def test_kernel_launched_before_the_notebook_is_read_runs_it_as_nbclient_would(tmp_path):
    """The runner launches the kernel before it converts the notebook (report.execute.launch_kernel):
    the kernel still runs in the runner's folder, gets the injected parameters, keeps no history file,
    and never imports debugpy (report/kernel.py)."""
    import json
    import os
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    (tmp_path / "probe.py").write_text(
        '# %% tags=["parameters"]\nn = 1\n\n'
        "# %%\nimport os, sys\n"
        "print(n, os.getcwd(), sys.modules.get('debugpy', 'absent'), get_ipython().history_manager.hist_file)\n")
    env = {**os.environ, "MPLBACKEND": "Agg", "PYTHONPATH": str(root / "src"), "DVC_STAGE": ""}
    proc = subprocess.run([sys.executable, "-m", "biasaudit.report.execute", "probe.py", "probe", "-p", "n", "7"],
                          cwd=tmp_path, capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    nb = json.loads((tmp_path / "reports/notebooks/probe.ipynb").read_text())
    printed = "".join("".join(o.get("text", "")) for c in nb["cells"] for o in c.get("outputs", []))
    assert printed.split() == ["7", str(tmp_path.resolve()), "None", ":memory:"]
