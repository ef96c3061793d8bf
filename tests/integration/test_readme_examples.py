"""The README's curl and Python examples, run against the live service (its URL substituted)."""

import json
import subprocess

from tests.docs_examples import blocks

README_URL = "http://127.0.0.1:8000"


def test_readme_python_example(api, capsys):
    [code] = blocks("README.md", "python")
    exec(compile(code.replace(README_URL, str(api.base_url).rstrip("/")), "README.md", "exec"), {})
    answer, tokens, trace_id = capsys.readouterr().out.split()
    assert answer == "391" and int(tokens) > 0 and len(trace_id) == 32


def test_readme_curl_example(api):
    curl = next(b for b in blocks("README.md", "bash") if b.lstrip().startswith("curl"))
    command = curl.replace(README_URL, str(api.base_url).rstrip("/"))
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=60)
    assert json.loads(done.stdout)["result"]["answer"] == "391"


def test_readme_bounded_context_example(api):
    import sys
    from pathlib import Path

    [ask] = [b for b in blocks("README.md", "bash") if "--strategy bounded_context" in b]
    command = ask.strip().replace(".venv/bin/reasonray", str(Path(sys.executable).parent / "reasonray"))
    done = subprocess.run(["bash", "-c", f"{command} --url {str(api.base_url).rstrip('/')}"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "7" and '"compute_savings_pct"' in done.stdout
