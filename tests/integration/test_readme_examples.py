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
