from pathlib import Path

import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

REPO = Path(__file__).resolve().parents[2]


def test_cluster_yaml_passes_rays_own_validation():
    config = yaml.safe_load((REPO / "cluster.yaml").read_text())
    validate_config(prepare_config(config))
    assert config["head_node_type"] in config["available_node_types"]
    assert any("reasonray serve --address auto" in c for c in config["head_start_ray_commands"])
