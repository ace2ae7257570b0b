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
    print(" ".join(m for m in ("rfc3987_syntax", "jupyter_server", "pandas") if sys.modules.get(m)))
""")


def test_runner_skips_unused_imports_and_still_validates_notebooks(tmp_path):
    out = subprocess.run([sys.executable, "-c", PROBE, str(tmp_path)], capture_output=True, text=True, check=True)
    lines = out.stdout.strip().splitlines()
    # validation still protects against a malformed notebook
    assert lines == ["REJECTED-BAD"]  # and none of the three modules was imported
    assert (tmp_path / "probe.json").exists()
