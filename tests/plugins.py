"""A broken third-party strategy package, written to disk: an installed distribution whose entry point
fails to import, as happens when a plugin's own dependency is missing."""

from __future__ import annotations

from pathlib import Path


def write_broken_plugin(root: Path) -> Path:
    """Makes `root` a sys.path entry holding the distribution `broken-plugin`; returns `root`."""
    dist = root / "broken_plugin-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[reasonray.strategies]\nbroken = broken_plugin:Broken\n")
    (root / "broken_plugin.py").write_text('raise ImportError("broken_plugin needs libfoo, which is not installed")\n')
    return root
